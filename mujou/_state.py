"""State trees: CPU copies, the strict checks of a restore, and atomic save/load.

See :ref:`state.tree-shape` and :ref:`state.save-load`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

FORMAT_VERSION = 2  # 2: port messages may be nests, with their stamps; the inputs' fresh flags
META_KEY = "@mujou"  # not an identifier, so never the name of a node or a sub-net


def is_stateful(value: object) -> bool:
    """Whether ``value`` follows PyTorch's state protocol (modules, optimizers, schedulers)."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def cpu_copy(value: Any) -> Any:
    """``value`` with every tensor replaced by a detached CPU copy sharing no memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {key: cpu_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [cpu_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(cpu_copy(item) for item in value)
    return value


def load_errors_message(missing: list[str], unexpected: list[str]) -> str:
    """The body of a strict-load error, in torch's wording."""
    parts = []
    if missing:
        parts.append("Missing key(s): " + ", ".join(f'"{key}"' for key in missing) + ".")
    if unexpected:
        parts.append("Unexpected key(s): " + ", ".join(f'"{key}"' for key in unexpected) + ".")
    return " ".join(parts)


def save(tree: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a state tree to ``path`` atomically: the file is complete or untouched.

    The tree is written with ``torch.save`` to a temporary file beside ``path``, flushed to
    disk, then renamed over ``path``. See :ref:`state.save-load`.

    Raises:
        TypeError: ``tree`` is not a mapping.
    """
    if not isinstance(tree, Mapping):
        raise TypeError(f"tree must be a state tree (a dict), got {type(tree).__name__}")
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(dict(tree), file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a state tree written by :func:`mujou.save`, without running any code in it.

    Uses ``torch.load(weights_only=True)``: a file holding anything but tensors and plain
    containers is refused. See :ref:`state.save-load`.
    """
    tree = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(tree, dict):
        raise ValueError(f"{os.fspath(path)!r} does not hold a mujou state tree (a dict)")
    return tree
