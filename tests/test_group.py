"""Unit tests of ``mujou._processes._group``: the host's end of the control protocol.

A small stand-in for a process of a run speaks the protocol (NOTE [ the control protocol ]):
it answers ``echo`` with its arguments, sends events before a reply for ``events``, answers
``slow`` once the file it names exists, and ends itself for ``die`` (``os._exit``) and
``freeze`` (SIGSTOP).
"""

from __future__ import annotations

import _thread
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

import pytest

from mujou import MujouInternalError, ProcessError
from mujou._processes import _codec as codec
from mujou._processes._group import NUMBER, ExitedError, Group, Reply

GUARD = 30.0  # seconds: reached only when something hangs


def stand_in(control: Connection, events: Connection, tags: Connection) -> None:
    """The stand-in process's loop: one reply per command, by number, on the connection the
    command came on (``control``, or the lockstep's ``tags``)."""
    control.send_bytes(codec.dumps((0, "ok", None, [], 0)))
    sent = 0
    while True:
        connection = cast(Connection, wait([control, tags])[0])
        try:
            frame = connection.recv_bytes()
        except EOFError:
            return
        (number,) = NUMBER.unpack_from(frame)
        end = frame.index(b"\0", NUMBER.size)
        command = frame[NUMBER.size : end].decode()
        args = codec.loads(frame[end + 1 :])
        payload: Any = args
        if command == "events":
            for i in range(args[0]):
                events.send_bytes(codec.dumps(("message", i)))
                sent += 1
        elif command == "slow":
            while not Path(args[0]).exists():
                time.sleep(0.005)
        elif command == "die":
            os._exit(3)
        elif command == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif command == "exit":
            connection.send_bytes(codec.dumps((number, "ok", None, [], sent)))
            return
        connection.send_bytes(codec.dumps((number, "ok", payload, [], sent)))


class Recorder:
    """The group's events, as ``Processes`` would get them."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.fail_on: str | None = None
        self.hold: threading.Event | None = None  # set: each event is handled once it is set

    def __call__(self, group: Group, event: tuple[Any, ...]) -> None:
        if event[0] == self.fail_on:
            raise RuntimeError("a bug in the event handler")
        if self.hold is not None:
            assert self.hold.wait(GUARD)
        self.events.append(event)


@pytest.fixture
def started() -> Iterator[tuple[Group, Recorder]]:
    context = multiprocessing.get_context("fork")
    control, control_child = context.Pipe()
    events, events_child = context.Pipe(duplex=False)
    tags, tags_child = context.Pipe()
    process = context.Process(
        target=stand_in, args=(control_child, events_child, tags_child), name="mujou-stand-in"
    )
    process.start()
    control_child.close()
    events_child.close()
    tags_child.close()
    recorder = Recorder()
    group = Group(
        "g",
        [],
        process=process,
        control=control,
        events=events,
        on_event=recorder,
        on_warning=lambda c, m: None,
        tags=tags,
    )
    group.wait(group.built)
    yield group, recorder
    group.kill()
    group.end(time.monotonic() + GUARD)
    assert group.exitcode is not None  # ended, reaped, its handle closed


def test_replies_go_by_number_and_follow_the_events_sent_before_them(started: tuple[Group, Recorder]) -> None:
    group, recorder = started
    replies = [group.request("echo", i, "x" * i) for i in range(50)]
    assert [group.wait(reply) for reply in replies] == [(i, "x" * i) for i in range(50)]
    assert group.call("events", 20) == (20,)
    assert recorder.events == [("message", i) for i in range(20)]  # all handled before the reply


def test_a_tag_reply_follows_the_events_sent_before_it_and_a_death_fails_it(
    started: tuple[Group, Recorder],
) -> None:
    """The lockstep's connection keeps the control protocol's order: ``tag_reply`` returns once
    the reader handled the events sent before the reply, here held back until a timer lets
    them go. Planted: ``tag_reply`` not waiting for the reader's count of events (it returned
    with none of the 5 handled). A death fails the awaited tag reply with the ProcessError the
    reader found, after reporting it as ``lost`` (planted: ``tag_reply`` looking again and
    again once the pipe ended, never at ``ended``: it failed)."""
    group, recorder = started
    recorder.hold = threading.Event()
    release = threading.Timer(0.2, recorder.hold.set)
    release.start()
    group.send_tag("events", 5)
    assert group.tag_reply() == (5,)
    assert recorder.events == [("message", i) for i in range(5)]
    release.join()
    group.send_tag("echo", "x" * 5000)  # over PIPE_BUF: written and read whole
    assert group.tag_reply() == ("x" * 5000,)
    assert group.call("echo", "control") == ("control",)  # the control connection is untouched
    group.send_tag("die")
    with pytest.raises(ProcessError) as info:
        group.tag_reply()
    assert info.value.exitcode == 3 and group.dead
    assert ("lost", info.value) in recorder.events


def test_a_large_command_arrives_whole(started: tuple[Group, Recorder]) -> None:
    big = b"\x01" * (8 << 20)
    assert started[0].call("echo", big) == (big,)


def test_an_interrupted_wait_drops_its_reply_and_the_next_call_gets_its_own(
    started: tuple[Group, Recorder], tmp_path: Path
) -> None:
    """Planted: ``Group.wait`` waiting without a timeout (``reply.wait(None)``): the
    interrupt is seen only when the reply came, and the test hangs (its guard fails it)."""
    group, _ = started
    go = tmp_path / "go"
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        group.call("slow", str(go))
    timer.join()
    go.touch()
    assert group.call("echo", "after") == ("after",)  # the slow reply was dropped


def test_a_death_fails_every_awaited_reply_and_later_requests(started: tuple[Group, Recorder]) -> None:
    group, recorder = started
    pending = group.request("events", 0)
    dying = group.request("die")
    with pytest.raises(ProcessError) as info:
        group.wait(dying)
    assert group.wait(pending) == (0,)  # answered before the death
    assert info.value.exitcode == 3 and group.dead
    later = group.request("echo", 1)
    assert later.done()
    with pytest.raises(ProcessError):
        later.result()
    group.ended.wait(GUARD)
    assert ("died",) in recorder.events
    assert any(event[0] == "lost" for event in recorder.events)  # the host call said so


def test_a_stopped_process_is_killed_by_its_end_and_its_replies_fail(started: tuple[Group, Recorder]) -> None:
    """A process that never answers (SIGSTOP) gives no EOF: the end kills it at the deadline,
    and the reader, which watches the sentinel, fails what was awaited."""
    group, _ = started
    frozen = group.request("freeze")
    waiting = group.request("echo", 1)
    group.ask_to_exit()
    group.end(time.monotonic() + 0.5)
    assert group.exitcode == -signal.SIGKILL
    assert frozen.done() and waiting.done()
    with pytest.raises(ExitedError):
        waiting.result()


def test_a_bug_in_the_reader_fails_the_awaited_replies_with_an_internal_error(
    started: tuple[Group, Recorder],
) -> None:
    group, recorder = started
    recorder.fail_on = "message"
    reply = group.request("events", 1)
    with pytest.raises(MujouInternalError, match="mujou-process-g"):
        group.wait(reply)
    assert recorder.events[-1][0] == "crashed"
    with pytest.raises(MujouInternalError):  # no command is taken any more
        group.request("echo", 1).result()


def test_a_reply_is_a_future() -> None:
    reply = Reply()
    assert not reply.done() and not reply.wait(0.0)
    reply.set(5)
    assert reply.done() and reply.result() == 5
    failed = Reply()
    failed.fail(ValueError("no"))
    with pytest.raises(ValueError, match="no"):
        failed.result()
