"""The host's side of a run with processes: coordinating them (spawning them: ``_spawn``).

``Processes`` holds the host's own ``Member`` and a ``Group`` for each other process, and does
what the run's calls need from all of them: the start in its phases, the virtual timer's tags
(proc.virtual, in ``_lockstep``), the state tree and stats (proc.state), the stop (proc.cleanup).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, Protocol

from .._errors import MujouWarning, ProcessError
from .._net import Net
from .._node import Node
from .._port import PortNode, _Port
from .._stats import RunStats
from .._trace import TraceRecorder
from ._gather import merge_stats, merge_trees
from ._group import EXIT_GRACE, ExitedError, Group, Reply, rebuild_failure
from ._member import Member
from ._mirrors import Mirrors
from ._placement import HOST, Placement
from ._spawn import spawn
from ._wire import Crossing, Pipe

_live: weakref.WeakSet[Processes] = weakref.WeakSet()


def each_result(waits: Mapping[str, Callable[[], Any]], first: BaseException | None = None) -> dict[str, Any]:
    """Call every wait, whatever another's gave; the results by group. Then raise ``first``,
    else the first error in the groups' order (None stands in its result meanwhile).

    An interrupt leaves at once: the waits still to call are dropped.
    """
    results: dict[str, Any] = {}
    for name, wait in waits.items():
        try:
            results[name] = wait()
        except Exception as exc:  # a reply's error; an interrupt leaves at once
            results[name] = None
            if first is None:
                first = exc
    if first is not None:
        raise first
    return results


class Stepper(Protocol):
    """The virtual timer's tags over the processes (``_lockstep.Lockstep``)."""

    def advance(self, until: float | None, done: Callable[[], bool] | None) -> bool: ...

    def finish_last(self) -> None: ...

    def close(self) -> None: ...


class Processes:
    """A run's processes, as the host coordinates them."""

    def __init__(
        self,
        net: Net,
        nodes: Sequence[Node],
        placement: Placement,
        host: Member,
        recorder: TraceRecorder | None,
        *,
        lockstep: Callable[[Processes], Stepper],
    ) -> None:
        """``lockstep`` makes the tags' runner once the processes are spawned (``_lockstep``:
        it takes this module's class)."""
        self.net = net
        self._lockstep = lockstep
        self.lockstep: Stepper | None = None
        self.recorder = recorder
        self._pids = {name: pid for pid, name in enumerate(placement.groups, start=2)}  # the host's: 1
        self.nodes = list(nodes)
        self.placement = placement
        self.host = host
        self.groups: dict[str, Group] = {}
        # The host's ends of the wake pipes (spawn), its Member's from go on: until then, a
        # start that fails closes them here (proc.cleanup).
        self.host_pipes: dict[str, Pipe] = {}
        self.host_inbound: list[Connection] = []
        self._handed = False
        self.mirrors = Mirrors()
        self._stopping = False
        self._running = False  # the timers started (go): a failure stops the run from then on
        self._early: BaseException | None = None
        self._fail_lock = threading.Lock()
        # Held while the host runs its part of a virtual tag: a death noticed meanwhile stops the
        # host's engine only after it, so that every process finishes the tag (proc.died).
        self.tag_lock = threading.Lock()
        self._final: dict[str, tuple[Any, RunStats, dict[str, Any]]] = {}  # by group, once ended
        self._stop_lock = threading.Lock()
        self._stopper: threading.Thread | None = None  # the thread of stop_soon
        self.advancing = False  # the virtual lockstep runs (advance)
        self._close_lock = threading.Lock()  # held by the one thread ending the processes
        self._stop_failures: dict[str, Any] = {}  # what ending them found: the run's error
        self._lost: dict[str, ProcessError] = {}  # the groups killed at the end
        self.closed = False
        _live.add(self)

    # -- where things are ------------------------------------------------------------------

    def group_of(self, node: PortNode) -> Group | None:
        """The group of ``node``, None for the host's (or another net's) nodes."""
        name = self.placement.where.get(id(node))
        return None if name is None or name == HOST else self.groups[name]

    def has_node(self, node: PortNode) -> bool:
        return id(node) in self.placement.where

    # -- starting --------------------------------------------------------------------------

    def spawn(self, workers: Mapping[str, int], virtual: bool, scale: float) -> None:
        """Start each group's process, with its nodes and its ends of the wake pipes; wait
        until each has rebuilt its nodes."""
        self.group_workers = {name: workers[name] for name in self.placement.groups}
        spawned = spawn(
            self.placement,
            workers,
            virtual=virtual,
            scale=scale,
            trace=self.recorder is not None,
            on_event=self._on_event,
            on_warning=self.host.engine.hooks.queue_warning,
        )
        self.groups, self.host_pipes, self.host_inbound = spawned
        self.lockstep = self._lockstep(self)
        self.gather({name: group.built for name, group in self.groups.items()})  # or why not

    # -- the fan-out -----------------------------------------------------------------------

    def send_each(self, commands: Mapping[str, tuple[Any, ...]]) -> dict[str, Reply]:
        """Send each group named in ``commands`` its command (``(command, *args)``), to every
        one of them whatever another's send found (a dead process's reply is its error)."""
        return {name: self.groups[name].request(*command) for name, command in commands.items()}

    def gather(self, replies: Mapping[str, Reply], first: BaseException | None = None) -> dict[str, Any]:
        """Wait for every reply, whatever another's was; the payloads by group. Then raise
        ``first`` (the host's own error), else the first error in the groups' order.

        An interrupt of the host's wait leaves at once: the replies still to come are dropped.
        """
        groups = self.groups
        return each_result(
            {name: partial(groups[name].wait, reply) for name, reply in replies.items()}, first
        )

    def all(self, command: str, *args: Any) -> dict[str, Any]:
        """Send ``command`` to every group, then wait for every reply: the replies by group."""
        return self.gather(self.send_each({name: (command, *args) for name in self.groups}))

    def start(self, states: Sequence[Any] | None) -> list[tuple[str, str]]:
        """Every process's on_start (at once), then the loads of ``states`` (one per node,
        in the net's order, or None), then the messages they sent that cross. Returns the
        loads' errors (node, text); raises the HookError of an on_start."""
        index = {id(node): i for i, node in enumerate(self.nodes)}

        def states_of(nodes: Sequence[Node]) -> list[Any] | None:
            return None if states is None else [states[index[id(node)]] for node in nodes]

        sent = self.send_each(
            {name: ("start", states_of(nodes)) for name, nodes in self.placement.groups.items()}
        )
        errors: list[tuple[str, str]] = []
        first: BaseException | None = None
        try:
            found = self.host.start(states_of(self.placement.host))
            errors += [(name, f"{type(exc).__name__}: {exc}") for name, exc in found]
        except Exception as exc:  # an interrupt leaves at once
            first = exc
        for found_ in self.gather(sent, first).values():
            errors += found_
        crossings = self.all("crossings")
        crossings[HOST] = self.host.crossings()
        self.deliver(crossings, wake=True)
        return errors

    def restore_schedule(self, meta: Mapping[str, Any]) -> None:
        ports = meta["ports"]
        self.gather(
            self.send_each(
                {
                    name: (
                        "restore_schedule",
                        dict(meta),
                        {s: ports.get(s) for s in self.placement.incoming[name]},
                    )
                    for name in self.groups
                }
            )
        )
        self.host.restore_standins({source: ports.get(source) for source in self.placement.incoming[HOST]})
        self.host.engine.restore_schedule(meta)

    def deliver(
        self,
        crossings: Mapping[str, Sequence[Crossing]],
        *,
        wake: bool,
        defer: dict[str, list[Crossing]] | None = None,
    ) -> dict[str, float]:
        """Hand each process the messages of the others that its inputs read; the next due
        time of each group that got some and was sent them now.

        With ``defer`` (the virtual timer's tags), a group's messages that wake no triggered
        node there, so that its next due time stays, go into ``defer`` instead: the group's
        next command takes them (``_lockstep``), which saves a command per tag.
        """
        incoming: dict[str, list[Crossing]] = {name: [] for name in (HOST, *self.groups)}
        outgoing = self.placement.outgoing
        for writer, found in crossings.items():
            for crossing in found:
                for reader in outgoing[writer].get(crossing[0], ()):
                    incoming[reader].append(crossing)
        commands: dict[str, tuple[Any, ...]] = {}
        for name in self.groups:
            found = incoming[name]
            if not found:
                continue
            waking = self.placement.waking[name]
            if defer is not None and not any(crossing[0] in waking for crossing in found):
                defer.setdefault(name, []).extend(found)
                continue
            commands[name] = ("apply", [*defer.pop(name, []), *found] if defer else found, wake)
        sent = self.send_each(commands)
        first: BaseException | None = None
        if incoming[HOST]:
            try:
                self.host.apply(incoming[HOST], wake=wake)
            except Exception as exc:  # an interrupt leaves at once
                first = exc
        return self.gather(sent, first)

    def go(self) -> None:
        """Start every process's timer at one origin (the monotonic clock is the machine's)."""
        origin = None if self.host.engine.virtual else time.monotonic()
        self.all("go", origin)
        pipes = {
            output: [self.host_pipes[reader] for reader in readers if reader in self.host_pipes]
            for output, readers in self.placement.outgoing[HOST].items()
        }
        self._handed = True
        self.host.go(origin, pipes, self.host_inbound)
        with self._fail_lock:
            self._running = True
            early = self._early
        # However the host's engine ends (a hook's error, a stop), the processes end then too.
        self.host.engine.add_waker(self._engine_ended)
        if early is not None:  # a process failed between its last reply and the start
            self.fail(early)

    # -- the virtual timer -----------------------------------------------------------------

    def advance(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        """Run the tags up to ``until`` in every process, one at a time (proc.virtual)."""
        assert self.lockstep is not None
        return self.lockstep.advance(until, done)

    def _engine_ended(self) -> None:
        """The host's engine ended (a hook's error, a stop): the processes end too. Not from
        here while the virtual lockstep runs: it ends them itself, once the last tag's
        messages are out (``_lockstep``), which a stop from another thread could overtake,
        taking a process's final state before they reached it (proc.virtual)."""
        if not self.advancing:
            self.stop_soon()

    # -- events ----------------------------------------------------------------------------

    def _on_event(self, group: Group, event: tuple[Any, ...]) -> None:
        """An event of ``group``'s process, on its reader (``Group``'s docstring); ``lost`` on
        the thread of a host call that found the process dead."""
        kind = event[0]
        if kind == "trace":
            _, thread, slices = event
            if self.recorder is not None:
                self.recorder.record_remote(self._pids[group.name], group.name, thread, slices)
        elif kind == "message":
            _, key, message, stamp = event
            self.mirrors.publish(key, message, stamp)
        elif kind == "ended":
            failure = event[1]
            # Under the virtual timer a process fails only in a command, whose reply says so:
            # the tag's end stops the run then (_lockstep), in every process at one tag.
            # Stopping the host's engine from here could cut its updates of the tag short.
            if failure is not None and not self.host.engine.virtual:
                self.fail(rebuild_failure(failure, group.name))
        elif kind == "unsent":
            _, what, text = event
            self.host.engine.hooks.queue_warning(
                MujouWarning, f"process {group.name!r} could not send a {what!r} event to the host: {text}"
            )
        elif kind == "died":
            with self.tag_lock:
                self.fail(group.error())
        elif kind == "lost":
            self.settle(event[1])
        elif kind == "crashed":
            self.crashed(event[1])

    def crashed(self, exc: BaseException) -> None:
        """A helper thread of the processes hit ``exc`` in Mujou's code: the run stops with
        MujouInternalError (the engine's crash path, for a thread that holds no node)."""
        engine = self.host.engine
        engine.crashed(engine.policy.state_holder + 1, exc, exits=False)
        with self._fail_lock:
            running = self._running
            if not running and self._early is None:
                self._early = engine.error
        if running:
            self.stop_soon()

    def fail(self, error: BaseException) -> None:
        """Stop the run for ``error`` of another process (the first error stands), and every
        process at once (proc.died).

        Before the timers start, the start itself reports a failure (a command's reply, or the
        death of the process it waits for) and undoes what started: the error is kept for
        ``go`` then, and the host's engine, which may be running its nodes' on_start, is left
        alone.
        """
        with self._fail_lock:
            if not self._running:
                if self._early is None:
                    self._early = error
                return
        engine = self.host.engine
        with engine.lock:
            engine.policy.abort(error)
            engine.deliver()
        self.stop_soon()

    def settle(self, error: BaseException) -> None:
        """A host call found a process dead (``error``): before it raises, the run has ended
        and every process has exited (proc.died, proc.cleanup). Nothing to do before the
        timers start: the start undoes itself."""
        with self._fail_lock:
            if not self._running:
                return
        self.fail(error)
        self.stop()
        engine = self.host.engine
        with engine.lock:
            engine.host_wait(lambda: engine.ended)

    def stop_soon(self) -> None:
        """End every process (``stop``) from a thread of its own (from event threads, and
        when the host's engine ends)."""
        with self._stop_lock:
            if self._stopper is not None:
                return
            self._stopper = threading.Thread(
                target=self._stop_guarded, name="mujou-stop-processes", daemon=True
            )
        self._stopper.start()

    def _stop_guarded(self) -> None:
        try:
            self.stop()
        except BaseException as exc:
            self.crashed(exc)
            self._kill_all()

    # -- what the host's calls need ----------------------------------------------------------

    def watch(self, port: _Port) -> Callable[[], None]:
        """Mirror another process's ``port`` onto the host's port object while watched
        (subscriptions, wait_for); returns the undo."""
        group = self.group_of(port.node)
        assert group is not None
        return self.mirrors.watch(group, port)

    def _ended(self, part: int) -> dict[str, Any]:
        """Part ``part`` of what each process left when the run ended; ProcessError for one
        that died or was killed (its state is lost: proc.died)."""
        for name, group in self.groups.items():
            if name not in self._final:
                raise self._lost.get(name) or group.error()
        return {name: final[part] for name, final in self._final.items()}

    def _live_call(self, call: Callable[[], Any]) -> Any | None:
        """``call()`` while the processes run; None once they ended or end meanwhile (the
        caller reads what they left then)."""
        if self._stopping or self.closed:
            self.stop()  # wait for the end under way (or finish one an interrupt cut)
            return None
        if self.lockstep is not None:
            self.lockstep.finish_last()  # the tags of an interrupted call: all of their last one
        try:
            return call()
        except ExitedError:  # the run ended meanwhile
            self.stop()
            return None

    def read(self, port: _Port) -> Any:
        """The latest message of another process's ``port``, a CPU copy (run.read)."""
        group = self.group_of(port.node)
        assert group is not None
        found = self._live_call(lambda: (group.call("read", port.name),))
        return self._ended(2)[group.name][port.name] if found is None else found[0]

    def state_tree(self) -> dict[str, Any]:
        trees = self._live_call(lambda: self.all("state"))
        if trees is None:
            trees = self._ended(0)
            for name, tree in trees.items():
                if isinstance(tree, tuple):  # the error that taking it raised
                    raise rebuild_failure(tree, name)
        trees[HOST] = self.host.engine.state_tree()
        return merge_trees(self.nodes, self.placement, trees, self.host.engine.time())

    def stats(self) -> RunStats:
        stats = self._live_call(lambda: self.all("stats"))
        if stats is None:
            stats = self._ended(1)
        stats[HOST] = self.host.stats()
        remote: dict[str, tuple[str, float]] = {}  # the groups on other hosts (hosts.stats)
        nccl: dict[str, int] = {}  # the messages each process received by NCCL (mujou._hosts._nccl)
        for name, group in self.groups.items():
            if name in self.placement.hosts:
                process: Any = group.process  # a RemoteProcess of mujou._hosts._remote
                remote[name] = (process.host, process.clock_offset)
                plane = getattr(self.placement.hosts[name], "plane", None)  # a _prepare.Bound's
                if plane is not None and not nccl:
                    nccl = plane.nccl_received()
        return merge_stats(self.nodes, self.placement, stats, self.host.engine.time(), remote, nccl=nccl)

    # -- the end (proc.cleanup) --------------------------------------------------------------

    def stop(self) -> None:
        """End the processes: stop every one's nodes, keep what the host reads after the end,
        let each exit, kill what does not within ``EXIT_GRACE`` (proc.cleanup).

        Every path that ends the run comes here: ``run.stop()``, a failed start, a death, a
        hook's error, an interrupt left the block, the interpreter's exit. Safe from several
        threads at once and again (the later wait for the first); every wait bounded.
        """
        with self._stop_lock:
            self._stopping = True
        while not self._close_lock.acquire(timeout=self.host.engine.poll):  # an interrupt is seen
            pass
        try:
            if not self.closed:
                try:
                    self._end_groups()
                except BaseException:  # interrupted, or a bug: still, no process is left behind
                    self._kill_all()
                    raise
                finally:
                    self.host.close(wait=True)  # the host's forwarders, receiver and wake pipes
                    self._close_unhanded()
                    self.host.disconnect_standins()
                    self.mirrors.give_back()
                    if self.lockstep is not None:
                        self.lockstep.close()
                    self._release_nodes()
                    self.closed = True
                    _live.discard(self)
                for name, failure in self._stop_failures.items():  # the run's error, if first
                    self.fail(rebuild_failure(failure, name) if isinstance(failure, tuple) else failure)
        finally:
            self._close_lock.release()

    close = stop

    def _end_groups(self) -> None:
        """Each step for every group at once: stop (the nodes' on_stop), final (what is
        read after the end), exit; a group that does not answer a step in ``EXIT_GRACE`` is
        killed, and its state is lost."""
        groups = self.groups
        stops = {name: group.stop_reply() for name, group in groups.items()}
        answered = self._bounded(stops)
        for name in answered:
            try:
                failure = stops[name].result()
            except (ExitedError, ProcessError):
                continue
            except Exception as exc:
                self._stop_failures.setdefault(name, exc)
                continue
            if failure is not None:
                self._stop_failures.setdefault(name, failure)
        finals = {name: groups[name].request("final") for name in answered if not groups[name].ended.is_set()}
        for name in self._bounded(finals):
            with contextlib.suppress(Exception):
                self._final[name] = finals[name].result()
        killed = [name for name, group in groups.items() if name not in answered and not group.ended.is_set()]
        for name in killed:
            groups[name].kill()
        for group in groups.values():
            group.ask_to_exit()
        deadline = time.monotonic() + EXIT_GRACE
        for group in groups.values():
            group.end(deadline)
        for name in killed:
            error = groups[name].error(f"did not stop within {EXIT_GRACE:g} s and was killed")
            self._lost[name] = error
            self._stop_failures.setdefault(name, error)

    def _release_nodes(self) -> None:
        """The nodes of the processes are in no run any more (run.one-run-per-net): a net whose
        run ended may run again at once, as in one process, where the end frees the nodes."""
        engine = self.host.engine
        for nodes in self.placement.groups.values():
            for node in nodes:
                if node._mujou.engine is engine:
                    node._mujou.engine = None

    def _close_unhanded(self) -> None:
        """Close the host's ends of the wake pipes that its Member never took (the start
        failed before ``go``), and under the virtual timer the inbound ends, which no
        receiver reads there."""
        if not self._handed:
            for pipe in self.host_pipes.values():
                pipe.close()
        if not self._handed or self.host.engine.virtual:
            for connection in self.host_inbound:
                connection.close()

    def _bounded(self, replies: Mapping[str, Reply]) -> list[str]:
        """Wait for ``replies`` at most ``EXIT_GRACE`` (all together): the groups that answered."""
        deadline = time.monotonic() + EXIT_GRACE
        for reply in replies.values():
            while not reply.wait(min(self.host.engine.poll, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break
        return [name for name, reply in replies.items() if reply.done()]

    def _kill_all(self) -> None:
        """The last resort of an end that failed: no process is left behind."""
        for group in self.groups.values():
            with contextlib.suppress(BaseException):
                group.kill()
        for group in self.groups.values():
            with contextlib.suppress(BaseException):
                group.end(time.monotonic())


@atexit.register
def _close_live() -> None:
    """At interpreter exit: end the processes of runs left running (every wait is bounded)."""
    for processes in list(_live):
        try:
            processes.stop()
        except BaseException:
            processes._kill_all()
