"""The recorder process (mujou/_record/_recorder.py, _sink.py): its failure stops the run."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

import mujou
from mujou import Node, Output
from mujou._record import _feed, _recorder, _sink

HANG_GUARD = 30.0  # real seconds the run has to end once the recorder process failed

pytest.importorskip("mcap")


class Source(Node):
    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.zeros(2))


def _ends_with_an_internal_error(run: mujou.Run, match: str) -> None:
    """The run's host calls raise MujouInternalError matching ``match``; the run is over and
    no thread of the recorder is left."""
    began = time.monotonic()
    with pytest.raises(mujou.MujouInternalError) as caught:
        while True:
            assert time.monotonic() - began < HANG_GUARD, "the run went on without its recorder process"
            run.sleep(0.1)  # raises once the failure became the run's error
            time.sleep(0.01)
    assert re.search(match, str(caught.value.__cause__))
    with contextlib.suppress(mujou.MujouInternalError):  # raised again if it became the run's error
        run.stop()
    assert not run.running
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("mujou-record")]


def test_a_failing_recorder_process_stops_the_run_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guarded: an exception in the recorder process ends it, and the run with a
    MujouInternalError that says what it was. Planted: the monitor thread's report removed
    (the run goes on: the test fails)."""
    monkeypatch.setattr(_feed, "FIRST_FORM", 8)  # the run's forms: a kind the recorder process refuses
    net = mujou.Net()
    net.source = Source()
    run = mujou.run(net, timer=mujou.VirtualTimer(), record=tmp_path / "x.mcap")
    _ends_with_an_internal_error(run, r"exit code 1: ValueError: a feed record of unknown kind 8")


def test_a_killed_recorder_process_stops_the_run_and_no_tap_waits_for_it(tmp_path: Path) -> None:
    """Guarded: the recorder process killed while a virtual-timer tap waits for room in a
    full feed (4096 bytes, messages of 4 KiB: each waits for the one before): the tap gives up,
    the run ends with MujouInternalError naming the signal. Planted: the tap's wait without
    the check of a dead recorder process (the run hangs: the guard's timeout fails it)."""

    class Big(Node):
        out = Output()

        def __init__(self) -> None:
            super().__init__(period=0.01, seed=0)

        def on_update(self, dt: float) -> None:
            self.out.send(torch.zeros(1000))

    net = mujou.Net()
    net.big = Big()
    recorder = mujou.Recorder(tmp_path / "k.mcap", buffer=4096, compression=None)
    run = mujou.run(net, timer=mujou.VirtualTimer(), record=recorder)
    session = run._recording
    assert isinstance(session, _recorder.Session)
    os.kill(session.process.pid, signal.SIGKILL)
    _ends_with_an_internal_error(run, f"exit code -{int(signal.SIGKILL)}")


def _kicked(writer: _feed.FeedWriter) -> bool:
    """Whether the writer woke the reader since this was last asked (the kicks read)."""
    assert writer.wake_fd is not None
    readable = bool(select.select([writer.wake_fd], [], [], 0)[0])
    if readable:
        os.read(writer.wake_fd, 4096)
    return readable


def test_the_feed_wakes_the_recorder_process_once_for_what_was_appended() -> None:
    """NOTE [ waking the recorder ]: a message appended (in a hook) makes no system call; a
    kick (a thread about to wait) wakes the reader once for what was appended, and not again
    for nothing new; a quarter of ``waiting`` messages appended wakes it from the hook.
    Planted: a kick with nothing new written anyway, and no kick at the quarter (each fails)."""
    writer = _feed.FeedWriter(1 << 16, waiting=8)
    try:
        data = torch.zeros(2)
        form = _feed.message_form(_feed.FIRST_FORM, b"", data.nbytes)
        assert writer.message(form, data.data_ptr(), 0.0, 0)
        assert not _kicked(writer)
        writer.kick()
        assert _kicked(writer)
        writer.kick()
        assert not _kicked(writer)
        assert writer.message(form, data.data_ptr(), 0.0, 0)
        assert not _kicked(writer)
        assert writer.message(form, data.data_ptr(), 0.0, 0)  # 2 since the kick: 8 // 4
        assert _kicked(writer)
    finally:
        writer.close()


def test_under_real_time_the_recorder_process_is_woken_when_the_run_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorder process looks at the feed by itself only every WAKE_MOST seconds (an hour
    here): the messages reach it as the run goes because the worker about to wait kicks it,
    and all of them at the end because the close does. Planted: no kick in copy_deferred (the
    wait for the messages fails), and none in the close's wait (the close fails, stuck)."""
    monkeypatch.setattr(_sink, "WAKE_MOST", 3600.0)
    net = mujou.Net()
    net.source = Source()
    recorder = mujou.Recorder(tmp_path / "w.mcap", compression=None)
    with mujou.run(net, workers=1, record=recorder) as run:
        began = time.monotonic()
        while recorder.messages < 3:
            assert time.monotonic() - began < HANG_GUARD, "the recorder process was not woken"
            time.sleep(0.01)
        run.stop()
        sent = run.stats().nodes["source"].updates
    assert recorder.lost == 0
    assert recorder.messages == sent


class Holding(Node):
    """Sends ``count`` small tensors in its first update, then holds its worker until
    ``release`` (bounded): no thread of the run copies what the tap keeps meanwhile."""

    out = Output()

    def __init__(self, count: int) -> None:
        super().__init__(period=0.01, seed=0)
        self.count = count
        self.sent = threading.Event()
        self.release = threading.Event()

    def on_update(self, dt: float) -> None:
        if self.sent.is_set():
            return
        for i in range(self.count):
            self.out.send(torch.full((4,), float(i)))
        self.sent.set()
        self.release.wait(HANG_GUARD)


def test_a_hosts_thread_copies_the_kept_messages_only_past_the_backlog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE [ the recorder's tap ]: the host's thread in ``run.sleep`` (which calls the idle
    callbacks before it waits) leaves the kept messages to the run's threads, unless
    _HOST_BACKLOG or more are kept: then it copies them down below it. The one worker is held
    in the hook meanwhile, so that only the host could copy. With _IDLE_SECONDS 0 each idle
    call copies one message (the first; _IDLE_CHUNK without the time bound). Every message is
    in the file at the end. Planted: no host check (the host copied all 5: none kept); a host
    that never copies (the 522 stay kept); no time bound (16 at a time: 506 left)."""
    monkeypatch.setattr(_recorder, "_IDLE_SECONDS", 0.0)
    for count, left in ((5, 5), (_recorder._HOST_BACKLOG + 10, _recorder._HOST_BACKLOG - 1)):
        holding = Holding(count)
        net = mujou.Net()
        net.holding = holding
        recorder = mujou.Recorder(tmp_path / f"host-{count}.mcap", compression=None)
        with mujou.run(net, workers=1, record=recorder) as run:
            session = run._recording
            assert isinstance(session, _recorder.Session)
            try:
                assert holding.sent.wait(HANG_GUARD)
                run.sleep(0.01)
                assert len(session.deferred) == left, f"{count} sent"
            finally:
                holding.release.set()
        assert recorder.lost == 0
        assert recorder.messages == count


class Growing(Node):
    """Sends a small tensor and a large one in its first update; in the first update after
    ``go`` three large ones, then holds its worker until ``release`` (bounded), so that no
    thread of the run copies what the tap keeps meanwhile."""

    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)
        self.large = (_recorder._DEFERRED_BYTES // 4) + 1  # float32 elements: over the bound
        self.first = threading.Event()
        self.go = threading.Event()
        self.sent = threading.Event()
        self.release = threading.Event()

    def on_update(self, dt: float) -> None:
        if not self.first.is_set():
            self.out.send(torch.zeros(4))
            self.out.send(torch.zeros(self.large))
            self.first.set()
        elif self.go.is_set() and not self.sent.is_set():
            for i in range(3):
                self.out.send(torch.full((self.large,), float(i)))
            self.sent.set()
            self.release.wait(HANG_GUARD)


def test_a_port_whose_kept_tensor_was_large_is_copied_by_its_hook_from_then_on(tmp_path: Path) -> None:
    """NOTE [ the recorder's tap ]: the tap keeps every tensor without looking at its size;
    the copy that meets one over _DEFERRED_BYTES makes the port's later messages go into the
    feed from the hook that sends them, so that large tensors are not kept alive. The one
    worker is held in the hook after the three large sends: none is kept. Every message is
    in the file. Planted: the copy never clears ``defers`` (it failed there; with that assert
    taken out, the three stayed kept)."""
    growing = Growing()
    net = mujou.Net()
    net.growing = growing
    recorder = mujou.Recorder(tmp_path / "growing.mcap", compression=None)
    with mujou.run(net, workers=1, record=recorder) as run:
        session = run._recording
        assert isinstance(session, _recorder.Session)
        (channel,) = session.channels
        try:
            assert growing.first.wait(HANG_GUARD)
            began = time.monotonic()
            while session.deferred:  # the worker copies the first two when it is idle
                assert time.monotonic() - began < HANG_GUARD, "the kept messages were not copied"
                time.sleep(0.01)
            assert not channel.defers
            growing.go.set()
            assert growing.sent.wait(HANG_GUARD)
            assert not session.deferred
        finally:
            growing.release.set()
    assert recorder.lost == 0
    assert recorder.messages == 5
