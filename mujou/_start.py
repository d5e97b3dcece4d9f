"""``mujou.run``: the checks of its arguments, then the start of a net, undone if it fails.

Everything that can be refused is refused before a node starts (run.arguments, state.mismatch,
run.start-undone). See the "Running a net" page of the spec.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ._cpus import default_workers, gil_enabled, physical_cores, usable_cpus
from ._engine import Engine
from ._errors import OversubscriptionWarning
from ._messages import Nest
from ._net import Net
from ._node import Node
from ._port import _Port, forget_messages
from ._ports import Input, Output
from ._processes._main_script import refuse_in_import
from ._processes._placement import HOST, Placement, check_processes
from ._processes._start import start as start_processes
from ._progress import Progress
from ._record import _recorder as _recording
from ._record._replay import Replay
from ._run import Run, _host_message
from ._seeds import run_seed, seed_nodes
from ._timer import RealTimeTimer, Timer
from ._trace import TraceRecorder
from ._tree import mismatch_message
from ._trigger import trigger_cycle

if TYPE_CHECKING:
    from ._processes._host import Processes


def run(
    net: Net,
    *,
    workers: int | None = None,
    timer: Timer | None = None,
    inputs: Mapping[Input[Any], Any] | None = None,
    state: Mapping[str, Any] | None = None,
    trace: str | os.PathLike[str] | None = None,
    progress: bool = False,
    processes: Mapping[str, object] | None = None,
    seed: int | None = None,
    record: object = None,
    replay: Replay | None = None,
) -> Run:
    """Start ``net`` and return its :class:`Run`; use it as a context manager.

    Every ``on_start`` hook, then the restore of ``state``, then the first messages of
    ``inputs`` complete before the timer starts and before this returns. See :ref:`run.start`.

    Args:
        net: The net to run.
        workers: The number of worker threads; None chooses from the usable CPUs
            (see :ref:`threads.default-workers`).
        timer: :class:`RealTimeTimer` (the default) or :class:`VirtualTimer`.
        inputs: First messages of inputs the host feeds (inputs without a source).
        state: A state tree from :meth:`Run.state_dict` (or :func:`mujou.load`) to resume.
        trace: A file to write a Chrome/Perfetto trace of the run to when it ends
            (see :ref:`observe.trace`); it is created (as a temporary file beside it) now.
        progress: Print a live progress line to stderr (see :ref:`observe.progress`).
        processes: Groups of nodes that run in processes of their own, by name: each a node,
            a net or node container, or a list or tuple of those (see :ref:`proc.placement`).
        seed: The run's seed, an int in ``[0, 2**64)``: each node made without ``seed=`` has
            its generator seeded from it and its name. None: 0 under the virtual timer, fresh
            entropy under the real-time timer (see :ref:`threads.run-seed`); ``run.seed`` tells.
        record: A :class:`Recorder`, or a file path (every output recorded to it), to write
            the run's messages to an MCAP file as it goes (see :ref:`record.recorder`).
        replay: Nodes of the net replaced by their recording (see :ref:`replay.replaced`);
            with ``Replay(start=...)`` the run starts from the recording's keyframe.

    Raises:
        TypeError, ValueError: an argument is not allowed; nothing was started.
        OSError: the ``trace`` or ``record`` file cannot be written; nothing was started.
        RuntimeError: a node of the net is in a run that has not ended.
        HookError: an ``on_start`` hook raised; the started nodes were stopped.
    """
    refuse_in_import()  # proc.main-guard
    if not isinstance(net, Net):
        raise TypeError(f"net must be a mujou.Net, got {type(net).__name__}: {net!r}")
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise TypeError(
                f"workers must be a positive int or None, got {type(workers).__name__}: {workers!r}"
            )
        if workers < 1:
            raise ValueError(f"workers must be a positive int or None, got {workers!r}")
    if timer is None:
        timer = RealTimeTimer()
    elif not isinstance(timer, Timer):
        raise TypeError(
            "timer must be mujou.RealTimeTimer() or mujou.VirtualTimer(), "
            f"got {type(timer).__name__}: {timer!r}"
        )
    if seed is None and isinstance(replay, Replay):
        seed = replay._recorded_seed()  # replay.seed: the recorded run's, unless told otherwise
    chosen_seed = run_seed(seed, timer)
    nodes = list(net.nodes())
    _check_net(net, nodes)
    _check_cycles(nodes)
    if isinstance(replay, Replay):
        inputs = replay._inputs_at_start(nodes, inputs)  # replay.writes: the recorded inputs=
    first = _check_inputs(nodes, inputs)
    placement = None if processes is None else check_processes(nodes, processes)
    if placement is not None and not placement.groups:
        placement = None  # processes={}: every node in the host's process
    if trace is not None and not isinstance(trace, str | os.PathLike):
        raise TypeError(f"trace must be a file path or None, got {type(trace).__name__}: {trace!r}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}: {progress!r}")
    if replay is not None:
        if not isinstance(replay, Replay):
            raise TypeError(f"replay must be a mujou.Replay or None, got {type(replay).__name__}: {replay!r}")
        replay._check(nodes, timer.virtual, placement)
        state = replay._state(state)  # replay.start
    recording = None
    wanted = None if record is None else _recording.recorder_of(record)
    if placement is not None:
        counts = _process_workers(placement, workers)
        _warn_oversubscription(
            {
                name: (count, sum(1 for node in placement.nodes_of(name) if node.dedicated_thread))
                for name, count in counts.items()
            }
        )
        recorder = None if trace is None else TraceRecorder(trace)  # observe.trace-start
        began: list[_recording.Session] = []
        begin: Callable[[Engine, Processes], Callable[[], None]] | None = None
        if wanted is not None:
            _recording.check_outputs(wanted, nodes)  # refused before anything starts
            begin = functools.partial(
                _begin_recording,
                began,
                wanted,
                net=net,
                nodes=nodes,
                workers=sum(counts.values()),
                seed=chosen_seed,
            )
        engine, group = start_processes(
            net,
            nodes,
            placement,
            workers=counts,
            timer=timer,
            first=first,
            state=state,
            recorder=recorder,
            seed=chosen_seed,
            replay=replay,
            record=begin,
        )
        recording = began[0] if began else None
        handle = Run.__new__(Run)
        handle._setup(net, engine, group, recording)
        handle._seed = chosen_seed
        if recording is not None:
            recording.started(handle)
        if progress:
            engine.finishers.append(Progress(handle._progress_sample).finish)
        return handle
    on_workers = sum(1 for node in nodes if not node.dedicated_thread)
    if workers is None:
        workers = default_workers(on_workers, cpus=usable_cpus(), gil=gil_enabled())
    _warn_oversubscription({HOST: (workers, len(nodes) - on_workers)})
    recorder = None if trace is None else TraceRecorder(trace)  # creates the file (observe.trace-start)
    try:
        engine = Engine(nodes, workers, timer, recorder)
        if replay is not None:
            replay._install(engine, state)
        restore: list[Any] | None = None
        meta: dict[str, Any] = {}
        if state is not None:
            problems, restore, meta = engine.check_state(state)
            if problems:
                raise ValueError(mismatch_message(problems))
        if wanted is not None:
            recording = _recording.Session(
                wanted, net, nodes, engine, workers, seed=chosen_seed
            )  # opens the file
        engine.claim()
        forget_messages(nodes)
        seed_nodes(nodes, chosen_seed)  # the run owns the nodes now, and no hook has run
    except BaseException:
        if recorder is not None:  # refused before any hook ran: no trace, no file left
            recorder.discard()
        if recording is not None:
            recording.discard()
        raise
    try:
        _sync_host_streams(nodes)
        if recording is not None:
            recording.begin()  # the writer, and the taps before any hook sends
        load_errors = engine.start(restore)
        if load_errors:
            problems = [f"node {name!r}: {exc}" for name, exc in load_errors]
            raise ValueError(mismatch_message(problems)) from load_errors[0][1]
        if restore is not None:
            if recording is not None:
                recording.muted = True  # the saved messages: not sent in this run
            engine.restore_schedule(meta)
            if recording is not None:
                recording.muted = False
        for port, message in first.items():
            engine.host_write(port, message)
        engine.go()
    except BaseException:
        engine.abort()
        if recording is not None:
            recording.discard()
        raise
    handle = Run.__new__(Run)
    handle._setup(net, engine, None, recording)
    handle._seed = chosen_seed
    if replay is not None:
        handle._replayed = replay._host_writes(engine, handle.write)  # replay.writes
    if recording is not None:
        recording.started(handle)
    if progress:
        engine.finishers.append(Progress(handle._progress_sample).finish)
    return handle


def _begin_recording(
    began: list[_recording.Session],
    recorder: _recording.Recorder,
    engine: Engine,
    processes: Processes,
    *,
    net: Net,
    nodes: list[Node],
    workers: int,
    seed: int,
) -> Callable[[], None]:
    """The recording of a run with processes, begun once they are spawned and before any
    on_start (record.processes); returns what removes it if the start fails."""
    session = _recording.start_with_processes(
        recorder, net=net, nodes=nodes, engine=engine, processes=processes, workers=workers, seed=seed
    )
    began.append(session)
    return session.discard


def _process_workers(placement: Placement, workers: int | None) -> dict[str, int]:
    """The workers of each process: ``workers``, or chosen from its own nodes (proc.workers)."""
    counts: dict[str, int] = {}
    for name in (HOST, *placement.groups):
        on_workers = sum(1 for node in placement.nodes_of(name) if not node.dedicated_thread)
        if workers is None:
            counts[name] = default_workers(on_workers, cpus=usable_cpus(), gil=gil_enabled())
            if name == HOST and not placement.host:
                counts[name] = 1  # an engine ends when its last thread does: it needs one
        else:
            counts[name] = workers
    return counts


def _warn_oversubscription(loads: Mapping[str, tuple[int, int]]) -> None:
    """Warn when a process's threads times torch's threads exceed the physical cores (settings.*).

    ``loads`` holds, for each process of the run (``HOST`` for the host's), its workers and
    its dedicated-thread nodes. Each process is counted on its own, and the advice names
    only what can be lowered.
    """
    per_thread, cores = torch.get_num_threads(), physical_cores()
    over = {name: load for name, load in loads.items() if sum(load) * per_thread > cores}
    if not over:
        return
    counted = [
        f"{_process_label(name, len(loads))} computes on {workers + dedicated} thread(s) "
        f"({workers} worker(s) and {dedicated} dedicated)"
        for name, (workers, dedicated) in over.items()
    ]
    fixes = []
    if per_thread > 1:
        fixes.append("call torch.set_num_threads(1) before mujou.run")
    if any(workers > 1 for workers, _ in over.values()):
        fixes.append("run fewer workers (mujou.run(net, workers=n))")
    if any(dedicated for _, dedicated in over.values()):
        fixes.append("give fewer nodes dedicated_thread=True")
    each = "this process" if len(loads) == 1 else "each process"
    warnings.warn(
        f"{', '.join(counted)}, and torch uses {per_thread} thread(s) for each: more than the "
        f"{cores} physical core(s) {each} may use; {', or '.join(fixes)}",
        OversubscriptionWarning,
        stacklevel=3,
    )


def _process_label(name: str, processes: int) -> str:
    if processes == 1:
        return "this run"
    return "the host's process" if name == HOST else f"process {name!r}"


def _check_net(net: Net, nodes: list[Node]) -> None:
    if not nodes:
        raise ValueError(f"the net {type(net).__name__} has no node; assign nodes to it first")
    members = {id(node) for node in nodes}
    for node in nodes:
        for port in node._mujou.ports.values():
            if isinstance(port, Input):
                source = port.source
                if source is not None and id(source.node) not in members:
                    raise ValueError(
                        f"input {port.name!r} is connected to {_outsider(source)}, "
                        "whose node is not in this net"
                    )
            elif isinstance(port, Output):
                for reader in port._readers:
                    if id(reader.node) not in members:
                        raise ValueError(
                            f"output {port.name!r} is connected to {_outsider(reader)}, "
                            "whose node is not in this net"
                        )


def _check_cycles(nodes: list[Node]) -> None:
    """Refuse triggered nodes that would wake each other without the time moving (trigger.cycle)."""
    edges: dict[str, list[str]] = {node.name: [] for node in nodes}
    for node in nodes:
        core = node._mujou
        if core.trigger is None or core.delay or core.min_interval:
            continue
        for name in core.trigger.inputs:
            port = core.ports[name]
            source = port.source if isinstance(port, Input) else None
            if source is not None and node.name not in edges[source.node.name]:
                edges[source.node.name].append(node.name)
    cycle = trigger_cycle(edges)
    if cycle is not None:
        path = " -> ".join(map(repr, cycle))
        raise ValueError(
            f"triggered nodes {path} form a cycle with no delay: each wakes the next at the "
            "same time, forever; give one of them delay= or min_interval= (or let one of "
            "them update at its period only), so that the time moves around the cycle"
        )


def _outsider(port: _Port) -> str:
    """A port of a node outside the net: its name, or its class and attribute when it has none."""
    node = port.node
    where = repr(port.name) if node.name else f"{type(node).__name__}.{port._attr} (in no net)"
    return f"{type(port).__name__.lower()} {where}"


def _check_inputs(
    nodes: list[Node], inputs: Mapping[Input[Any], Any] | None
) -> dict[Input[Any], tuple[Any, Nest | None]]:
    """The first messages of ``inputs=``, checked and snapshotted for their nodes (run.arguments)."""
    if inputs is None:
        inputs = {}
    elif not isinstance(inputs, Mapping):
        raise TypeError(f"inputs must be a mapping from Input to message, got {type(inputs).__name__}")
    members = {id(node) for node in nodes}
    first: dict[Input[Any], tuple[Any, Nest | None]] = {}
    for key, message in inputs.items():
        port: object = key
        if not isinstance(port, Input) or port._node is None:
            raise TypeError(f"inputs keys must be the Input ports of nodes, got {port!r}")
        if id(port.node) not in members:
            raise ValueError(f"input {port.name!r} in inputs= is not a port of this net")
        if port.source is not None:
            raise ValueError(
                f"input {port.name!r} has the source {port.source.name!r}; inputs= gives first "
                "messages to inputs the host feeds (inputs without a source)"
            )
        try:
            first[port] = _host_message(port, message, f"inputs[{port.name!r}]")
        except (RuntimeError, NotImplementedError) as exc:
            raise ValueError(
                f"inputs[{port.name!r}] cannot be copied for node {port.node.name!r} on "
                f"{port.node.device}: {exc}"
            ) from exc
    for node in nodes:
        for declared in node._mujou.ports.values():
            if (
                isinstance(declared, Input)
                and declared.source is None
                and not declared.optional
                and declared not in inputs
            ):
                raise ValueError(
                    f"input {declared.name!r} has no source: connect it with "
                    "net.connect(output, input), give it a first message with "
                    "mujou.run(..., inputs={port: tensor}), or declare it Input(optional=True)"
                )
    return first


def _sync_host_streams(nodes: list[Node]) -> None:
    """Wait for the host's current streams: of the current device and of each CUDA device of the net.

    See cuda.run-syncs-host-stream. A net without CUDA nodes does not touch CUDA.
    """
    devices = {node.device for node in nodes if node.device.type == "cuda"}
    if devices:
        torch.cuda.current_stream().synchronize()
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
