"""Spawning a run's processes: each group's ``Setup``, its connections, its wake pipes.

Each process gets its nodes packed (``_pack``), the links among them, which of its inputs read
sources elsewhere and which of its outputs are read elsewhere, the host's torch settings, and
its ends of the wake pipes: one pipe for each pair of processes where one sends to the other
(proc.wake). The host keeps the control and events connections of each (``Group``).

The processes start from Mujou's own fork server where there is one (``_server``), else with
``spawn``; a run whose groups are all on other hosts (``mujou._hosts``) starts none here.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import torch

from .._ports import Output
from ._child import Setup, main
from ._group import EXIT_GRACE, Group
from ._main_script import check_classes
from ._pack import pack
from ._placement import HOST, Placement
from ._server import HostStreams, start_context
from ._wire import Pipe

Spawned = tuple[dict[str, Group], dict[str, Pipe], list[Connection]]
"""The groups by name, the host's wake pipes to each reader process, the host's inbound ends."""


def spawn(
    placement: Placement,
    workers: Mapping[str, int],
    *,
    virtual: bool,
    scale: float,
    trace: bool,
    on_event: Callable[[Group, tuple[Any, ...]], None],
    on_warning: Callable[[type[Warning], str], None],
) -> Spawned:
    """Start each group's process. Each group's first reply (its nodes rebuilt, or why not)
    is still to come: ``Group.built``."""
    check_classes(placement.groups)  # before the fork server starts
    # Groups on other hosts start from their agents': no server here when every group is remote.
    local = any(name not in placement.hosts for name in placement.groups)
    context = start_context() if local else multiprocessing.get_context("spawn")
    names = [HOST, *placement.groups]
    readers_of = {
        name: {p for readers in placement.outgoing[name].values() for p in readers} for name in names
    }
    packed = {name: [pack(node, name) for node in nodes] for name, nodes in placement.groups.items()}
    wake: dict[tuple[str, str], tuple[Connection, Connection]] = {}
    for writer in names:
        for reader in sorted(readers_of[writer]):
            if writer in placement.hosts or reader in placement.hosts:
                continue  # across hosts: the data plane of mujou._hosts, no pipe
            wake[writer, reader] = context.Pipe(duplex=False)  # (reader's end, writer's end)
    host_pipes = {w_r[1]: Pipe(ends[1]) for w_r, ends in wake.items() if w_r[0] == HOST}
    host_inbound = [ends[0] for w_r, ends in wake.items() if w_r[1] == HOST]
    groups: dict[str, Group] = {}
    try:  # on any failure nothing is left: the processes started end, every end closes
        for name, nodes in placement.groups.items():
            members = {id(node) for node in nodes}
            links = [
                (port.name, reader.name)
                for node in nodes
                for port in node._mujou.ports.values()
                if isinstance(port, Output)
                for reader in port._readers
                if id(reader.node) in members
            ]
            setup = Setup(
                name=name,
                nodes=packed[name],
                links=links,
                incoming=placement.incoming[name],
                outgoing=placement.outgoing[name],
                workers=workers[name],
                virtual=virtual,
                scale=scale,
                torch_threads=torch.get_num_threads(),
                default_dtype=torch.get_default_dtype(),
                deterministic=torch.are_deterministic_algorithms_enabled(),
                trace=trace,
            )
            remote = placement.hosts.get(name)
            tags: Connection | None = None
            if remote is not None:  # started by the agent of another host (mujou._hosts)
                process, control, events, tags = remote.launch(name, setup)
                ours = [end for end in (control, events, tags) if end is not None]
            else:
                control, control_child = context.Pipe()
                events, events_child = context.Pipe(duplex=False)
                # The lockstep's own connection under the virtual timer (NOTE [ the tags connection ]).
                tags, tags_child = context.Pipe() if virtual else (None, None)
                ours = [end for end in (control, events, tags) if end is not None]
                theirs = [end for end in (control_child, events_child, tags_child) if end is not None]
                wake_out = {reader: ends[1] for (writer, reader), ends in wake.items() if writer == name}
                wake_in = [ends[0] for (writer, reader), ends in wake.items() if reader == name]
                process = context.Process(
                    target=main,
                    args=(setup, control_child, events_child, wake_out, wake_in),
                    kwargs={"environ": dict(os.environ), "streams": HostStreams(), "tags": tags_child},
                    name=f"mujou-{name}",
                )
                try:
                    process.start()
                except BaseException:
                    for end in ours:
                        end.close()
                    raise
                finally:
                    for end in theirs:
                        end.close()
                for end in (*wake_out.values(), *wake_in):
                    end.close()
            try:
                groups[name] = Group(
                    name,
                    nodes,
                    process=process,
                    control=control,
                    events=events,
                    on_event=on_event,
                    on_warning=on_warning,
                    virtual=virtual,
                    tags=tags,
                )
            except BaseException:
                process.kill()
                process.join(EXIT_GRACE)
                for end in ours:
                    end.close()
                raise
    except BaseException:
        _undo(groups, wake)
        raise
    return groups, host_pipes, host_inbound


def _undo(groups: Mapping[str, Group], wake: Mapping[tuple[str, str], tuple[Connection, Connection]]) -> None:
    """A spawn that failed part way: kill the processes it started (each ends within
    ``EXIT_GRACE``), and close every end of the wake pipes (closing one twice does nothing)."""
    for group in groups.values():
        group.kill()
    deadline = time.monotonic() + EXIT_GRACE
    for group in groups.values():
        group.end(deadline)
    for ends in wake.values():
        for end in ends:
            end.close()
