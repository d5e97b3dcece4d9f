"""``mujou.run(net, processes=...)``: the start of a net over several processes, undone if it fails.

``mujou.run`` has checked the net and the arguments; here the nodes are placed, the processes
spawned and started in the phases of a single-process start (run.start): every on_start, the
restore of ``state``, the first messages of ``inputs``, then the timers at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._engine import Engine
from .._engine._restore import check_schedule
from .._engine._slot import Slot
from .._errors import ProcessError
from .._messages import Nest
from .._net import Net
from .._node import Node
from .._port import forget_messages
from .._ports import Input
from .._record._replay import Replay
from .._seeds import seed_nodes
from .._state import cpu_copy
from .._timer import RealTimeTimer, Timer
from .._trace import TraceRecorder
from .._tree import check_tree, mismatch_message
from ._host import Processes
from ._lockstep import Lockstep
from ._main_script import GUARD_EXIT
from ._member import Member
from ._placement import HOST, Placement


def check_state(nodes: Sequence[Node], state: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The tree matched with the whole net, as one process would check it (state.mismatch)."""
    slots = [Slot(node, node._mujou, i) for i, node in enumerate(nodes)]
    problems, restore, meta = check_tree(slots, state)
    if not problems:
        problems = check_schedule(slots, meta)
    if problems:
        raise ValueError(mismatch_message(problems))
    return restore, meta


def start(
    net: Net,
    nodes: Sequence[Node],
    placement: Placement,
    *,
    workers: Mapping[str, int],
    timer: Timer,
    first: Mapping[Input[Any], tuple[Any, Nest | None]],
    state: Mapping[str, Any] | None,
    recorder: TraceRecorder | None,
    seed: int,
    replay: Replay | None = None,
    record: Callable[[Engine, Processes], Callable[[], None]] | None = None,
) -> tuple[Engine, Processes]:
    """Start the run's processes and the host's engine; on any failure, nothing is left.

    ``record`` begins the run's recording once the processes are spawned, before any on_start
    (after the restore of ``state``: record.processes); it returns what removes the recording
    if the start fails after it.
    """
    restore, meta = (None, {}) if state is None else check_state(nodes, state)
    try:
        engine = Engine(placement.host, workers[HOST], timer, recorder)
        if replay is not None:  # its nodes are the host's (replay.processes)
            replay._install(engine, state)
        engine.claim()
    except BaseException:
        if recorder is not None:
            recorder.discard()
        raise
    member = Member(engine, placement.host, placement.incoming[HOST], list(placement.outgoing[HOST]))
    member.connect_standins()
    if placement.hosts:  # groups on other hosts: their data plane here (mujou._hosts)
        from .._hosts._prepare import prepare_hosts

        prepare_hosts(placement, member, virtual=engine.virtual)
    processes = Processes(net, nodes, placement, member, recorder, lockstep=Lockstep)
    remote = [node for nodes_ in placement.groups.values() for node in nodes_]
    discard: Callable[[], None] | None = None
    try:
        _claim(remote, engine)
        forget_messages(nodes)
        seed_nodes(nodes, seed)  # before the nodes are packed: each process gets their generators
        processes.spawn(workers, virtual=engine.virtual, scale=_scale(timer))
        if record is not None and restore is None:
            discard = record(engine, processes)
        if restore is None:
            processes.start(None)
        else:
            errors = processes.start(restore)
            if errors:
                problems = [f"node {name!r}: {text}" for name, text in errors]
                raise ValueError(mismatch_message(problems))
            processes.restore_schedule(meta)
            if record is not None:
                # After the restore: the saved messages it publishes are no messages of this
                # run, and another process's reach the host on a connection of their own.
                discard = record(engine, processes)
        for port, message in first.items():
            group = processes.group_of(port.node)
            if group is None:
                engine.host_write(port, message)
            else:
                group.call("write", port.name, cpu_copy(message[0]))
        processes.go()
    except BaseException as exc:
        try:
            processes.stop()
        finally:
            if discard is not None:
                discard()
            started = engine.threads_started
            engine.abort()
            _unclaim(remote, engine)
            if recorder is not None and not started:  # no hook ran: no trace, no file left
                recorder.discard()
        if isinstance(exc, ProcessError) and exc.exitcode == GUARD_EXIT:
            # The user's mistake, not Mujou's: the traceback from mujou.run, not its inside.
            raise exc.with_traceback(None) from None
        raise

    def finish() -> None:
        try:
            processes.stop()
        finally:
            _unclaim(remote, engine)

    engine.finishers.insert(0, finish)  # before the trace is completed: the processes' last slices
    return engine, processes


def _scale(timer: Timer) -> float:
    return timer.scale if isinstance(timer, RealTimeTimer) else 1.0


def _claim(nodes: Sequence[Node], engine: Engine) -> None:
    """Mark the host's objects of the placed nodes as in this run (run.one-run-per-net)."""
    for node in nodes:
        if node._mujou.engine is not None:
            raise RuntimeError(f"node {node.name!r} is in a run that has not ended; stop that run first")
    for node in nodes:
        node._mujou.engine = engine


def _unclaim(nodes: Sequence[Node], engine: Engine) -> None:
    for node in nodes:
        if node._mujou.engine is engine:
            node._mujou.engine = None
