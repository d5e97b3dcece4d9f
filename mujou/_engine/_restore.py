"""Resuming from a state tree: checking its ``"@mujou"`` time and schedules, and restoring them.

See state.resume and state.mismatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch

from .._cuda import host_to_node
from .._messages import Nest, flatten, rebuild
from .._ports import Input, Output
from .._routing import Route
from .._schedule import first_slot_at_or_after
from .._tree import state_ports
from ._clock import RealClock, VirtualClock
from ._slot import Slot

MAX_SLOTS = 2**52  # slot numbers up to here are exact in a float's mantissa: due times stay exact


def check_schedule(slots: Sequence[Slot], meta: Mapping[str, Any]) -> list[str]:
    """The problems of a tree's ``"@mujou"`` time and schedules, all of them (state.mismatch).

    Checked before anything starts: a restore then cannot fail half-way, hang on a time the
    slot arithmetic cannot reach, or hand ``on_update`` a ``dt`` that is not a positive time.
    """
    problems: list[str] = []
    time_ = meta.get("time")
    if isinstance(time_, bool) or not isinstance(time_, int | float):
        return [f"the tree's {'@mujou'!r} time must be a number of seconds, got {time_!r}."]
    time_ = float(time_)
    if not (math.isfinite(time_) and time_ >= 0.0):
        return [f"the tree's {'@mujou'!r} time must be a finite number of seconds >= 0, got {time_!r}."]
    saved_nodes: Mapping[str, Any] = meta["nodes"]
    for slot in slots:
        saved = saved_nodes.get(slot.name)
        if not isinstance(saved, Mapping):
            problems.append(f"node {slot.name!r} has no schedule in the tree's {'@mujou'!r} entry.")
            continue
        period, number, last = saved.get("period"), saved.get("slot"), saved.get("last")
        where = f"node {slot.name!r}'s saved"
        if period is not None and (
            isinstance(period, bool)
            or not isinstance(period, int | float)
            or not (math.isfinite(period) and period > 0)
        ):
            problems.append(f"{where} period must be None or a finite number of seconds > 0, got {period!r}.")
        elif time_ / min(math.inf if period is None else float(period), slot.period) >= MAX_SLOTS:
            problems.append(
                f"the tree's time {time_!r} is too far on for node {slot.name!r}'s period: "
                f"at most {MAX_SLOTS} periods are allowed."
            )
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_SLOTS:
            problems.append(f"{where} slot must be an int in [1, 2**52], got {number!r}.")
        if isinstance(last, bool) or not isinstance(last, int | float) or not (0.0 <= float(last) <= time_):
            problems.append(
                f"{where} last update time must be a number in [0, the tree's time {time_!r}], got {last!r}."
            )
        trigger = saved.get("trigger")
        if trigger is not None and (
            isinstance(trigger, bool) or not isinstance(trigger, int | float) or not 0.0 <= trigger < math.inf
        ):
            problems.append(f"{where} pending trigger must be None or a due time >= 0, got {trigger!r}.")
    return problems


def restore_schedule(slots: Sequence[Slot], clock: RealClock | VirtualClock, meta: Mapping[str, Any]) -> None:
    """Set the timer time, the schedules and the latest messages of a checked tree's ``"@mujou"``.

    Under the virtual timer a node due before the restored time (a tree taken under the
    real-time timer) is due at its first slot at or after it: no update is late there.
    """
    time_ = float(meta["time"])
    clock.set_origin(time_)
    saved_nodes: Mapping[str, Any] = meta["nodes"]
    for slot in slots:
        saved = saved_nodes[slot.name]
        period = saved["period"]
        if slot.period == math.inf:
            slot.slot = int(saved["slot"])  # triggered only: the number counts nothing
        elif period is not None and float(period) == slot.period:
            slot.slot = int(saved["slot"])
        else:
            slot.slot = first_slot_at_or_after(time_, slot.period)
        if clock.virtual and slot.slot * slot.period < time_:
            slot.slot = first_slot_at_or_after(time_, slot.period)
        slot.last = slot.dt_from = float(saved["last"])
        trigger = saved.get("trigger")  # trigger.state; a node not triggered now drops it
        slot.pending = math.inf
        slot.arrived = False  # the messages of on_start are no arrival here (trigger.arrival)
        if trigger is not None and slot.core.trigger is not None:
            slot.pending = max(float(trigger), time_) if clock.virtual else float(trigger)
    ports = state_ports(slots)
    for name, saved in meta["ports"].items():  # rebuilt by check_tree: (message, stamp)
        port = ports.get(name)
        if port is None or saved is None:
            continue
        message, stamp = saved
        if isinstance(port, Input) or (
            isinstance(port, Output) and port._route is Route.DEVICE
        ):  # fed by the host: where run.write would put it
            message, nest = _placed(message, partial(_to_node, device=port.node.device))
        else:
            message, nest = _placed(message, lambda tensor: tensor.to("cpu", copy=True))
        if isinstance(port, Input):
            port._write(message, nest, stamp)
        else:
            port._publish(message, 0 if nest is not None else message._version, nest, stamp)
    fresh: Mapping[str, bool] = meta["fresh"]
    for slot in slots:
        for port in slot.inputs:  # after the messages: the flags are about them (ports.fresh)
            port._restore_fresh(fresh.get(port.name, True))
        for i, port in enumerate(slot.trigger_inputs):  # not arrivals (trigger.arrival)
            fresh_now = port._fresh_next()
            slot.arrival_times[i] = -math.inf if fresh_now else 0.0
            slot.arrival_numbers[i] = port._seen + 1 if fresh_now else 0


def _to_node(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return host_to_node(tensor, device)


def _placed(message: Any, place: Callable[[torch.Tensor], torch.Tensor]) -> tuple[Any, Nest | None]:
    """``message`` with ``place`` applied to each tensor, and what a nest is (None for a tensor)."""
    if isinstance(message, torch.Tensor):
        return place(message), None
    leaves, spec = flatten(message)
    placed = [place(leaf) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return rebuild(spec, placed), Nest(spec, placed)
