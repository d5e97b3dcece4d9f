"""The process's side of a span of virtual tags (mujou/_processes/_exchange.py, proc.exchange),
with a stand-in for its ``Member``: what it decides and sends, without processes."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest
import torch

from mujou import MujouInternalError
from mujou._processes._exchange import DONE, ENDED, GO, HALT, IDLE, STOPPED, TAG, UNTIL, Span, decide
from mujou._processes._member import Member


class FakeMember:
    """Runs no node: each instant sends ``outbox``; ``dues`` are its next due times in turn."""

    def __init__(self, dues: list[float], outbox: list[Any] | None = None) -> None:
        self.dues = dues
        self.outbox = outbox or []
        self.instants: list[float] = []
        self.applied: list[Any] = []
        self.time: float | None = None

    def begin_advance(self) -> None:
        pass

    def next_due(self) -> float:
        return self.dues.pop(0)

    def instant(self, due: float) -> tuple[list[Any], None, float]:
        self.instants.append(due)
        return list(self.outbox), None, self.next_due()

    def apply(self, crossings: Any) -> None:
        self.applied.extend(crossings)

    def set_time(self, time: float) -> None:
        self.time = time


def _span(member: FakeMember) -> tuple[Span, list[Any]]:
    sent: list[Any] = []

    def message(payload: Any) -> bytes:
        sent.append(payload)
        return b"m"

    return Span(cast(Member, member), message), sent


def test_decide_stops_first_ends_a_done_call_between_instants_only_then_the_span() -> None:
    assert decide(HALT, False, 0.1, 0.0, 1.0) == STOPPED
    assert decide(GO, True, 0.1, 0.0, 1.0) == STOPPED  # a failure at the last tag, either side
    assert decide(DONE, False, 0.1, 0.1, 1.0) == TAG  # a microstep of the same instant first
    assert decide(DONE, False, 0.2, 0.1, 1.0) == ENDED
    assert decide(GO, False, 1.5, 0.1, 1.0) == UNTIL
    assert decide(GO, False, math.inf, 0.1, None) == IDLE
    assert decide(GO, False, math.inf, 0.1, 1.0) == UNTIL
    assert decide(GO, False, 0.2, 0.1, None) == TAG


def test_a_span_runs_the_tags_both_sides_choose_and_ends_at_until() -> None:
    """The process runs the earliest of both due times each tag, publishes the host's
    messages, and moves its clock to the span's end once both are past it."""
    member = FakeMember([0.1, 0.3, 0.5])
    span, sent = _span(member)
    assert span.begin(0.4, 0.2, GO, ([], [])) == 0.1
    assert span.active and span.next() == b"m"  # its own tag at 0.1
    crossing = ("ping.y", [torch.tensor(1)], None, 0.2, 1)
    assert span.take([crossing], GO, 0.2) == b"m"  # the host's at 0.2 next
    assert span.take([], GO, 0.6) is None  # 0.5 and 0.6 are past 0.4
    assert member.instants == [0.1, 0.2] and member.applied == [crossing]
    assert (span.active, member.time) == (False, 0.4)
    assert [payload[2] for payload in sent] == [0.3, 0.5]


def test_a_span_that_fails_to_begin_reads_no_message_of_its_tags() -> None:
    """Planted: ``begin`` marking the span active before its due time (which raised here):
    the process then read only the tags connection, never the host's next command."""
    member = FakeMember([])  # next_due raises IndexError
    span, _ = _span(member)
    with pytest.raises(IndexError):
        span.begin(1.0, 0.1, GO, ([], []))
    assert not span.active


def test_a_halt_ends_the_span_even_in_its_second_exchange() -> None:
    """A message that wakes the host's node makes both sides send their due times again; the
    host's halt in that second message (its span broke off) ends the span, no tag run.
    Planted: ``take`` keeping the first message's ask in the second: a tag ran."""
    crossing = ("pong.y", [torch.tensor(2)], None, 0.1, 1)
    member = FakeMember([0.1, 0.2, 0.2], outbox=[crossing])
    span, sent = _span(member)
    span.begin(None, 0.1, GO, (["pong.y"], []))
    span.next()
    assert span.take([], GO, 0.3) == b"m" and sent[-1] == ((), None, 0.2)  # the second round
    assert span.take([], HALT, math.inf) is None
    assert not span.active and member.instants == [0.1]


def test_a_span_whose_due_time_the_host_knew_is_quiet_and_a_wrong_one_is_a_bug() -> None:
    """A span the host began with this process's due time (no command came since the last one
    ended whole) is ``quiet``: no reply goes. A due time that is not this process's would make
    both sides choose other tags: MujouInternalError, the span not begun. Planted: ``begin``
    not comparing them: this fails."""
    span, _ = _span(FakeMember([0.1]))
    assert span.begin(0.4, 0.2, GO, ([], []), 0.1) == 0.1
    assert span.quiet and span.active
    span, _ = _span(FakeMember([0.1]))
    assert span.begin(0.4, 0.2, GO, ([], [])) == 0.1 and not span.quiet
    span, _ = _span(FakeMember([0.1]))
    with pytest.raises(
        MujouInternalError, match=r"^the host took this process's next due time for 0\.2, but it is 0\.1$"
    ):
        span.begin(0.4, 0.2, GO, ([], []), 0.2)
    assert not span.active
