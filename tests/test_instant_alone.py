"""An instant run alone (NOTE [ an instant run alone ] in ``mujou/_engine/_instants.py``): the
tags of a span run by the one thread that runs their worker updates, in one take and one
put-back, give what the general way (the policy's looks, worker 0's loop) gives: the same
hooks in the same order at the same times, the same messages, state and statistics.

Each side of a span is driven here without processes: a ``Member`` over a net, its tags run
one after the other as ``_exchange.Span`` runs them, once on the host's side (the calling
thread lent to the instants, ``Member.lend``) and once on a process's (the command thread
working as worker 0, a ``HookThread`` named as one), each with the short way and with it
turned off (``Member._alone`` finding none). Every wait is bounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch

import mujou
from mujou import Input, Net, Node, Output
from mujou._engine import Engine
from mujou._engine._threads import Lent
from mujou._processes._member import Member

from .test_lent import on_lent_thread, torch_one_thread  # noqa: F401  # an autouse fixture


class Step(Node):
    """Sends a random draw of its own generator plus what it read; notes each update in the
    shared ``log`` (name, time, dt, what it read fresh); fails at update ``fail_at``."""

    x = Input()
    y = Output()

    def __init__(self, log: list[Any], name: str, fail_at: int = 0, **kwargs: Any) -> None:
        super().__init__(seed=len(name) * 7 + ord(name[0]), **kwargs)
        self.log = log
        self.tag = name
        self.fail_at = fail_at
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        x = self.x.read()
        fresh = self.x.fresh
        self.log.append((self.tag, round(dt * 1e9), None if x is None else float(x), fresh))
        if self.count == self.fail_at:
            raise ValueError(f"{self.tag} fails at its update {self.count}")
        draw = torch.rand((), generator=self.generator)
        self.y.send(draw + (0.0 if x is None else x))

    def state_dict(self) -> dict[str, Any]:
        return {"count": torch.tensor(self.count)}


class Mesh(Net):
    """Periodic nodes of two periods (due together every other tag), a chain between them, and
    a triggered node woken by one of them (a microstep of the same time, trigger.tags)."""

    def __init__(self, fail_at: int = 0) -> None:
        super().__init__()
        self.log: list[Any] = []
        self.a = Step(self.log, "a", period=0.25)
        self.b = Step(self.log, "b", period=0.125)
        self.c = Step(self.log, "c", period=0.25, fail_at=fail_at)
        self.t = Step(self.log, "t", trigger=mujou.on("x"), period=None)
        self.connect(self.a.y, self.b.x)
        self.connect(self.b.y, self.c.x)
        self.connect(self.c.y, self.a.x)
        self.connect(self.b.y, self.t.x)


def _tags(member: Member, until: float) -> list[Any]:
    """The tags up to ``until``, one after the other as a span runs them: each tag's time and
    failure (the tags stop at the first)."""
    member.begin_advance()
    ran: list[Any] = []
    while (due := member.next_due()) <= until:
        crossed, failure, _ = member.instant(due)
        assert crossed == []  # nothing crosses: one process
        ran.append((round(due * 1e9), None if failure is None else failure[:4]))
        if failure is not None:
            break
    return ran


def _outcome(net: Mesh, member: Member, ran: list[Any]) -> dict[str, Any]:
    engine = member.engine
    engine.error_reported = True  # compared here: not reported at exit
    stats = member.stats().nodes
    return {
        "tags": ran,
        "log": list(net.log),
        "reads": {name: member.read(name) for name in sorted(member.ports)},
        "state": None if engine.error is not None else engine.state_tree(),
        "stats": {
            name: (s.updates, s.skipped, s.dt_min, s.dt_mean, s.dt_max, s.lateness_max, dict(s.coalesced))
            for name, s in stats.items()
        },
    }


def _member(net: Mesh, lent: bool) -> Member:
    engine = Engine(list(net.nodes()), 1, mujou.VirtualTimer(), None, lent=lent)
    engine.claim()
    member = Member(engine, list(net.nodes()), {}, [])
    member.connect_standins()
    errors = member.start(None)
    assert errors == []
    member.go(None, {}, [])
    return member


def _on_host_side(net: Mesh, until: float) -> dict[str, Any]:
    """On the calling thread, lent to the span's instants as the host's ``mujou-lockstep``."""
    member = _member(net, lent=False)
    try:
        member.lend()
        try:
            ran = _tags(member, until)
        finally:
            member.unlend()
        return _outcome(net, member, ran)
    finally:
        member.stop()


def _on_process_side(net: Mesh, until: float) -> dict[str, Any]:
    """On a command thread that is worker 0 while it waits, as a process's (bounded)."""

    def scenario() -> dict[str, Any]:
        member = _member(net, lent=True)
        try:
            return _outcome(net, member, _tags(member, until))
        finally:
            member.stop()

    outcome, _ = on_lent_thread(scenario)
    assert outcome is not None, "the scenario failed on the command thread"
    return cast(dict[str, Any], outcome)


SIDES: dict[str, Callable[[Mesh, float], dict[str, Any]]] = {
    "host": _on_host_side,
    "process": _on_process_side,
}


def _both_ways(
    monkeypatch: pytest.MonkeyPatch, side: str, fail_at: int
) -> tuple[dict[str, Any], dict[str, Any], list[bool]]:
    """The outcome of the short way, of the general way, and whether each instant of the
    short way's run was over after its one take (``run_alone``'s answers)."""
    answers: list[bool] = []
    run_alone = Lent.run_alone if side == "process" else mujou._engine._lend.Lender.run_alone

    def counted(self: Any, now: float) -> bool:
        over = run_alone(self, now)
        answers.append(over)
        return over

    with monkeypatch.context() as patch:
        patch.setattr(Lent if side == "process" else mujou._engine._lend.Lender, "run_alone", counted)
        short = SIDES[side](Mesh(fail_at), 2.0)
    with monkeypatch.context() as patch:
        patch.setattr(Member, "_alone", lambda self, lends: None)
        general = SIDES[side](Mesh(fail_at), 2.0)
    return short, general, answers


@pytest.mark.parametrize("side", ["host", "process"])
def test_an_instant_run_alone_gives_what_the_general_way_gives(
    monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    """Planted: ``Workers.take_alone`` running the nodes due together in reverse registration
    order (``todo`` not reversed back): the log's order differs and this fails."""
    short, general, answers = _both_ways(monkeypatch, side, fail_at=0)
    assert short == general
    assert len(short["tags"]) == 32  # 0.125 ... 2.0, each with t's microstep after b's
    assert answers and all(answers), answers  # every instant was run alone, whole
    assert [entry[0] for entry in short["log"][:5]] == ["b", "t", "a", "b", "c"]


@pytest.mark.parametrize("side", ["host", "process"])
def test_a_failure_in_an_instant_run_alone_stops_as_the_general_way(
    monkeypatch: pytest.MonkeyPatch, side: str
) -> None:
    """A hook that fails: its instant's other updates run, the tag reports the failure
    (sched.virtual-failure), and the nodes stop, as the general way has it."""
    short, general, answers = _both_ways(monkeypatch, side, fail_at=3)
    assert short == general
    failure = short["tags"][-1][1]
    assert failure is not None and failure[:2] == ("hook", "c"), short["tags"][-1]
    assert math.isclose(short["tags"][-1][0] / 1e9, 0.75)
    assert answers
