"""The virtual timer's tags between the host and one process: an exchange, not a round trip.

With one process besides the host, a ``run.sleep``'s tags need no command a tag
(proc.exchange). The host starts the sleep's span with one command (``span``: where it
ends, the host's next due time and what it asks), which the process answers with its own next
due time; from there each side knows both, and each computes the same next tag, runs it, and
sends the other what it sent (the messages that cross), whether it failed, and its next due
time, without waiting for the other first. Each then publishes what it got and computes the
next tag again. Each tag is one message each way, both on the way at once, instead of a
command and then its reply.

A message that wakes a triggered node moves its reader's next due time, which only the
reader's side sees: when a tag's messages wake a node anywhere (both sides know which ports
wake, from the net), each side sends its due time once more, after publishing, before the next
tag is chosen (the second round trip the star has then too).

The host's side is ``_lockstep._span``; the process's is ``Span`` here, on the thread that
takes its commands (``_child``). NOTE [ the exchange ] in ``_lockstep`` says what it saves.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from .._errors import MujouInternalError
from ._member import Failure, Member
from ._wire import Crossing

# What the host asks with each message: go on, end the span at the instant's end (the host's
# call was interrupted, ``done``), or end it now (the host's run is stopping, or failed).
GO, DONE, HALT = 0, 1, 2
# What ``decide`` says: run the tag, or why the span ends.
TAG, ENDED, UNTIL, STOPPED, IDLE = "tag", "done", "until", "stopped", "idle"


def decide(ask: int, failed: bool, due: float, last: float, until: float | None) -> str:
    """What comes next, from what both sides know alike: the host's ``ask``, whether either
    failed at the last tag, the earliest due time, the last tag's time, the span's end. The
    order is ``_lockstep._advance``'s: a stop first, ``done`` between whole instants only
    (trigger.tags), then the end of the span, then a wait nothing can end."""
    if ask == HALT or failed:
        return STOPPED
    if due > last and ask == DONE:
        return ENDED
    if until is not None and due > until:
        return UNTIL
    if due == float("inf"):
        return IDLE
    return TAG


def wakes(crossings: Sequence[Crossing], waking: Collection[str]) -> bool:
    """Whether any of ``crossings`` wakes a triggered node of the side it goes to."""
    return any(crossing[0] in waking for crossing in crossings)


def again(
    ask: int, failed: bool, to_host: Sequence[Crossing], to_process: Sequence[Crossing], waking: Any
) -> bool:
    """Whether both sides send their due time once more before the next tag: the tag's
    messages woke a node (``waking``: the ports that wake one in the host's process, in the
    other), and the span does not end now whatever the due times."""
    if ask == HALT or failed:
        return False
    return wakes(to_host, waking[0]) or wakes(to_process, waking[1])


class Span:
    """The process's side of a span of tags (proc.exchange).

    ``message(payload)`` makes the frame of a message to the host, a reply's frame (so that
    the host reads it as one, with the warnings and the count of events before it).
    """

    def __init__(self, member: Member, message: Callable[[Any], bytes]) -> None:
        self.member = member
        self.message = message
        self.active = False
        self.until: float | None = None
        self.last = -float("inf")
        self.due = self.host_due = float("inf")
        self.ask = GO
        self.failure: Failure | None = None
        self.sent: Sequence[Crossing] = ()
        self.waking: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())  # host's, ours
        self.wakes_any = False  # a port of either side wakes a node (else no ``again``)
        self.second = False  # the next message of the host is its due time after publishing
        self.quiet = False  # the host knew the due time ``begin`` answers: no reply goes

    def begin(
        self,
        until: float | None,
        host_due: float,
        ask: int,
        waking: tuple[Any, Any],
        known: float | None = None,
    ) -> float:
        """The host's ``span`` command: this process's next due time, its answer. ``known``:
        the due time the host knows already (no command came since the last span ended whole),
        then not sent (``quiet``); MujouInternalError where it is not this process's."""
        member = self.member
        member.begin_advance()
        self.until, self.last, self.second = until, -float("inf"), False
        self.host_due, self.ask, self.failure = host_due, ask, None
        self.waking = (frozenset(waking[0]), frozenset(waking[1]))
        self.wakes_any = bool(self.waking[0] or self.waking[1])
        self.due = member.next_due()
        if known is not None and known != self.due:  # both would choose other tags
            raise MujouInternalError(
                f"the host took this process's next due time for {known!r}, but it is {self.due!r}"
            )
        self.quiet = known is not None
        self.active = True  # last: a span that failed to begin reads no message of its tags
        return self.due

    def next(self) -> bytes | None:
        """Run the next tag if there is one: the frame of its message to the host; None once
        the span ended (at its end, the clock moved to it)."""
        member = self.member
        due = min(self.due, self.host_due)
        step = decide(self.ask, self.failure is not None, due, self.last, self.until)
        if step != TAG:
            self.active = False
            if step == UNTIL:
                assert self.until is not None
                member.set_time(self.until)
            return None
        crossed, self.failure, self.due = member.instant(due)
        self.last, self.sent = due, crossed
        return self.message((crossed, self.failure, self.due))

    def take(self, crossings: Sequence[Crossing], ask: int, host_due: float) -> bytes | None:
        """The host's message of the tag: publish its messages, then the next message to the
        host (this due time again, where the tag's messages woke a node; else the next tag's)."""
        if self.second:  # the host's due time after it published ours
            self.second, self.ask, self.host_due = False, ask, host_due
            return self.next()
        self.ask, self.host_due = ask, host_due
        if crossings:
            self.member.apply(crossings)
        if self.wakes_any and again(ask, self.failure is not None, self.sent, crossings, self.waking):
            self.second, self.due = True, self.member.next_due()
            return self.message(((), None, self.due))
        return self.next()
