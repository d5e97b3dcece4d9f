"""``Run``: the host's handle on a running net: reading, writing, waiting, state, stopping.

``mujou.run`` (``_start.py``) makes it. See the "Running a net" page of the spec.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, cast, final

from ._engine import Engine, in_hook_thread
from ._engine._snapshot import progress_sample, run_stats
from ._errors import HookError
from ._in_run import hooking
from ._messages import Nest, cpu_copy
from ._net import Net
from ._numbers import non_negative, shown
from ._port import M, _Port
from ._ports import Input, Output
from ._stats import RunStats
from ._subscription import Subscription

if TYPE_CHECKING:  # Protocols the classes fit: their modules import this one (mujou._handles)
    from ._handles import ProcessGroup as Group
    from ._handles import RunProcesses as Processes
    from ._handles import RunRecording as Session
    from ._record._replay import HostWrites

_INF = math.inf
_get_ident = threading.get_ident


def _host_message(port: Input[Any], message: object, what: str) -> tuple[Any, Nest | None]:
    """The host's snapshot of ``message`` for ``port``, on the port's node's device, and its
    tensors; TypeError starting with ``what`` for a value that is not a message or does not
    match the port's declaration."""
    return port._host_snapshot(message, what)


@final
class Run:
    """A running net: the host's handle to read, write, wait, take state and stop.

    Made only by :func:`mujou.run`. Use it as a context manager: leaving the ``with`` block
    stops the run. See the "Running a net" page.
    """

    _net: Net
    _engine: Engine
    _processes: Processes | None  # the run's other processes (proc.host-api), if any
    _subscriptions: list[Subscription[Any]]
    _seed: int  # the run's seed (threads.run-seed), set by mujou.run after _setup
    _recording: Session | None  # record=: the run's recording, if any
    _replayed: HostWrites | None = None  # Replay(writes=True): the recorded host's writes

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("mujou.Run has no public constructor; use mujou.run(net)")

    def _setup(
        self, net: Net, engine: Engine, processes: Processes | None = None, recording: Session | None = None
    ) -> None:
        self._net = net
        self._engine = engine
        self._processes = processes
        self._recording = recording
        self._subscriptions = []
        # The ports the host's calls checked, by id (NOTE [ the host's round trip ]): for
        # ``_port``, the port; for ``write``, the input and whether its node is in this process.
        self._checked: dict[int, _Port] = {}
        self._writable: dict[int, tuple[Input[Any], bool]] = {}
        self._sources: dict[int, tuple[_Port, _Port]] = {}  # for ``wait_for``: the port, its source
        engine.add_waker(self._wake_subscriptions)

    def _wake_subscriptions(self) -> None:
        for subscription in list(self._subscriptions):
            subscription._run_ended()

    # -- checks shared by the host's calls -------------------------------------------------

    def _host_call(self, what: str) -> None:
        """Refuse calls that wait, from a hook (rules.no-run-calls-in-hooks); flush warnings."""
        if in_hook_thread():
            self._refuse(what)
        self._engine.hooks.flush_warnings(stacklevel=3)

    def _refuse(self, what: str) -> NoReturn:
        """The error of a call that waits, made from a hook (rules.no-run-calls-in-hooks)."""
        where = self._engine.hooks.hook_of_this_thread()
        raise RuntimeError(
            f"run.{what}() cannot be called from a hook{where}: it would wait for the node itself"
        )

    def _port(self, port: object) -> _Port:
        """``port``, checked to be a port of this run's net (once per port: the net is fixed)."""
        known = self._checked.get(id(port))
        if known is not None and known is port:
            return known
        checked = self._check_port(port)
        self._checked[id(checked)] = checked  # the entry keeps the port, so its id stays its own
        return checked

    def _check_port(self, port: object) -> _Port:
        if not isinstance(port, Input | Output):
            raise TypeError(f"port must be an Input or Output of a node, got {type(port).__name__}")
        if port._node is None:
            raise TypeError(
                f"{type(port).__name__} {port.name!r} is the class attribute; "
                "pass the port of a node instance (node.port)"
            )
        if not self._engine.has_node(port._node) and (
            self._processes is None or not self._processes.has_node(port._node)
        ):
            raise ValueError(f"port {port.name!r} is not a port of this run's net")
        return port

    def _group_of(self, port: _Port) -> Group | None:
        """The process of ``port``'s node, when it is not the host's (proc.host-api)."""
        return None if self._processes is None else self._processes.group_of(port.node)

    def _watch(self, port: _Port) -> Callable[[], None] | None:
        """Mirror ``port`` (an output, or an input the host feeds) onto the host while the
        host waits for its messages, when its node is in another process; the undo."""
        if self._processes is None or self._processes.group_of(port.node) is None:
            return None
        return self._processes.watch(port)

    def _advance(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        """Virtual timer: run the tags up to ``until`` (in every process of the run), stopping
        at each keyframe time of a recording to take it (record.keyframes), and at each write
        of a replay's recorded host to make it (replay.writes)."""
        advance = self._advance_all
        if self._replayed is not None:
            advance = functools.partial(self._replayed.advance, self, self._advance_all)
        recording = self._recording
        if recording is not None and recording.takes_keyframes:
            return recording.advance(self, advance, until, done)
        return advance(until, done)

    def _advance_all(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        if self._processes is not None:
            return self._processes.advance(until, done)
        return self._engine.advance(until, done)

    def _live(self, what: str) -> None:
        self._engine.raise_error()
        if self._engine.ended:
            raise RuntimeError(f"run.{what}(): the run has ended")

    # -- reading and writing ---------------------------------------------------------------

    # NOTE [ the host's round trip ]: ``run.write`` then ``run.wait_for`` on a triggered node
    # (bench's echo-triggered: a random pause of up to 1 ms before each trip, so the thread
    # comes back to cold caches) has no thread hand-off (NOTE [ the host lends its thread ]),
    # so what is left is the Python and torch calls on the host's thread, each a few times
    # dearer cold than in a loop (24 us a trip warm, 55-90 cold). Measured with
    # ``py-spy record -r 400`` and perf_counter_ns around each step in a script looping the
    # trip (2-core AMD EPYC, CPython 3.11, torch 2.13). So a port's checks are made once
    # per run (``_checked``, ``_writable``, ``_sources``: the net does not change while it
    # runs), a CPU tensor is snapshotted without the device calls of ``host_to_node``,
    # ``in_hook_thread`` is one set look-up, the settings put back after a lent update are
    # read with two calls instead of five, and the common case of wait_for (the answer is
    # there after the lent update) makes no closure. The medians of each step over 4,800
    # trips at load 6 (in us; in a warm loop about a third): the caller's ``torch.full``
    # 13.0; write: the hook-thread check and the port's look-up 3.1, the snapshot's clone
    # 8.5, the publish with its clock read 3.3, the arrival under the lock 6.2 (the policy's
    # part 3.2); wait_for: its checks 3.2, the thread's torch settings 1.4, the policy's take
    # under the lock 3.6, the lent update (``_update``'s runner, the echo's read and send)
    # 7.8, the put-back under the lock 3.1, the answer's copy 3.5, the predicate's ``item``
    # 2.2: 59 in all, against the floor's whole trip of 26-33 (two threads, two Events), which
    # copies nothing. No worker races the host: 3 writes of those 4,800 woke one (NOTE
    # [ writes that wake no worker ]: the idle workers' fallback, once a second). The torch
    # calls alone (the full, the two clones, the item) are about 25 of the 59: as much as
    # the floor. A host whose messages are snapshotted and copied cannot reach the floor
    # here. What would come closer: a write that hands its tensor over instead of cloning it
    # (not provable from Python: reference counts differ across versions, and views share
    # storage), and the lent update taken in the write's own lock section (one take and one
    # queue push and pop fewer). Mujou's own part, about 34 us, is spread over some twenty
    # steps of 1-4 us each. In bench (``--quick --repeats 3 --only echo-triggered``, the code
    # before and after this session's cuts one after the other, twice, load 4-7): 56.6 and
    # 69.3 us against the floor's 26.1 and 28.7 (2.17x, 2.41x); before, 56.4 and 75.0 against
    # 27.6 and 23.5 (2.04x, 3.19x). Since (issue 24), the host's three lock sections take
    # short paths for the common case: the write's arrival (``sent_arrived``, then
    # ``Policy.sent_to_free``), the take (``take_for_host`` with no shared batch) and the
    # put-back (``host_done`` of one update). Stamped in a script looping bench's trip, base
    # (0257045) and new alternated at load 6-7: the arrival 6.4-6.9 -> 3.8-4.6 us, the take
    # 4.6-5.0 -> 2.4-2.9, the put-back 4.1-4.5 -> 2.6-3.2; unstamped, the trip (with the
    # caller's ``torch.full``) 95.4, 97.3, 83.3, 98.5 -> 83.9, 88.7, 74.5, 90.4 us, base run
    # first in each pair; at load 1.5, in the order new, base, base, new twice, 71.8, 71.2,
    # 64.8, 62.3 (new) against 71.8, 80.0, 62.5, 61.9 (base): the machine's drift within a
    # minute (10 us) is larger than the cut, which a quiet machine has to tell. Where the
    # rest goes (stamped, new, load 6): the caller's ``torch.full`` 16-22, the write's checks
    # 1.9-2.5, its clone 9.6-12.3, the publish with its clock read 4.5-5.8, the arrival 3.8-4.6;
    # wait_for's checks 3.2-4.4, the thread's torch settings 2.0-2.3, the take 2.4-2.9, the
    # runner and the echo's update (``_update``, the read and the send) 11-13, the put-back
    # 2.6-3.2, the answer's copy 3.2-4.4, the predicate's ``item`` 2.6-3.4. The floor's trip
    # in the same minutes, 34-39 us, holds its ``torch.full`` and two wake-ups; the torch
    # calls alone here (full, clone, copy, item) come to 31-42: 1.0x needs a write that
    # hands its tensor over instead of cloning it, which the snapshot rule (run.write) forbids.
    #
    # Checked again (issue 24, the host round trip; 2-core AMD EPYC, load 4-7, the other
    # helpers' work running). Who runs the echo: the host, in 99.3-99.96 % of the trips (the
    # hook's thread noted, 3-6 s of trips); a write woke a worker in 0.1-0.4 % of them
    # (Parking's notifies counted): after the idle worker's timed look took an update before
    # the host did, the next write ends the deferral, as threads.host-runs-updates says; and,
    # until 659ee38, every 1.2-2.5 s of trips (NOTE [ writes that wake no worker ] in _lend).
    # No thread hand-off is left in the others. The idle worker's looks (every LOOK): a tenth
    # of the trips had one within 100 us, their p50 5-12 us above the others', until
    # dcb23d3 (NOTE [ a look that finds nothing ] in _threads). Instructions a trip
    # (callgrind, from before the caller's ``torch.full`` to after ``wait_for``, 200 trips,
    # the idle worker's looks moved out of the counted trips): 120.0k at 281443c, 112.7k since
    # ``Policy.host_wrote`` and the cuts in ``_lend`` and here; the floor's trip, counted the
    # same way, 49.3k (its two Events and the echo thread's loop) plus its two wake-ups. Of
    # Mujou's, torch's calls are about 30k: ``clone`` 8k each (the write's snapshot and the
    # answer's copy), the caller's ``full`` 7.6k, ``item`` 1.6k, the tensors' deallocation 3.6k.
    # Stamped in place (perf_counter_ns, medians of about 5,000 trips, two runs, each stamp
    # about 0.3 us): the caller's full 9.7-14.2 us, the write's clone 6.9-9.8, the answer's
    # copy 2.4-2.7, the predicate's item 1.8-2.4; the write's call, checks and look-up 4-5, the
    # publish 3.3-4.3, the arrival 3.8-4.2; wait_for's checks 3.0-3.4, the take 3.8-4.2, the
    # runner around the hook 5.7-6.8 (``_update``), the echo's read and send 2.5-2.8, the
    # give-back 2.3-2.4: 52-66 in all, against the floor's 24-30 in the same minutes. So
    # even with no Mujou code at all the torch calls of this workload (20-29 us) would be the
    # floor's whole trip; the floor made no tensor then. Wall-clock, interleaved (``bench/run.py
    # --quick --repeats 3 --only echo-triggered --systems mujou,floor,heap_pool``, load 5-7):
    # 69.2 and 64.1 us at 281443c, 70.7, 76.9 and 59.7 at 81decc5, the floor 26.1-30.5, the
    # plain pool 54.0-67.4: the cut (about 2 us) is below what this machine's runs can tell.
    # Since 5e83c39 the floor's host makes and reads the workload's tensor as the peers' do
    # (47-50 us then), and since d4c0a36 the echo workload writes with ``copy=False``
    # (run.write-no-copy), which drops the write's clone: 59.0 us against the floor's 47.3.

    def read(self, port: Input[M] | Output[M]) -> M | None:
        """The port's latest message as a CPU copy the host owns, or None. See :ref:`run.read`."""
        if not in_hook_thread():
            self._engine.hooks.flush_warnings(stacklevel=2)
        checked = self._port(port)
        if self._processes is not None and self._group_of(checked) is not None:
            return cast("M | None", self._processes.read(checked))
        message = checked._message()
        return None if message is None else cast("M", cpu_copy(message))

    def write(self, port: Input[M], value: M, *, copy: bool = True) -> None:
        """Set the latest message of an input without a source. See :ref:`run.write`.

        ``value`` is a tensor or a nest of tensors and scalars, as for ``Output.send``. With
        ``copy=False``, a tensor already on the input's node's device is the message itself:
        the host hands it over and must not change it afterwards (:ref:`run.write-no-copy`).

        Raises:
            TypeError: ``value`` is not a message, does not match the input's declaration, or
                ``copy`` is not a bool.
            ValueError: ``port`` has a source in the net.
            HookError: a hook failed.
            RuntimeError: the run has ended.
        """
        if _get_ident() in hooking:  # in_hook_thread(), inlined
            self._refuse("write")
        if copy is not True and copy is not False:
            raise TypeError(f"run.write(): copy must be a bool, got {type(copy).__name__}: {copy!r}")
        engine = self._engine
        hooks = engine.hooks
        if hooks._warnings:  # flush_warnings' own test, before its call
            hooks.flush_warnings(stacklevel=2)
        known = self._writable.get(id(port))
        if known is None or known[0] is not port:
            known = self._check_writable(port)
        checked, here = known
        message = checked._host_snapshot(value, "run.write()", copy)
        if engine.policy.error is not None or engine.ended:
            self._live("write")
        if here:
            engine.host_write(checked, message)
            return
        group = self._group_of(checked)
        assert group is not None
        group.call("write", checked.name, cpu_copy(message[0]))

    def _check_writable(self, port: object) -> tuple[Input[Any], bool]:
        """``port``, checked to be an input of this run's net without a source, and whether
        its node is in this process; kept for the next write (the net is fixed for the run)."""
        checked = self._port(port)
        if not isinstance(checked, Input):
            raise TypeError(f"run.write() takes an Input, got output {checked.name!r}")
        if checked.source is not None:
            raise ValueError(
                f"input {checked.name!r} has the source {checked.source.name!r}; the host "
                "writes only inputs without a source"
            )
        known = (checked, self._group_of(checked) is None)
        self._writable[id(checked)] = known
        return known

    def subscribe(self, port: Input[M] | Output[M], maxsize: int = 1024) -> Subscription[M]:
        """Every message made visible on ``port`` from now on. See :ref:`run.subscribe`."""
        self._host_call("subscribe")
        checked = self._port(port)
        size: object = maxsize
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"maxsize must be a positive int, got {maxsize!r}")
        self._live("subscribe")
        if isinstance(checked, Input) and checked.source is not None:
            checked = checked.source
        undo = self._watch(checked)

        def closed(subscription: Subscription[Any]) -> None:
            self._subscriptions.remove(subscription)
            if undo is not None:
                undo()

        lender = self._engine.lender
        subscription: Subscription[M] = Subscription._open(
            checked,
            maxsize,
            closed,
            self._engine.raise_error,
            self._engine.virtual,
            lend=None if lender is None else lender.answer,
        )
        self._subscriptions.append(subscription)
        return subscription

    def wait_for(
        self,
        port: Input[M] | Output[M],
        predicate: Callable[[M], bool] | None = None,
        timeout: float | None = None,
    ) -> M:
        """Wait until the port's latest message satisfies ``predicate``; return a CPU copy.

        The current latest message is checked first (under the real-time timer, once a due
        update ran on this thread: :ref:`threads.host-runs-updates`). ``timeout`` is in timer
        seconds. Under the virtual timer this advances time like :meth:`sleep`. See
        :ref:`run.wait-for`.

        Raises:
            TimeoutError: no such message within ``timeout``.
            HookError: a hook failed.
            RuntimeError: the run ended first.
        """
        if _get_ident() in hooking:  # in_hook_thread(), inlined
            self._refuse("wait_for")
        engine = self._engine
        hooks = engine.hooks
        if hooks._warnings:  # flush_warnings' own test, before its call
            hooks.flush_warnings(stacklevel=2)
        known = self._sources.get(id(port))
        if known is None or known[0] is not port:
            known = self._source_of(port)
        checked, source = known
        if predicate is not None and not callable(predicate):  # run.call-arguments
            raise TypeError(
                "predicate must be a callable taking the message and returning a bool, or None, "
                f"got {type(predicate).__name__}: {shown(predicate)}"
            )
        if timeout is None:
            until = None
        elif timeout.__class__ is float and 0.0 < timeout < _INF:  # _seconds' common case, at once
            until = engine.time() + timeout
        else:
            until = engine.time() + _seconds("timeout", timeout)
        if engine.policy.error is not None:
            engine.raise_error()
        undo = None if self._processes is None else self._watch(source)
        try:
            lender = engine.lender
            if lender is not None and not engine.virtual:
                # The update the host waits for may be due: run it before looking, while no
                # worker has begun it (NOTE [ the host lends its thread ]).
                lender.answer(hook_checked=True)
            published = source._latest  # source._peek(), inlined
            latest = None if published is None else published[0]
            if latest is not None:
                copy: M = cpu_copy(latest)
                if predicate is None or predicate(copy):
                    return copy
            return self._wait_for(
                checked, source=source, predicate=predicate, until=until, timeout=timeout, looked=latest
            )
        finally:
            if undo is not None:
                undo()

    def _source_of(self, port: object) -> tuple[_Port, _Port]:
        """``port``, checked (``_port``), and the port whose messages ``wait_for`` on it looks
        at; kept for the next wait (the net is fixed for the run)."""
        checked = self._port(port)
        source = checked.source if isinstance(checked, Input) and checked.source else checked
        known = (checked, source)
        self._sources[id(checked)] = known
        return known

    def _wait_for(
        self,
        checked: _Port,
        *,
        source: _Port,
        predicate: Callable[[M], bool] | None,
        until: float | None,
        timeout: float | None,
        looked: object,
    ) -> M:
        """``wait_for`` once the latest message (``looked``, None for none) did not match."""
        engine = self._engine
        found: list[M] = []
        checked_last = [looked]

        def matches(message: object) -> bool:
            if message is None or message is checked_last[0]:
                return False
            checked_last[0] = message
            copy: M = cpu_copy(message)
            if predicate is None or predicate(copy):
                found.append(copy)
                return True
            return False

        def latest_matches() -> bool:
            return bool(found) or matches(source._peek())

        if latest_matches():  # sent meanwhile (by a worker, or in a process watched)
            return found[0]
        self._live("wait_for")
        if engine.virtual:
            self._advance(until, latest_matches)
        else:
            arrived: list[object] = []

            def watcher(message: object) -> None:
                arrived.append(message)
                engine.notify_host()

            def done() -> bool:
                while arrived and not found:
                    matches(arrived.pop(0))
                return bool(found) or latest_matches()

            source._add_watcher(watcher)
            try:
                engine.wait_real(until, done)
            finally:
                source._remove_watcher(watcher)
        if found:
            return found[0]
        engine.raise_error()
        if engine.ended:
            raise RuntimeError(f"run.wait_for(): the run ended before {checked.name!r} matched")
        raise TimeoutError(f"no matching message on {checked.name!r} within {timeout} s")

    # -- time ------------------------------------------------------------------------------

    @property
    def time(self) -> float:
        """The run's timer time in seconds (frozen once the run has ended). See :ref:`run.time`."""
        return self._engine.time()

    @property
    def seed(self) -> int:
        """The run's seed, given to :func:`mujou.run` or chosen by it. See :ref:`threads.run-seed`.

        Every node made without ``seed=`` has its generator seeded from it and the node's
        name; giving it to a new run of the same net (``seed=run.seed``) seeds them again alike.
        """
        return self._seed

    @property
    def workers(self) -> int:
        """The number of worker threads of the run (of all its processes)."""
        if self._processes is not None:
            return self._engine.workers + sum(self._processes.group_workers.values())
        return self._engine.workers

    @property
    def running(self) -> bool:
        """Whether the run has not ended yet."""
        return not self._engine.ended

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of the run's timer; under the virtual timer, run them. See :ref:`run.sleep`.

        Raises:
            ValueError: ``seconds`` is negative or not finite.
            HookError: a hook failed.
            RuntimeError: the run has ended.
        """
        self._host_call("sleep")
        self._sleep_until(self.time + _seconds("seconds", seconds), stacklevel=3)

    def _sleep_until(self, until: float, *, stacklevel: int) -> None:
        """``sleep`` to the timer time ``until`` (mujou.testing's exact times: no rounding);
        warnings point ``stacklevel`` frames up."""
        self._live("sleep")
        if self._engine.virtual:
            self._advance(until, None)
        else:
            self._engine.wait_real(until, lambda: False, lend=self._lends_in_sleep())
        self._engine.hooks.flush_warnings(stacklevel=stacklevel)
        self._engine.raise_error()

    def _lends_in_sleep(self) -> bool:
        """Whether ``sleep`` and ``join`` run due updates on the host's thread: only while the
        host's writes wake no worker (threads.host-runs-updates), so that a host that only
        sleeps leaves a periodic net's updates to the workers, as the run's ``workers`` say."""
        lender = self._engine.lender
        return lender is not None and lender.defers

    def join(self, timeout: float | None = None) -> None:
        """Wait until the run ends: stopped from another thread, or a hook failed. See :ref:`run.join`.

        ``timeout`` is in timer seconds; under the virtual timer, time advances meanwhile.

        Raises:
            TimeoutError: the run did not end within ``timeout``.
            HookError: a hook failed.
        """
        self._host_call("join")
        engine = self._engine
        until = None if timeout is None else self.time + _seconds("timeout", timeout)
        if engine.virtual:
            self._advance(until, lambda: engine.ended)
        else:
            engine.wait_real(until, lambda: engine.ended, lend=self._lends_in_sleep())
        if engine.error is not None:
            engine.stop()
            engine.raise_error()
        if not engine.ended:
            raise TimeoutError(f"the run did not end within {timeout} s")

    # -- state and stopping ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The state tree of the whole run, taken between updates. See :ref:`state.tree-shape`.

        Works during the run and after it ended, also after a hook failed.
        """
        self._host_call("state_dict")
        tree = self._engine.state_tree() if self._processes is None else self._processes.state_tree()
        self._engine.hooks.flush_warnings(stacklevel=2)  # those of the nodes' state_dict
        return tree

    def stop(self) -> None:
        """Stop the run: wait for running hooks, run every ``on_stop``, end the threads.

        A second call does nothing more. See :ref:`run.stop`.

        Raises:
            HookError: a hook failed during the run (also on later calls).
        """
        self._host_call("stop")
        self._engine.stop()
        self._engine.hooks.flush_warnings(stacklevel=2)
        self._engine.raise_error()

    def stats(self) -> RunStats:
        """The run's counters: per node updates, skips, busy time, dt and lateness; per worker busy.

        See :ref:`observe.stats`.
        """
        if not in_hook_thread():
            self._engine.hooks.flush_warnings(stacklevel=2)
        stats = run_stats(self._engine) if self._processes is None else self._processes.stats()
        if self._recording is not None:
            stats = dataclasses.replace(stats, lost=self._recording.lost_count())
        return stats

    def snapshot(self, path: str | os.PathLike[str]) -> None:
        """Write the last seconds a snapshot recorder keeps to ``path``. See :ref:`record.snapshot`.

        Raises:
            RuntimeError: the run records with no snapshot recorder (``Recorder(snapshot=...)``).
            OSError: the file cannot be written.
        """
        self._host_call("snapshot")
        recording = self._recording
        if recording is None:
            raise RuntimeError(
                "run.snapshot(): this run is not recorded; "
                "use mujou.run(net, record=mujou.Recorder(snapshot=seconds))"
            )
        recording.recorder.snapshot(path)

    def _state_tree(self) -> dict[str, Any]:
        """The state tree, for a recording's keyframe (no host-call checks: any host thread)."""
        return self._engine.state_tree() if self._processes is None else self._processes.state_tree()

    def _progress_sample(self) -> tuple[float, int, float]:
        if self._processes is None:
            return progress_sample(self._engine)
        stats = self._processes.stats()
        nodes = stats.nodes.values()
        return stats.time, sum(n.updates for n in nodes), max((n.lateness_max for n in nodes), default=0.0)

    def __enter__(self) -> Run:
        """Enter the run's one ``with`` block; a second one raises. See :ref:`run.enter-once`."""
        entered = object()
        # setdefault is atomic: of two threads entering at once, one wins.
        if self.__dict__.setdefault("_entered", entered) is not entered:
            raise RuntimeError(
                "this run was already used in a with block; a Run is entered once, and "
                "leaving that block stops it: start a new run with mujou.run(net)"
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
            return
        # The exception leaving the block stays the one the host sees.
        with contextlib.suppress(HookError):
            self.stop()

    def __repr__(self) -> str:
        """``<mujou.Run of Robot: running, t=1.250 s, 2 workers, virtual timer>``; never raises.

        Reads a few fields without a lock: safe from any thread, in a hook, after the end.
        """
        try:
            engine = self._engine
            state = "ended" if engine.ended else "running"
            error = engine.error
            if isinstance(error, HookError):
                state += f", node {error.node!r} failed in {error.hook}"
            elif error is not None:
                state += f", failed ({type(error).__name__})"
            timer = "virtual" if engine.virtual else "real-time"
            count = self.workers
            workers = f"{count} worker{'' if count == 1 else 's'}"
            return (
                f"<mujou.Run of {type(self._net).__name__}: {state}, t={engine.time():.3f} s, "
                f"{workers}, {timer} timer>"
            )
        except Exception:  # not set up (made without mujou.run), or a field in flux
            return "<mujou.Run>"


def _seconds(name: str, value: object) -> float:
    return non_negative(name, value, optional=name == "timeout")  # run.number-arguments
