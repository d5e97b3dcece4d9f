"""One process of a run with processes: its engine, and what the host asks of it.

The host asks each member the same things, by a command in a child (``_child.py``) or by a
call for its own nodes: start, hand over and take the messages that cross, restore, go, and
under the virtual timer run one tag at a time (proc.virtual). Everything here is what one
process of the run does; the host's ``_host.py`` does the coordinating.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from .._engine import Engine
from .._engine._arrivals import arrived
from .._engine._collect import stopping_now
from .._engine._snapshot import run_stats
from .._errors import HookError
from .._messages import cpu_copy
from .._node import Node
from .._port import _Port
from .._ports import Input, Output
from .._stats import RunStats
from ._inbox import Inbox
from ._wire import NO_HOLDER, Crossing, Forwarders, Pipe, Standins, joined, split

# What a failure is, as it crosses to the host: a HookError's node, hook, time, the cause
# (pickled when it can be, else None), its type's name, its text and its traceback's text;
# or any other error's type name and text (and the error, pickled when it can be).
Failure = tuple[Any, ...]
# Real seconds the host waits for its receiver's threads after the processes exited: each ends
# as soon as it reads the end of its pipe, so only a machine stalled for that long waits it out.
RECEIVER_GRACE = 2.0


class Member:
    """One process's engine over its nodes, with its stand-ins and forwarders."""

    def __init__(
        self,
        engine: Engine,
        nodes: Sequence[Node],
        incoming: Mapping[str, Sequence[str]],
        outgoing: Sequence[str],
    ) -> None:
        self.engine = engine
        ports: dict[str, _Port] = {port.name: port for node in nodes for port in node._mujou.ports.values()}
        self.ports = ports
        self.standins = Standins(list(incoming))
        self.readers: dict[str, list[Input[Any]]] = {}
        for source, names in incoming.items():
            inputs = [ports[name] for name in names]
            assert all(isinstance(port, Input) for port in inputs)
            self.readers[source] = inputs  # type: ignore[assignment]  # checked just above
        outputs = {name: ports[name] for name in outgoing}
        assert all(isinstance(port, Output) for port in outputs.values())
        self.forwarders = Forwarders(outputs, engine.virtual)  # type: ignore[arg-type]  # checked
        self.receiver: Inbox | None = None
        self._pipes: list[Pipe] = []  # this process's ends of the wake pipes it writes
        self._members = {id(node) for node in nodes}
        self._lent = False  # the calling thread is lent to the instants for a span (``lend``)
        # One thread at most runs the worker updates of an instant: one worker, none dedicated.
        self._single = engine.policy.workers <= 1 and not engine.policy.dedicated
        self._saved_readers: list[tuple[Output[Any], list[Input[Any]]]] = []
        self._saved_sources: list[tuple[Input[Any], Output[Any] | None, Output[Any] | None]] = []
        # Extension points of mujou._hosts: this machine's monotonic clock minus the host's, and
        # what go starts and close ends beside the pipes (the data plane between machines).
        self.clock_offset = 0.0
        self.on_go: list[Callable[[], None]] = []
        self.on_close: list[Callable[[], None]] = []

    # -- starting --------------------------------------------------------------------------

    def connect_standins(self) -> None:
        """Make each input whose source is elsewhere read its stand-in, and each output
        forget its readers elsewhere, for the run (the host's nodes keep their links: an
        input's ``source`` is still the net's output; in a child, which has no node of the
        source, it is the stand-in)."""
        for output in self.forwarders.outputs.values():
            self._saved_readers.append((output, output._readers))
            output._readers = [reader for reader in output._readers if id(reader.node) in self._members]
        for source, inputs in self.readers.items():
            standin = self.standins.ports[source]
            for port in inputs:
                self._saved_sources.append((port, port._source, port._link))
                port._source = standin
                if port._link is None:
                    port._link = standin
                standin._readers.append(port)

    def disconnect_standins(self) -> None:
        """Give the inputs their own sources back (the host's nodes, after the run)."""
        for port, source, link in self._saved_sources:
            port._source, port._link = source, link
        self._saved_sources.clear()
        for output, readers in self._saved_readers:
            output._readers = readers
        self._saved_readers.clear()

    def crossings(self) -> list[Crossing]:
        """The latest message of each output read elsewhere (after on_start, for the readers)."""
        outputs = self.forwarders.outputs
        return [split(port, name) for name, port in outputs.items() if port._latest is not None]

    def apply(self, crossings: Sequence[Crossing], *, wake: bool = True) -> None:
        """Publish messages from other processes on the stand-ins, then wake their readers,
        as a commit does: after every publish (an on_all trigger sees all of them)."""
        engine = self.engine
        woken: list[_Port] = []
        for name, tensors, rest, stamp, number in crossings:
            standin = self.standins.ports.get(name)
            if standin is None:
                continue
            message, nest = joined(tensors, rest)
            self.standins.publish(None, name, message, nest, stamp=stamp, number=number)
            if wake and standin._wakes and standin not in woken:
                woken.append(standin)
        if woken:
            with engine.lock:
                now = engine.clock.now()
                for port in woken:
                    arrived(engine.policy, port, now)
                if engine.policy.wake:
                    engine.deliver()

    def restore_standins(self, saved: Mapping[str, Any]) -> None:
        """Set the stand-ins from a state tree's messages of their sources (before the fresh
        flags are restored, which are about them)."""
        self.standins.restart_numbers()
        for name, entry in saved.items():
            if entry is None or name not in self.standins.ports:
                continue
            message, stamp = entry
            from .._engine._restore import _placed

            placed, nest = _placed(message, lambda tensor: tensor.to("cpu", copy=True))
            self.standins.publish(None, name, placed, nest, stamp=stamp, number=0)
        self.standins.restart_numbers()

    def go(
        self, origin: float | None, pipes: Mapping[str, Sequence[Pipe]], inbound: Sequence[Connection]
    ) -> None:
        """Forward the messages that cross, receive the others (real-time), start the timer."""
        engine = self.engine
        self._pipes = list({id(pipe): pipe for found in pipes.values() for pipe in found}.values())
        for pipe in self._pipes:
            pipe.on_crash = lambda exc: engine.crashed(NO_HOLDER, exc, exits=False)
        self.forwarders.install({name: list(pipes.get(name, ())) for name in self.forwarders.outputs})
        if not self.engine.virtual and inbound:
            self.receiver = Inbox(self.engine, self.standins, inbound)
            self.receiver.start()
        for hook in self.on_go:
            hook()
        self.engine.go(None if origin is None else origin + self.clock_offset)

    # -- the virtual timer's tags ------------------------------------------------------------

    def next_due(self) -> float:
        """The due time of this process's next update (infinity for none, or when stopping)."""
        engine = self.engine
        with engine.lock:
            policy = engine.policy
            return math.inf if stopping_now(policy) else policy.next_due()

    def begin_advance(self) -> None:
        """A host call that runs tags begins: the microstep cap counts from here."""
        self.engine.call_microsteps = 0

    def lend(self) -> None:
        """Before a span of tags (proc.exchange), on the thread that runs them all: lend it to
        the instants of every tag of the span (``Lender.begin_instants``, its checks once), until
        ``unlend``, instead of once a tag (``Lender.begin_span``). Only a thread that runs
        nothing but Mujou's code and the updates it runs there may (the host's
        ``mujou-lockstep``)."""
        lender = self.engine.lender
        if lender is not None:
            with self.engine.lock:
                self._lent = lender.begin_span()

    def unlend(self) -> None:
        """The span's tags are over (or it failed): the thread is the host's again."""
        if self._lent:
            lender = self.engine.lender
            assert lender is not None
            with self.engine.lock:
                self._lent = False
                lender.end_instants()

    def instant(self, due: float) -> tuple[list[Crossing], Failure | None, float]:
        """Run the tag at ``due`` (every process runs each tag, most with nothing due) and
        commit it: the messages that cross, this process's failure if it stopped, and its
        next due time after it (``next_due``, read in the same lock section)."""
        engine = self.engine
        policy, clock = engine.policy, engine.clock
        outbox = self.forwarders.outbox
        outbox.clear()
        lender = engine.lender  # the host's process: the thread that runs the tag lends itself
        with engine.lock:
            lent = False  # for the whole span (``lend``)
            if self._lent and lender is not None:
                lent = self._lent = lender.span
                if not lent:  # a hook left this thread's settings changed: lent no more
                    lender.end_instants()
            lends = lent or (lender is not None and lender.begin_instants())
            try:
                if not policy.stopping:
                    alone = self._alone(lends)  # NOTE [ an instant run alone ] in _instants
                    engine._start_instant(due, alone=alone is not None)
                    if alone is None or not alone(clock.now()):

                        def done() -> bool:  # quiescent() is false while an update is held
                            return policy.stopping or (not policy.busy and policy.quiescent(clock.now()))

                        if lends and lender is not None:  # host_wait's, without its done() after
                            lender.lend_instants(done)  # returns once done(), the lock held
                        else:
                            engine.host_wait(done)
                if not policy.stopping:
                    engine._commit()
                    if policy.end_instant():
                        engine.deliver()
            finally:
                if lends and not lent:
                    assert lender is not None
                    lender.end_instants()
            after = math.inf if stopping_now(policy) else policy.next_due()
        crossed = list(outbox)
        outbox.clear()
        error = engine.error  # ``failure``'s, without its call: most tags have none
        return crossed, None if error is None else describe(error), after

    def _alone(self, lends: bool) -> Callable[[float], bool] | None:
        """With the lock held: the ``run_alone`` of the calling thread where it is the only one
        that runs the instant's worker updates (NOTE [ an instant run alone ] in
        ``_instants``): the host's thread lent to the instants (``lends``) or a process's
        command thread working as worker 0, with no other worker and no dedicated node."""
        if not self._single:
            return None
        engine = self.engine
        if lends:
            assert engine.lender is not None
            return engine.lender.run_alone
        worker = engine.lent
        return worker.run_alone if worker is not None and worker.here() else None

    def set_time(self, time: float) -> None:
        """Move the virtual clock to ``time`` (the host's advance ended there)."""
        with self.engine.lock:
            self.engine.clock.set(time)  # type: ignore[union-attr]  # a VirtualClock here

    # -- the host's calls ------------------------------------------------------------------

    def read(self, name: str) -> Any:
        message = self.ports[name]._message()
        return None if message is None else cpu_copy(message)

    def write(self, name: str, value: Any) -> None:
        port = self.ports[name]
        assert isinstance(port, Input)
        self.engine.host_write(port, port._host_snapshot(value, "run.write()"))  # as run.write checks it

    def latest(self, name: str) -> tuple[Any, float] | None:
        """The port's latest message (a CPU copy) and its stamp, for a mirror on the host."""
        port = self.ports[name]
        source = port._source if isinstance(port, Input) and port._source is not None else port
        latest = source._latest
        return None if latest is None else (cpu_copy(latest[0]), latest[3])

    def stats(self) -> RunStats:
        return run_stats(self.engine)

    def start(self, states: Sequence[Any] | None) -> list[tuple[str, BaseException]]:
        """The engine's start: on_start, then the loads of ``states`` (Engine.start)."""
        return self.engine.start(states)

    def stop(self) -> None:
        """Stop this process's nodes, then tear down what crosses (a child's ``stop``)."""
        engine = self.engine
        try:
            engine.abort() if not engine.threads_started else engine.stop()
        finally:
            self.close()

    def close(self, *, wait: bool = False) -> None:
        """The teardown of what crosses, after the engine stopped; idempotent.

        The forwarders go (the watchers on the outputs read elsewhere, and their rings), the
        receiver publishes nothing more, and this process's ends of the wake pipes close,
        taking back the ring descriptors no reader fetched (proc.cleanup). ``wait``: wait up
        to ``RECEIVER_GRACE`` for the receiver's threads to end, each once its sender's end
        closed, dropping the rings it read (the host, once the other processes exited).
        """
        self.forwarders.remove()
        if self.receiver is not None:
            self.receiver.close(RECEIVER_GRACE if wait else 0.0)
        for pipe in self._pipes:
            pipe.close()
        self._pipes = []
        for hook in self.on_close:
            hook()

    def failure(self) -> Failure | None:
        error = self.engine.error
        return None if error is None else describe(error)

    def when_ended(self, callback: Callable[[], None]) -> None:
        self.engine.add_waker(callback)


def describe(error: BaseException) -> Failure:
    """``error`` as it crosses to the host (see ``Failure``)."""
    import pickle

    cause = error.__cause__ if isinstance(error, HookError) else error
    assert cause is not None
    pickled: bytes | None
    try:
        pickled = pickle.dumps(cause)
        pickle.loads(pickled)  # an exception whose __init__ takes other arguments fails here
    except Exception:
        pickled = None
    text = "".join(traceback.format_exception(cause))
    if isinstance(error, HookError):
        return ("hook", error.node, error.hook, error.time, pickled, type(cause).__name__, str(error), text)
    return ("other", type(error).__name__, str(error), pickled, text)
