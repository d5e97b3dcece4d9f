"""Building the state tree of a run and checking a tree against a net before a restore.

The tree mirrors the net: ``tree["arm"]["joint"]`` is the state of node ``arm.joint``; the
key ``"@mujou"`` holds what an exact resume needs. See :ref:`state.tree-shape`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._node import Node
from ._port import _Port
from ._ports import Input, Output
from ._state import FORMAT_VERSION, META_KEY, READS_VERSIONS, cpu_copy
from ._stored import MalformedError, decode, encode

if TYPE_CHECKING:
    from ._engine._slot import Slot


def class_path(node: object) -> str:
    """The module-qualified class name of ``node``. A process of the run imports the host's
    main script as ``__mp_main__``: its classes are the host's ``__main__`` ones."""
    cls = type(node)
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    return f"{module}.{cls.__qualname__}"


def same_class(saved: object, current: str) -> bool:
    """Whether a saved class path names the current class.

    A class of a script run as ``python script.py`` lives in ``__main__``, and the same class
    imported elsewhere in its own module: those match by their qualified name alone.
    """
    if not isinstance(saved, str):
        return False
    main = "__main__."
    if saved.startswith(main):
        return current.endswith("." + saved[len(main) :])
    if current.startswith(main):
        return saved.endswith("." + current[len(main) :])
    return saved == current


def state_ports(slots: Sequence[Slot]) -> dict[str, _Port]:
    """The ports whose latest message is part of the state: outputs and host-fed inputs."""
    ports: dict[str, _Port] = {}
    for slot in slots:
        for port in slot.core.ports.values():
            if isinstance(port, Output) or (isinstance(port, Input) and port.source is None):
                ports[port.name] = port
    return ports


def build_tree(slots: Sequence[Slot], states: Sequence[Any], time: float) -> dict[str, Any]:
    """The state tree of a run at ``time``, from each node's state (CPU copies throughout)."""
    tree: dict[str, Any] = {}
    nodes: dict[str, Any] = {}
    for slot, state in zip(slots, states, strict=True):
        default = type(slot.actor).state_dict is Node.state_dict
        *parents, leaf = slot.name.split(".")
        branch = tree
        for part in parents:
            branch = branch.setdefault(part, {})
        branch[leaf] = state if default else cpu_copy(state)
        nodes[slot.name] = {
            "class": class_path(slot.node),
            "device": slot.core.device.type,
            "period": None if slot.period == math.inf else slot.period,
            "slot": slot.slot,
            "last": slot.last,
            "trigger": pending_trigger(slot),
        }
    ports: dict[str, Any] = {}
    for name, port in state_ports(slots).items():
        latest = port._latest
        ports[name] = None if latest is None else encode(latest[0], latest[3])
    fresh = {port.name: port._fresh_next() for slot in slots for port in slot.inputs}
    tree[META_KEY] = {
        "version": FORMAT_VERSION,
        "time": time,
        "nodes": nodes,
        "ports": ports,
        "fresh": fresh,
    }
    return tree


def pending_trigger(slot: Slot) -> float | None:
    """The due time of the update a trigger asked ``slot`` for and it has not begun, or None
    (trigger.state)."""
    due = min(slot.due, slot.pending)
    return due if due < slot.slot * slot.period else None


def check_tree(slots: Sequence[Slot], tree: object) -> tuple[list[str], list[Any], dict[str, Any]]:
    """Match a state tree with the run's nodes: the problems, each node's state, the metadata.

    Every problem is collected, so the error lists them all at once (state.mismatch).
    """
    if not isinstance(tree, Mapping):
        return [f"the state must be a state tree (a dict), got {type(tree).__name__}"], [], {}
    meta = tree.get(META_KEY)
    if not isinstance(meta, Mapping) or not isinstance(meta.get("nodes"), Mapping):
        return [f"the tree has no {META_KEY!r} entry: it was not made by run.state_dict()"], [], {}
    version = meta.get("version")
    if version not in READS_VERSIONS:
        return [f"the tree has format version {version!r}; this Mujou reads version {FORMAT_VERSION}"], [], {}
    problems: list[str] = []
    saved_nodes: Mapping[str, Any] = meta["nodes"]
    names = [slot.name for slot in slots]
    missing = [name for name in names if name not in saved_nodes]
    unexpected = [name for name in saved_nodes if name not in names]
    if missing:
        problems.append("Missing node(s): " + ", ".join(f'"{n}"' for n in missing) + ".")
    if unexpected:
        problems.append("Unexpected node(s): " + ", ".join(f'"{n}"' for n in unexpected) + ".")
    states: list[Any] = []
    for slot in slots:
        saved = saved_nodes.get(slot.name)
        state = _lookup(tree, slot.name)
        states.append(state)
        if saved is None:
            continue
        if not same_class(saved.get("class"), class_path(slot.node)):
            problems.append(
                f"node {slot.name!r} is a {class_path(slot.node)}, but the tree holds a {saved.get('class')}."
            )
        if saved.get("device") == "cuda" and slot.core.device.type != "cuda":
            problems.append(
                f"node {slot.name!r} is on the CPU, but its state was saved from a CUDA node; "
                "a tree saved from CUDA nodes restores only into CUDA nodes."
            )
        if saved.get("device") == "cpu" and slot.core.device.type == "cuda":
            problems.append(
                f"node {slot.name!r} is on CUDA, but its state was saved from a CPU node; "
                "a tree saved from CPU nodes restores only into CPU nodes."
            )
        if state is None:
            problems.append(f"node {slot.name!r} has no state entry in the tree.")
    checked = dict(meta)
    checked["ports"] = _check_ports(slots, meta.get("ports", {}), problems)
    checked["fresh"] = _check_fresh(slots, saved_nodes, meta.get("fresh"), problems)
    return problems, states, checked


def _check_ports(slots: Sequence[Slot], ports: object, problems: list[str]) -> dict[str, Any]:
    """The tree's port messages, rebuilt: (message, stamp) or None by port name (state.port-messages)."""
    if not isinstance(ports, Mapping):
        problems.append(f"the tree's {META_KEY!r} ports must be a dict, got {type(ports).__name__}.")
        return {}
    known = state_ports(slots)
    decoded: dict[str, Any] = {}
    for name, entry in ports.items():
        if entry is None:
            decoded[name] = None
            continue
        port = known.get(name)
        try:
            decoded[name] = message, _ = decode(entry, object if port is None else type(port.node))
        except MalformedError as exc:
            problems.append(f"port {name!r} {exc}.")
            continue
        declared = None if port is None else port._declared
        problem = "" if declared is None else declared.problem(message)
        if problem:
            problems.append(f"port {name!r} {problem}.")
    return decoded


def _check_fresh(
    slots: Sequence[Slot], saved_nodes: Mapping[str, Any], fresh: object, problems: list[str]
) -> dict[str, bool]:
    """The tree's fresh flags of the inputs (ports.fresh), each a bool."""
    if not isinstance(fresh, Mapping):
        problems.append(f"the tree's {META_KEY!r} entry has no fresh flags of the inputs (a dict).")
        return {}
    missing = [
        port.name
        for slot in slots
        if slot.name in saved_nodes
        for port in slot.inputs
        if not isinstance(fresh.get(port.name), bool)
    ]
    if missing:
        problems.append("Missing fresh flag(s) of input(s): " + ", ".join(f'"{n}"' for n in missing) + ".")
    return {name: flag for name, flag in fresh.items() if isinstance(flag, bool)}


def _lookup(tree: Mapping[str, Any], name: str) -> Any:
    branch: Any = tree
    for part in name.split("."):
        if not isinstance(branch, Mapping) or part not in branch:
            return None
        branch = branch[part]
    return branch


def mismatch_message(problems: Sequence[str]) -> str:
    """The one error for every problem of a restore, in torch's format."""
    return "Error(s) in loading state for net:\n\t" + "\n\t".join(problems)
