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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._errors import ProcessError
from .._net import Net
from .._node import Node
from .._port import _Port
from .._stats import RunStats
from .._trace import TraceRecorder
from ._gather import merge_stats, merge_trees
from ._group import Group, rebuild_failure
from ._lockstep import advance
from ._member import Member
from ._mirrors import Mirrors
from ._placement import HOST, Placement
from ._spawn import spawn
from ._wire import Crossing

_live: weakref.WeakSet[Processes] = weakref.WeakSet()


class Processes:
    """A run's processes, as the host coordinates them."""

    def __init__(
        self,
        net: Net,
        nodes: Sequence[Node],
        placement: Placement,
        host: Member,
        recorder: TraceRecorder | None,
    ) -> None:
        self.net = net
        self.recorder = recorder
        self._pids = {name: pid for pid, name in enumerate(placement.groups, start=2)}  # the host's: 1
        self.nodes = list(nodes)
        self.placement = placement
        self.host = host
        self.groups: dict[str, Group] = {}
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
        self.closed = False
        _live.add(self)

    # -- where things are ------------------------------------------------------------------

    def group_of(self, node: Node) -> Group | None:
        """The group of ``node``, None for the host's (or another net's) nodes."""
        name = self.placement.where.get(id(node))
        return None if name is None or name == HOST else self.groups[name]

    def has_node(self, node: Node) -> bool:
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
        self.receive_all(self.groups.values())  # each rebuilt its nodes, or failed
        for group in self.groups.values():
            group.start_reading()

    def receive_all(self, groups: Iterable[Group]) -> list[Any]:
        """Wait for the reply of each group, in turn; raise the first error after all replied."""
        replies: list[Any] = []
        first: BaseException | None = None
        for group in groups:
            try:
                replies.append(group.receive())
            except BaseException as exc:
                replies.append(None)
                if first is None:
                    first = exc
        if first is not None:
            raise first
        return replies

    def all(self, command: str, *args: Any) -> dict[str, Any]:
        """Send ``command`` to every group, then wait for every reply: the replies by group."""
        groups = list(self.groups.values())
        sent: list[Group] = []
        try:
            for group in groups:
                group.send(command, *args)
                sent.append(group)
        finally:
            replies = self.receive_all(sent)
        return dict(zip((g.name for g in sent), replies, strict=True))

    def start(self, states: Sequence[Any] | None) -> list[tuple[str, str]]:
        """Every process's on_start (at once), then the loads of ``states`` (one per node,
        in the net's order, or None), then the messages they sent that cross. Returns the
        loads' errors (node, text); raises the HookError of an on_start."""
        index = {id(node): i for i, node in enumerate(self.nodes)}

        def states_of(nodes: Sequence[Node]) -> list[Any] | None:
            return None if states is None else [states[index[id(node)]] for node in nodes]

        sent: list[Group] = []
        for name, group in self.groups.items():
            group.send("start", states_of(self.placement.groups[name]))
            sent.append(group)
        errors: list[tuple[str, str]] = []
        first: BaseException | None = None
        try:
            found = self.host.start(states_of(self.placement.host))
            errors += [(name, f"{type(exc).__name__}: {exc}") for name, exc in found]
        except BaseException as exc:
            first = exc
        try:
            for found_ in self.receive_all(sent):
                errors += found_
        except BaseException as exc:
            if first is None:
                first = exc
        if first is not None:
            raise first
        crossings = self.all("crossings")
        crossings[HOST] = self.host.crossings()
        self.deliver(crossings, wake=True)
        return errors

    def restore_schedule(self, meta: Mapping[str, Any]) -> None:
        ports = meta["ports"]
        for name, group in self.groups.items():
            standins = {source: ports.get(source) for source in self.placement.incoming[name]}
            group.call("restore_schedule", dict(meta), standins)
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
        sent: list[Group] = []
        for name, group in self.groups.items():
            found = incoming[name]
            if not found:
                continue
            waking = self.placement.waking[name]
            if defer is not None and not any(crossing[0] in waking for crossing in found):
                defer.setdefault(name, []).extend(found)
                continue
            group.send("apply", [*defer.pop(name, []), *found] if defer else found, wake)
            sent.append(group)
        if incoming[HOST]:
            self.host.apply(incoming[HOST], wake=wake)
        return dict(zip((group.name for group in sent), self.receive_all(sent), strict=True))

    def flush(self, deferred: dict[str, list[Crossing]]) -> None:
        """Hand each group the messages ``deliver`` deferred for it (they wake nothing there)."""
        sent: list[Group] = []
        for name, found in deferred.items():
            self.groups[name].send("apply", found, True)
            sent.append(self.groups[name])
        deferred.clear()
        self.receive_all(sent)

    def go(self) -> None:
        """Start every process's timer at one origin (the monotonic clock is the machine's)."""
        origin = None if self.host.engine.virtual else time.monotonic()
        self.all("go", origin)
        pipes = {
            output: [self.host_pipes[reader] for reader in readers]
            for output, readers in self.placement.outgoing[HOST].items()
        }
        self.host.go(origin, pipes, self.host_inbound)
        with self._fail_lock:
            self._running = True
            early = self._early
        if early is not None:  # a process failed between its last reply and the start
            self.fail(early)

    # -- the virtual timer -----------------------------------------------------------------

    def advance(self, until: float | None, done: Callable[[], bool] | None) -> bool:
        """Run the tags up to ``until`` in every process, one at a time (proc.virtual)."""
        return advance(self, until, done)

    # -- events ----------------------------------------------------------------------------

    def _on_event(self, group: Group, event: tuple[Any, ...]) -> None:
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
        elif kind == "died" and not group.closed:
            error = group.died()
            with self.tag_lock:
                self.fail(error)

    def fail(self, error: BaseException) -> None:
        """Stop the run for ``error`` of another process (the first error stands).

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
        self.stop_groups_soon()

    def stop_groups_soon(self) -> None:
        """Stop every group's nodes, from a thread of its own (called from event threads)."""
        threading.Thread(target=self._stop_groups, name="mujou-stop-processes", daemon=True).start()

    def _stop_groups(self) -> None:
        with self._stop_lock:
            if self._stopping:
                return
            self._stopping = True
        with contextlib.suppress(BaseException):  # a dead process: its error is the run's already
            self.all("stop")

    # -- what the host's calls need ----------------------------------------------------------

    def watch(self, port: _Port) -> Callable[[], None]:
        """Mirror another process's ``port`` onto the host's port object while watched
        (subscriptions, wait_for); returns the undo."""
        group = self.group_of(port.node)
        assert group is not None
        return self.mirrors.watch(group, port)

    def _ended(self, part: int) -> dict[str, Any]:
        """Part ``part`` of what each process left when the run ended; ProcessError for one
        that died (its state is lost: proc.died)."""
        for name, group in self.groups.items():
            if name not in self._final:
                raise ProcessError(name, group.process.exitcode, group.node_names)
        return {name: final[part] for name, final in self._final.items()}

    def read(self, port: _Port) -> Any:
        """The latest message of another process's ``port``, a CPU copy (run.read)."""
        group = self.group_of(port.node)
        assert group is not None
        if self.closed:
            return self._ended(2)[group.name][port.name]
        return group.call("read", port.name)

    def state_tree(self) -> dict[str, Any]:
        if self.closed:
            trees = self._ended(0)
            for name, tree in trees.items():
                if isinstance(tree, tuple):  # the error that taking it raised
                    raise rebuild_failure(tree, name)
        else:
            trees = self.all("state")
        trees[HOST] = self.host.engine.state_tree()
        return merge_trees(self.nodes, self.placement, trees, self.host.engine.time())

    def stats(self) -> RunStats:
        stats = self._ended(1) if self.closed else self.all("stats")
        stats[HOST] = self.host.stats()
        return merge_stats(self.nodes, self.placement, stats, self.host.engine.time())

    def stop(self) -> None:
        """Stop every process's nodes, then end the processes (proc.cleanup)."""
        with self._stop_lock:
            already = self._stopping
            self._stopping = True
        if not already:
            try:
                replies = self.all("stop")
            except ProcessError as exc:
                self.fail(exc)
                replies = {}
            for name, failure in replies.items():
                if failure is not None:
                    self.fail(rebuild_failure(failure, name))
        self.close()

    def close(self) -> None:
        """End the processes, keeping what the host's calls read after the end (their state
        tree, stats and latest messages: run.state-after-error)."""
        if self.closed:
            return
        self.closed = True
        for name, group in self.groups.items():
            if not group.dead:
                with contextlib.suppress(ProcessError):
                    self._final[name] = group.call("final")
            group.close()
        self.host.close(wait=True)  # the host's forwarders, receiver and wake pipes
        self.host.disconnect_standins()
        self.mirrors.give_back()
        _live.discard(self)


@atexit.register
def _close_live() -> None:
    """At interpreter exit: end the processes of runs left running (after their nodes stop)."""
    for processes in list(_live):
        with contextlib.suppress(BaseException):
            processes.stop()
