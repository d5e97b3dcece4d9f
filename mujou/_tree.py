"""Building the state tree of a run and checking a tree against a net before a restore.

The tree mirrors the net: ``tree["arm"]["joint"]`` is the state of node ``arm.joint``; the
key ``"@mujou"`` holds what an exact resume needs. See :ref:`state.tree-shape`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ._node import Node
from ._ports import Input, Output, _Port
from ._state import FORMAT_VERSION, META_KEY, cpu_copy

if TYPE_CHECKING:
    from ._engine._slot import Slot


def class_path(node: object) -> str:
    """The module-qualified class name of ``node``."""
    cls = type(node)
    return f"{cls.__module__}.{cls.__qualname__}"


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
        default = type(slot.node).state_dict is Node.state_dict
        *parents, leaf = slot.name.split(".")
        branch = tree
        for part in parents:
            branch = branch.setdefault(part, {})
        branch[leaf] = state if default else cpu_copy(state)
        nodes[slot.name] = {
            "class": class_path(slot.node),
            "device": slot.core.device.type,
            "period": slot.period,
            "slot": slot.slot,
            "last": slot.last,
        }
    latest = {name: port._peek() for name, port in state_ports(slots).items()}
    ports = {name: None if message is None else cpu_copy(message) for name, message in latest.items()}
    tree[META_KEY] = {"version": FORMAT_VERSION, "time": time, "nodes": nodes, "ports": ports}
    return tree


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
    if version != FORMAT_VERSION:
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
    ports = meta.get("ports", {})
    if isinstance(ports, Mapping):
        for name, message in ports.items():
            if message is not None and not isinstance(message, torch.Tensor):
                problems.append(f"port {name!r} holds a {type(message).__name__}, not a tensor.")
    return problems, states, dict(meta)


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
