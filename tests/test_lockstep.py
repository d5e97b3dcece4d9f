"""The virtual timer's lockstep over processes (mujou/_processes/_lockstep.py): a host call's
tags on the lockstep's thread, through the tags connections (NOTE [ the lockstep's thread ])."""

from __future__ import annotations

import _thread
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from _support import HANG_GUARD

import mujou
from mujou import Input, Net, Node, Output

PERIOD = 0.01
HOLD_AT = 30


class Volley(Node):
    """Sends its count plus the latest it read from the other, every PERIOD. With ``hold``
    (a path): its update ``HOLD_AT`` makes the file ``hold + ".in"``, then waits for ``hold``."""

    x = Input()
    y = Output()
    state_exclude: ClassVar[tuple[str, ...]] = ("hold",)  # where the test holds it, not state

    def __init__(self, hold: str | None = None) -> None:
        super().__init__(period=PERIOD, seed=0)
        self.count = 0
        self.hold = hold

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        self.count += 1
        if self.hold is not None and self.count == HOLD_AT:
            Path(self.hold + ".in").touch()
            deadline = time.monotonic() + HANG_GUARD
            while not Path(self.hold).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        self.y.send(torch.tensor(self.count + (0 if x is None else int(x))))


class Rally(Net):
    def __init__(self, hold: str | None = None) -> None:
        super().__init__()
        self.ping = Volley()
        self.pong = Volley(hold)
        self.connect(self.ping.y, self.pong.x)
        self.connect(self.pong.y, self.ping.x)


def assert_trees_equal(a: object, b: object, path: str = "tree") -> None:
    """Two state trees are identical: same keys, every tensor equal, every other leaf equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for key in a:
            assert_trees_equal(a[key], b[key], f"{path}[{key!r}]")
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def _run(net: Rally) -> mujou.Run:
    return mujou.run(net, workers=1, timer=mujou.VirtualTimer(), processes={"far": net.pong})


def _seen(run: mujou.Run, net: Rally) -> tuple[Any, ...]:
    return run.time, run.read(net.ping.y), run.read(net.pong.y), run.stats().nodes["pong"].updates


def test_a_sleeps_tags_go_through_the_tags_connection_not_the_control_one() -> None:
    """Planted: ``Lockstep.advance`` running every call's tags on the host's thread through the
    control connection (as before the lockstep's thread): 100 commands there, not a few."""
    net = Rally()
    with _run(net) as run:
        group: Any = run._processes.groups["far"]  # type: ignore[union-attr]  # a run with processes
        commands, tags = group._numbers, group._tag_number
        run.sleep(100 * PERIOD)
        commands, tags = group._numbers - commands, group._tag_number - tags
        seen = _seen(run, net)
    assert tags >= 100 and commands < 10, (tags, commands)
    one = Rally()
    with mujou.run(one, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(100 * PERIOD)
        assert _seen(run, one) == seen  # proc.virtual: bit for bit as in one process


def test_an_interrupted_sleep_ends_at_a_whole_tag_and_the_run_goes_on_as_if_it_had_not_been(
    tmp_path: Path,
) -> None:
    """``interrupt_main()`` while the lockstep's thread waits for a process's update (held until
    the test lets it go): the sleep raises KeyboardInterrupt at once (run.interrupt), the
    thread ends that tag or the next (proc.exchange: the host's message of the held tag, which
    says whether a next one runs, may have gone before the interrupt), and the run then gives,
    bit for bit, what a run that slept to that time gives. Planted: the lockstep's thread not
    looking at the cancel (``done`` always False): the wait after the interrupt waited for the
    million tags, and the hang guard failed the test; the host's wait for the thread not
    looking every poll (``finished.wait()``): the interrupt came only as the hang guard fired;
    ``run.state_dict()`` not waiting for the held tag (``Processes._live_call`` without
    ``finish_last``): the tree was of no one time (a fresh flag differed)."""
    hold = tmp_path / "hold"
    net = Rally(str(hold))

    def interrupt_then_let_go() -> None:
        """Interrupt the host once the held update began; let it go on a while later."""
        entered, pause = Path(f"{hold}.in"), threading.Event()
        for _ in range(int(HANG_GUARD / 0.005)):
            if entered.exists():
                _thread.interrupt_main()
                pause.wait(0.3)  # the host's next call is waiting by then (or ran, if planted)
                hold.touch()
                return
            pause.wait(0.005)

    with _run(net) as run:
        background = threading.Thread(target=interrupt_then_let_go, daemon=True)
        background.start()
        with pytest.raises(KeyboardInterrupt):
            run.sleep(10_000.0)
        tree = run.state_dict()  # once the held tag ended, its messages handed over
        held = run.time
        # A wait with a predicate runs its tags on this thread, once the interrupted ones ended.
        with pytest.raises(TimeoutError):
            run.wait_for(net.ping.y, lambda message: False, timeout=20 * PERIOD)
        background.join(HANG_GUARD)
        at = run.time
        interrupted = _seen(run, net)
        run.sleep(20 * PERIOD)
        later = _seen(run, net)
    # The held tag or the next, then 0.2 s.
    assert any(at == pytest.approx((HOLD_AT + k + 20) * PERIOD) for k in (0, 1)), at
    again = Rally()
    with _run(again) as run:
        run.sleep(held)
        assert_trees_equal(run.state_dict(), tree)
        run.sleep(at - held)
        assert _seen(run, again) == interrupted
        run.sleep(20 * PERIOD)
        assert _seen(run, again) == later


def test_a_sleeps_tags_with_one_process_are_an_exchange_not_commands() -> None:
    """proc.exchange: a ``run.sleep`` with one process besides the host sends one ``span``
    command, then one ``exchange`` message a tag, and no ``instant`` command (whose reply the
    host would wait for before the process's next tag); bit for bit as in one process.
    Planted: ``_lockstep._advance`` not taking ``_span`` (the star's commands): 100 ``instant``
    commands were sent, and this fails."""
    net = Rally()
    with _run(net) as run:
        group: Any = run._processes.groups["far"]  # type: ignore[union-attr]  # a run with processes
        sent: list[str] = []
        send_tag = group.send_tag

        def counted(command: str, *args: Any) -> None:
            sent.append(command)
            send_tag(command, *args)

        group.send_tag = counted
        run.sleep(100 * PERIOD)
        seen = _seen(run, net)
    assert sent.count("span") == 1 and "instant" not in sent, sorted(set(sent))
    assert sent.count("exchange") == 100, sent.count("exchange")  # no message woke a node
    one = Rally()
    with mujou.run(one, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(100 * PERIOD)
        assert _seen(run, one) == seen


class Echo(Node):
    """Triggered by ``a``, which the host writes: sends it on, plus its count."""

    a = Input(optional=True)
    b = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("a"), seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        a = self.a.read()
        assert a is not None
        self.count += 1
        self.b.send(a + self.count)


class EchoRally(Rally):
    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo()


def test_a_sleeps_span_is_not_answered_where_the_host_knows_the_process_due_time() -> None:
    """proc.exchange: a ``run.sleep`` after another, with no command to the process between
    them, sends its ``span`` with the process's next due time as the last one ended, and the
    process sends no reply to it (its first tag's message comes at once); a command between
    them (a ``run.write`` there moves that due time) makes the span ask again. Bit for bit as
    in one process. Planted: ``_span`` keeping the due time across a command: the process,
    woken by the write, found its due time was not the host's (MujouInternalError), and this
    failed."""
    net = EchoRally()
    with mujou.run(
        net, workers=1, timer=mujou.VirtualTimer(), processes={"far": [net.pong, net.echo]}
    ) as run:
        group: Any = run._processes.groups["far"]  # type: ignore[union-attr]  # a run with processes
        replies: list[Any] = []
        tag_reply = group.tag_reply

        def counted() -> Any:
            replies.append(reply := tag_reply())
            return reply

        group.tag_reply = counted
        run.sleep(10 * PERIOD)
        asked = len(replies)
        run.sleep(10 * PERIOD)
        quiet = len(replies) - asked
        run.write(net.echo.a, torch.tensor(5))
        run.sleep(10 * PERIOD + PERIOD / 2)  # the echo's update at the sleep's first tag
        again = len(replies) - asked - quiet
        seen = (*_seen(run, net), run.read(net.echo.b))
    assert (asked, quiet, again) == (11, 10, 12), (asked, quiet, again)  # a tag each, + the span's
    one = EchoRally()
    with mujou.run(one, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(20 * PERIOD)
        run.write(one.echo.a, torch.tensor(5))
        run.sleep(10 * PERIOD + PERIOD / 2)
        assert (*_seen(run, one), run.read(one.echo.b)) == seen
