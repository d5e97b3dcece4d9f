"""The virtual timer over a run's processes: one tag at a time, in lockstep (proc.virtual).

Each tag, every process runs its updates of the tag and commits them; the messages that
cross go to their readers' processes, which publish them with their arrivals; the next tag
is then the earliest due time of all. This reproduces what one process does at each instant
(``Engine.advance``), one barrier per tag.

NOTE [ the lockstep's thread ]
A host call that runs the tags up to a time and looks at nothing between them (``run.sleep``)
hands them to a thread of its own, ``mujou-lockstep``, and waits for it, looking every poll.
That thread sends each tag's command and reads its reply on each process's tags connection
itself (NOTE [ the tags connection ] in ``_group``), no other thread of the host woken for
either; no interrupt reaches it, so none can cut a frame there. The host's call that is
interrupted leaves at once (run.interrupt) and the thread stops at the end of its tag; the
next call that runs tags or reads the processes waits for that first, and raises the error
those tags ended with, if any (a process that died, a bug), which no call has raised yet. A
call that looks at something between the tags (``wait_for``'s predicate, ``join``) runs them
on its own thread, through the control connections, as before: the predicate runs on the
host's thread. An error that leaves a tag half read on the thread leaves the tags connections
unused for the rest of the run.

NOTE [ the lockstep's commands ]
On that thread a ``run.sleep``'s commands that are not tags go on the tags connections too:
where each process's time stands as the sleep begins (``begin_advance``, then ``next_due``),
and as it ends the messages kept back for a process (``apply``) and its time (``set_time``).
Through the control connections each of those four was a round trip through the host's
writer and reader threads, three wake-ups of sleeping threads each; a sleep of 10 ms at a
period of 1 ms (bench's tags-virtual-2p) runs 10 tags, so that was 12 wake-ups more on its 20.
A process's commands are written one after the other, before any reply is read: the process
takes the frames of one connection in order and replies to each in turn, so the two of a
sleep's start, and the two of its end, cost one round trip each.

NOTE [ the exchange ]
With one process besides the host (bench's tags-virtual-2p and tags-virtual-2h), a
``run.sleep``'s tags are an exchange (proc.exchange, ``_exchange``): after its instant each
side sends its crossings, its failure and its next due time, and reads the other's. Each tag's
critical path was the host's encode, a hop, the process's decode, its publish, its instant,
its encode, a hop, the host's decode and its ``deliver``; it is now one instant (both run at
once), one encode, one hop (both on the way at once), one decode and one publish. The
process no longer waits for a command to start a tag: it knows the next one as soon as the
host's message of the last one came. What it costs: the host decides what it asks of the next
tag (stop at the instant's end, for an interrupt) when it sends its message, before the
process's reply, so an interrupted sleep may run one tag more (proc.exchange); and while a span
runs, the process reads only the tags connection, so that a command the host sends once the
span ended (``run.read``, ``state_dict``) is taken after the span's last message, not before
(the two connections carry no order between them); a command that comes during a span
waits for its end (``_live_call`` ends a span before it sends one). The star (a command and
a reply a tag) stays for more processes, where the messages of one would go through the host
to another, and for ``wait_for`` and ``join``, which look at a condition between tags on the
host's thread. A sleep's start and end are the ``span`` command and its reply alone (the
four commands of NOTE [ the lockstep's commands ] are the star's).

Measured in tags-virtual-2p (``ping`` on the host, ``pong`` in the process), with callgrind's
instrumentation on around 30 sleeps of 10 ms (300 tags), every read blocking instead of polling
so that no poll is counted: a tag cost the host 357k instructions and the process 306k with
the star (942ff87), 300k and 283k with the exchange, each side's instant about half of it
(the engine's), the rest Python spread flat (cProfile: the connection's framing, the codec, the
publish, the decision). A compact struct codec for the tags' messages instead of the pickle
(``_codec``'s plain tensors) was tried and dropped: 4-7 us a message either way, as the pickle,
whose cost is the tensor's rebuild, which both pay. Wall time, this 2-core machine shared with
other work, ``python -m bench._one mujou_processes tags_virtual '{"seconds": 2}'`` interleaved
with 942ff87 and the floor's pipe lockstep in the same minutes: at load 1, 942ff87 4,831-8,489
tags/s, the exchange 11,109-12,773 (the floor 9,752-10,672); at load 2-3, 2,484-3,107 against
3,148-4,294 (the floor 44,894-53,657). Where both processes share one core, a tag's wall time
is the sum of both sides' CPU and the overlap is gone: the exchange then saves its instructions
only; on free cores a tag costs one side's instant, one codec pair and one hop.

What was cut around the instant since, in the same measure (``bench/tags_callgrind.py`` says
how to run it: 30 sleeps, 300 tags), instructions a tag, host and process: b8e76db
310-316k and 283k; the frames read and written on the descriptor (``_frames``), the tensor's
rebuild found by its copyreg extension code instead of an import a load, a scalar rebuilt by
strides, and the checks that cannot fire skipped (the events count read before its lock,
``again`` where no port wakes): 275k and 254k; a sleep's ``span`` not answered where the host
knows the process's due time (no command went to it since the last span ended whole): 261k and
251k; a read that found nothing in its poll blocking on the poller's descriptors
(``Poller.block``) instead of a selector made for it: 251k and 236k (that last cut is where the
poll finds nothing, as in this measure and on a busy machine; a poll that finds the frame makes
no selector). What is left: each side's instant, about half (the engine's: the instant's start,
the lent update's take and put-back, the update, the commit; ``Member.instant`` with one empty
update costs several times the update's own 10.7k), then the codec (about 3 us a message
for one scalar tensor, of which the tensor's rebuild or reduction is most: a pickle of the same
message without the tensor takes 0.5 us), the framing, and the publish.

Then ``mujou-lockstep`` lent to a span's instants once (``Member.lend``, ``Lender.begin_span``)
instead of once a tag: ``begin_instants``'s checks (whether a hook runs there, five torch
settings reads) and ``end_instants`` leave the tag, three settings reads after each update the
thread runs come in (what a hook may leave that is not put back ends the lending). Counted per
thread (the same command with ``--separate-threads=yes``, a16ed38 and this interleaved): the
lockstep thread 230.2k instructions a tag before, 228.1k after, 1 %; the whole host process
stays within the noise of the measure's other threads (the main thread's polls while it waits
for the sleep count: 248-264k by load), the process 235k both (its command thread is worker 0
for the whole run, lent once already). So the instant's cost is not in the lending: it is the
take, the run and the put-back of the update (``take_instant_for_host``, ``_run_taken``,
``host_done``), the instant's start and commit, and the waits' ``done`` checks around them.
``host_done`` no longer looks for the earliest due update under the virtual timer, where
``_wake_idle`` wakes nobody with it: the lockstep thread 228.0k, then 225.6k. ``Member.instant``
calls ``Lender.lend_instants`` itself where it lends, without ``host_wait``'s second look at
the instant's end after it (lend_instants returns once it saw it, the lock held): 225.1k, then
220.2k. ``Engine.host_wait`` on the process's command thread (worker 0 while it waits,
``_threads.Lent``) likewise returns once the worker's loop saw ``done()``, unless worker 0
exited: the process 235.2k, then 231.5k. In all, a16ed38 to this: the lockstep thread 230.2k
to 220.0k a tag (4 %), the process 235.3k to 231.5k (2 %); the host process's other threads
(main, about 10k a tag; another, 9-20k) as they were.

Then (callgrind per thread, ``--separate-threads=yes`` on the same command; base 3fa933c and
this run at load 4-8): the lockstep thread 221.1k instructions a tag, then 209.6k; the process
231.2k, then 220.4k. The codec's pickler finds the tensor's reduction in a table instead of
``reducer_override``, which the pickler called for the ``_rebuilt`` it returned too; the
tensor's bytes are read through a ctypes array type of their size (a third of
``ctypes.string_at``'s cost); a scalar is rebuilt 0-d in place (``squeeze_``), not as a view
of the 1-d tensor, with only the checks a scalar needs: a dump of tags-virtual-2p's message
28.2k then 26.0k, a load 27.2k then 21.6k (``_codec``'s ``dumps`` and ``loads`` in a loop under
callgrind). ``Member.instant``'s ``done`` asks ``quiescent`` only once no update is held. The
host's other thread that callgrind counts (9-53k a tag, more the busier the machine) is the
group's reader, ``mujou-process-pong``, which looks at the process's exit status each poll
that nothing came (NOTE [ a death ] in ``_group``): callgrind runs the tags some 50 times
slower, so it looks many times a tag; in a plain run it woke twice in 300 tags
(``threading.setprofile``'s count of its calls). What is left is what the NOTE says above:
each side's instant (its start, the take and put-back of the update, the commit and the
``done`` checks around it, several times the update's own cost, about 80 Python calls a tag
in the process, ``_threads._work``'s general loop among them) and the tensor's reduction and
rebuild (10k and 17k of the codec's 26k and 22k; torch's own calls, each 5-7k, are most of
it). A compact struct codec of the tags' crossings (each plain tensor as its dtype, shape and
bytes in the message, rebuilt by the tag's code) was tried again and dropped: the dump 3k
cheaper, the load 3.5k dearer (the rebuild is the same, the list walked in Python).

Then each side's instant run alone (NOTE [ an instant run alone ] in ``_engine._instants``:
the thread that runs a span's tags, the only one that runs its process's worker updates, takes
them, runs them and puts them back in one go, without the general way's looks and wake-ups),
and ``Member.instant`` answering the next due time from its own lock section: the lockstep
thread 210.6k instructions a tag, then 189.2k; the process 220.3k, then 186.1k (5ddbd5d and
this, the same command); then 182.1k and 177.0k with the host's waits woken at the instant's
end only for a pause (the lockstep thread waits for that end itself). Then the process's
command loop, during a span, takes a ready poll of the tags connection alone as that
connection's (no look at each descriptor), a span's message asks for the hooks' warnings only
where there are some, and an instant rounds its own time only (the last one's kept): 182.0k
and 177.5k (8d68521, re-measured), then 181.4k and 173.4k.

NOTE [ where a tag's time goes ]
Of the star (a command and its reply a tag; NOTE [ the exchange ] for one process). Measured
in tags-virtual-2p (``ping`` on the host, ``pong`` in a process of its own, one
worker each), per tag, with ``strace`` and each thread's CPU time and context switches from
``/proc`` (2 cores shared with other work, load 2-5):
- the syscalls are those of the floor's pipe lockstep and a few more: the host writes the
  tag's command (one ``write``), the process polls then reads it (two ``read``: the length,
  then the frame), writes its reply, and the host polls and reads it. No other thread of
  either process wakes: the host's lockstep thread runs ``ping``'s update itself
  (proc.lockstep-thread), the process's command thread is its worker 0 (NOTE [ a lent worker ]
  in ``_engine._threads``). Before, the host's worker was woken for ``ping`` and woke the
  lockstep's thread back: 2 wake-ups a tag; and the commands of each sleep's start and end
  (NOTE [ the lockstep's commands ]) 1.2 more a tag. Measured side by side at load 6.5, the
  voluntary context switches of the host's threads a tag: before, 4.6 (the worker 1.7-1.9, the
  lockstep's thread 1.4-1.6, the control reader 1.0, its writer 0.4, the main thread 0.1),
  their CPU 370-440 us a tag; now 0.25 (the lockstep's thread and the main thread), 225-345 us.
  Voluntary switches a tag, the host's
  lockstep thread and the process's command thread: 0.15 and 0.00 with the polls of
  ``_spin`` (each polls instead), 0.8 and 0.9 without (each blocks once a tag).
- the CPU: 160-250 us a tag on each side at load 2-8, against 20-80 us of wall time a tag
  for the floor's whole lockstep in the same runs; the two sides overlap (the host runs
  ``ping`` while the process runs ``pong``), so a tag takes about one side's CPU plus a
  wake-up. The process's command thread, timed with ``time.thread_time_ns`` at load 7 (each
  figure inflated about 3 times against a quiet machine): the ``instant`` command 95-115 us
  (unpickling the frame and the crossing's tensor about 35, the deferred message's ``apply``
  6.5, ``Member.instant`` with ``pong``'s update 58-64, ``next_due`` 2), pickling the reply and
  reading the frame 31-35, ``multiprocessing.connection.wait`` making a selector 25-28 (gone
  now: ``Poller.wait`` says which connection has data), the poll 11-13, the reply's ``write``
  9-10. The host's lockstep thread: ``Member.instant`` with ``ping``'s update 57. What is
  left is Python that the floor does not have, spread flat over many small functions
  (cProfile): an instant's start, the lent update's take and put-back, its commit, and the
  codec of the command and its reply.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._engine._collect import stopping_now
from .._engine._instants import nothing_can_happen
from ._exchange import DONE, ENDED, GO, HALT, STOPPED, TAG, UNTIL, again, decide
from ._group import EXIT_GRACE, rebuild_failure
from ._host import Processes, each_result
from ._member import Failure
from ._placement import HOST
from ._wire import Crossing


class _Job:
    """One host call's tags, run on the lockstep's thread."""

    __slots__ = ("cancelled", "error", "finished", "reported", "result", "until")

    def __init__(self, until: float | None) -> None:
        self.until = until
        self.cancelled = False  # the host's call was interrupted: stop at the end of the tag
        self.finished = threading.Event()
        self.result = False
        self.error: BaseException | None = None
        self.reported = False  # a host's call raised ``error``


class Lockstep:
    """The virtual timer's tags over a run's processes, for the host's calls
    (NOTE [ the lockstep's thread ])."""

    def __init__(self, processes: Processes) -> None:
        self._processes = processes
        self._direct = all(group.tags is not None for group in processes.groups.values())
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._job: _Job | None = None  # the last job handed to the thread
        self._lock = threading.Lock()  # a job is queued before the thread's end, or not at all
        self._closed = False

    def advance(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        """Run the tags up to ``until`` (proc.virtual); see ``advance``."""
        self.finish_last()
        job = _Job(until)
        with self._lock:
            direct = done is None and self._direct and not self._closed and not self._processes.closed
            if direct:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._main, name="mujou-lockstep", daemon=True)
                    self._thread.start()
                self._job = job
                self._jobs.put(job)
        if not direct:
            return advance(self._processes, until, done)
        self._wait(job)
        return self._result(job)

    def close(self) -> None:
        """The run has ended: the thread ends (waited for up to ``EXIT_GRACE``, but from itself)."""
        with self._lock:
            self._closed = True
            job, thread = self._job, self._thread
            if thread is not None:
                self._jobs.put(None)
        if job is not None:
            job.cancelled = True
        if thread is not None and thread is not threading.current_thread():
            thread.join(EXIT_GRACE)

    def finish_last(self) -> None:
        """Wait until the thread ended the tags of a call that was interrupted; raise their
        error. Before a call runs tags, and before one reads the processes' state (a state
        tree is of one time in every process)."""
        job = self._job
        if job is None or job.reported:
            return
        if not job.finished.is_set():
            job.cancelled = True
            self._wait(job)
        self._result(job)

    @staticmethod
    def _result(job: _Job) -> bool:
        """The finished ``job``'s result, or its error raised (once)."""
        job.reported = True
        if job.error is not None:
            raise job.error
        return job.result

    def _wait(self, job: _Job) -> None:
        """Wait for ``job``, looking every poll: an interrupt leaves at once, the job cancelled."""
        poll = self._processes.host.engine.poll
        try:
            while not job.finished.wait(poll):
                pass
        except BaseException:
            job.cancelled = True
            raise

    def _main(self) -> None:
        """The lockstep's thread: each job's tags, its result or error for the host's call."""
        while (job := self._jobs.get()) is not None:
            try:
                job.result = advance(self._processes, job.until, lambda: job.cancelled, direct=True)
            except BaseException as exc:
                self._direct = False  # a reply may be left unread on a tags connection
                job.error = exc
            finally:
                job.finished.set()


def advance(
    processes: Processes, until: float | None, done: Callable[[], bool] | None, *, direct: bool = False
) -> bool:
    """Run the tags up to ``until`` in every process, one at a time (proc.virtual).

    Each tag: every process runs its updates of the tag and commits them; the messages
    that cross are handed to their readers' processes; the next tag is the earliest due
    time of all. ``done`` is asked between whole instants, as ``Engine.advance`` does: not
    while a later tag of the same time (a microstep) is due (trigger.tags).

    The messages for a group that wake none of its nodes leave its next due time as it was:
    they go with the group's next tag command instead of a command of their own (one command
    a tag instead of two), and with one of their own before this returns.

    ``direct``: on the lockstep's thread, the tags' commands and replies go through the tags
    connections (NOTE [ the lockstep's thread ]).
    """
    processes.advancing = True
    try:
        return _advance(processes, until, done, direct)
    finally:
        processes.advancing = False
        if processes.host.engine.ended:  # left by an error after the run ended: end them now
            processes.stop_soon()


def _advance(
    processes: Processes, until: float | None, done: Callable[[], bool] | None, direct: bool
) -> bool:
    host, engine = processes.host, processes.host.engine
    policy = engine.policy
    if processes.closed or stopping_now(policy):  # the run has ended, or is ending: no tag runs
        _wait_for_the_end(processes)
        return done() if done is not None else False
    if direct and len(processes.groups) == 1:  # one process besides the host: an exchange
        return _span(processes, until, done)
    dues = _each(processes, {name: [("begin_advance",), ("next_due",)] for name in processes.groups}, direct)
    host.begin_advance()
    dues[HOST] = host.next_due()
    deferred: dict[str, list[Crossing]] = {}
    last = -math.inf  # the time of the last tag run here
    while True:
        if stopping_now(policy):  # the last tag's messages are out first, as in one process
            _flush(processes, deferred, None, direct)
            _wait_for_the_end(processes)
            break
        due = min(dues.values())
        if due > last and done is not None and done():  # the instant at ``last`` is whole
            _flush(processes, deferred, None, direct)
            return True
        if until is not None and due > until:
            _flush(processes, deferred, until, direct)
            host.set_time(until)
            return False
        if due == math.inf:  # nothing deferred: its readers are periodic, so due again
            raise nothing_can_happen()
        _tag(processes, due, dues, deferred, direct)
        last = due
    return done() if done is not None else False


def _span(processes: Processes, until: float | None, done: Callable[[], bool] | None) -> bool:
    """``_advance``'s tags with one process besides the host, as an exchange (proc.exchange,
    ``_exchange``): one ``span`` command, then each tag one message each way, both sent
    before either is read. Both sides ``decide`` each next tag from what both know."""
    (group,) = processes.groups.values()
    host, engine = processes.host, processes.host.engine
    waking = processes.placement.waking
    here, there = frozenset(waking[HOST]), frozenset(waking[group.name])
    wakes_any = bool(here or there)  # else no tag's messages wake a node (``again``)
    host.begin_advance()
    due_here = host.next_due()
    ask = _ask(engine.policy, done, None)
    # The process's due time, where no command went to it since the last span ended whole: it
    # replies to the span only where it is not known (its first tag's message comes at once).
    known, group.known_due = group.known_due, None
    known_there = known[1] if known is not None and known[0] == group.commands else None
    group.send_tag("span", until, due_here, ask, (sorted(here), sorted(there)), known_there)
    due_there: float = group.tag_reply() if known_there is None else known_there
    last, failed = -math.inf, False
    host.lend()  # once for the span's tags, not once a tag
    try:
        while (step := decide(ask, failed, due := min(due_here, due_there), last, until)) == TAG:
            with processes.tag_lock:
                crossed, failure, due_here = host.instant(due)
            ask = _ask(engine.policy, done, failure)
            group.send_tag("exchange", crossed, ask, due_here)
            found, failed_there, due_there = group.tag_reply()
            if found:
                host.apply(found)
            if wakes_any and again(ask, failed_there is not None, found, crossed, (here, there)):
                due_here = host.next_due()  # a due moved: both send theirs once more
                group.send_tag("exchange", (), ask, due_here)
                due_there = group.tag_reply()[2]
            if failure is not None or failed_there is not None:
                _fail_first(
                    processes, [(n, f) for n, f in ((HOST, failure), (group.name, failed_there)) if f]
                )
            failed, last = failed_there is not None, due
    except BaseException:  # a bug, or the process's end: the span ends there too, if it can
        group.send_tag("exchange", (), HALT, math.inf)
        raise
    finally:
        host.unlend()
    if step == STOPPED:
        _wait_for_the_end(processes)
        return done() if done is not None else False
    if step in (ENDED, UNTIL):  # ended whole: the process's due time is known for the next
        group.known_due = (group.commands, due_there)
    if step == ENDED:
        return True
    if step == UNTIL:
        assert until is not None
        host.set_time(until)
        return False
    raise nothing_can_happen()


def _ask(policy: Any, done: Callable[[], bool] | None, failure: Failure | None) -> int:
    """What the host asks of a span's next tag (``_exchange``): end now where its run is
    stopping, at the instant's end where its call is done."""
    if failure is not None or stopping_now(policy):
        return HALT
    return DONE if done is not None and done() else GO


def _each(
    processes: Processes, commands: Mapping[str, Sequence[tuple[Any, ...]]], direct: bool
) -> dict[str, Any]:
    """Send each group its ``commands`` (``(command, *args)`` each), in order; the reply to the
    last of them, by group, once every group replied to all (each error raised as ``all``).

    ``direct``: through the tags connections, a group's commands written one after the other
    before any reply is read (NOTE [ the lockstep's commands ]); else through the control
    connections, one command at a time.
    """
    if not direct:
        replies: dict[str, Any] = {}
        for k in range(max((len(found) for found in commands.values()), default=0)):
            replies.update(
                processes.gather(
                    processes.send_each(
                        {name: found[k] for name, found in commands.items() if k < len(found)}
                    )
                )
            )
        return replies
    groups = processes.groups
    for name, found in commands.items():
        for command in found:
            groups[name].send_tag(*command)

    def replies_of(name: str) -> Callable[[], Any]:
        group = groups[name]

        def last() -> Any:
            for _ in range(len(commands[name]) - 1):
                group.tag_reply()
            return group.tag_reply()

        return last

    return each_result({name: replies_of(name) for name in commands})


def _flush(
    processes: Processes, deferred: dict[str, list[Crossing]], until: float | None, direct: bool
) -> None:
    """Hand each group the messages deferred for it (they wake nothing there), then, with
    ``until``, move every group's time to it (the host's advance ended there)."""
    commands: dict[str, list[tuple[Any, ...]]] = {name: [] for name in processes.groups}
    for name, crossings in deferred.items():
        commands[name].append(("apply", crossings, True))
    deferred.clear()
    if until is not None:
        for queued in commands.values():
            queued.append(("set_time", until))
    _each(processes, {name: found for name, found in commands.items() if found}, direct)


def _wait_for_the_end(processes: Processes) -> None:
    """The run is ending: wait until every node stopped and every process exited (bounded
    once the host's nodes stopped), so that the host's call that returns or raises now finds
    the run ended whole (proc.cleanup)."""
    engine = processes.host.engine
    with engine.lock:
        engine.host_wait(lambda: engine.ended)
    processes.stop()


def _tag(
    processes: Processes,
    due: float,
    dues: dict[str, float],
    deferred: dict[str, list[Crossing]],
    direct: bool,
) -> None:
    """One tag in every process; ``dues`` becomes each process's next due time, ``deferred``
    the messages for the groups that their next command takes."""
    host, groups = processes.host, processes.groups
    commands = {name: ("instant", due, deferred.pop(name, [])) for name in groups}
    sent = {} if direct else processes.send_each(commands)
    if direct:
        for name, command in commands.items():
            groups[name].send_tag(*command)
    with processes.tag_lock:
        crossed, failure, _ = host.instant(due)  # an interrupt leaves: the replies are dropped
    crossings: dict[str, Sequence[Crossing]] = {HOST: crossed}
    failures: list[tuple[str, Failure]] = [] if failure is None else [(HOST, failure)]
    # Each reply comes after the events its process sent before it (the messages of the
    # ports the host watches): see NOTE [ the control protocol ] in _group.
    replies = _tag_replies(processes) if direct else processes.gather(sent)
    for name, (found, failed, next_due) in replies.items():
        crossings[name] = found
        dues[name] = next_due
        if failed is not None:
            failures.append((name, failed))
    dues.update(processes.deliver(crossings, wake=True, defer=deferred))
    dues[HOST] = host.next_due()
    if failures:
        _fail_first(processes, failures)


def _tag_replies(processes: Processes) -> dict[str, Any]:
    """The tag's reply of every group, whatever another's was (as ``Processes.gather``)."""
    return each_result({name: group.tag_reply for name, group in processes.groups.items()})


def _fail_first(processes: Processes, failures: list[tuple[str, Failure]]) -> None:
    """Of the failures of one tag, the earliest registered node's is the run's error
    (sched.virtual-failure), whichever process it was in."""
    order = {node.name: i for i, node in enumerate(processes.nodes)}

    def rank(item: tuple[str, Failure]) -> int:
        failure = item[1]
        return order.get(failure[1], len(order)) if failure[0] == "hook" else -1

    process, failure = min(failures, key=rank)
    error = processes.host.engine.error if process == HOST else rebuild_failure(failure, process)
    assert error is not None
    engine = processes.host.engine
    with engine.lock:
        engine.policy.error = error
        engine.policy.begin_stop()
        engine.deliver()
    # The processes end once the tag's messages are out: advance's loop ends them next.
