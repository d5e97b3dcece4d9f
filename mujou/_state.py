"""State trees: CPU copies, the strict checks of a restore, and checked, atomic save/load.

See :ref:`state.tree-shape` and :ref:`state.save-load`; what a file may hold and its checksum
are in ``_contents.py``, how it is written whole in ``_files.py``.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from typing import Any, BinaryIO

import torch

from ._contents import ALLOWED, digest, problems, type_name
from ._errors import StateFileError
from ._files import file_path, written

_CPU = torch.device("cpu")

FORMAT_VERSION = 3  # 2: port messages may be nests, with their stamps; the inputs' fresh flags
# 3: each node's pending trigger, and period None for a node that is triggered only
READS_VERSIONS = (2, 3)  # a version 2 tree has no pending trigger: it reads as none
META_KEY = "@mujou"  # not an identifier, so never the name of a node or a sub-net
# The file's own entry, beside the tree's: its format and the checksum of the tree's content
# (state.file-checksum). mujou.load removes it, so the tree loaded is the tree saved.
FILE_KEY = "@mujou-file"
FILE_VERSION = 1
SHOWN_PROBLEMS = 5  # the values a refused save names at most
# In torch's error of the weights-only unpickler: what it refused (after its advice, not kept).
_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_UNPICKLER_ERROR = re.compile(r"WeightsUnpickler error:\s*(.*?)\s*(?:Check the documentation|$)", re.DOTALL)


def is_stateful(value: object) -> bool:
    """Whether ``value`` follows PyTorch's state protocol (modules, optimizers, schedulers)."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def cpu_copy(value: Any) -> Any:
    """``value`` with every tensor replaced by a detached CPU copy sharing no memory."""
    return copy_to(value, _CPU)


def copy_to(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor replaced by a detached copy on ``device``, and new dicts,
    lists and tuples around them; other values kept as they are."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if isinstance(value, Mapping):
        return {key: copy_to(item, device) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_to(item, device) for item in value]
    if isinstance(value, tuple):
        return tuple(copy_to(item, device) for item in value)
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

    The tree is checked first: it must hold only what :func:`mujou.load` reads back
    (:ref:`state.save-values`). It is written with ``torch.save``, with the checksum of its
    content under ``"@mujou-file"`` (:ref:`state.file-checksum`), to a temporary file beside
    ``path``, flushed to disk, then renamed over ``path``; the temporary files that killed
    saves of ``path`` left are removed first (:ref:`state.save-temporary`). See
    :ref:`state.save-load`.

    Raises:
        TypeError: ``tree`` is not a mapping, holds a value ``mujou.load`` could not read
            back, or ``path`` is not a file path; nothing was written.
        ValueError: ``path`` names no file (``""``, ``"dir/"``).
        OSError: the file cannot be written (its message names it); the old file is intact.
    """
    if not isinstance(tree, Mapping):
        raise TypeError(f"tree must be a state tree (a dict), got {type(tree).__name__}")
    target = file_path("path", path)
    body = {key: value for key, value in tree.items() if key != FILE_KEY}
    found = problems(body)
    if found:
        raise TypeError(_values_message(found))
    entry = _file_entry(body)
    with written(target, f"cannot write the state file {str(target)!r}") as file:
        torch.save({**body, FILE_KEY: entry}, file)


def _file_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"version": FILE_VERSION, "checksum": digest(body)}


def dumps(tree: Mapping[str, Any]) -> bytes:
    """The bytes :func:`save` writes for ``tree`` (a recording's keyframes hold them).

    Raises:
        TypeError: ``tree`` holds a value ``mujou.load`` could not read back.
    """
    body = {key: value for key, value in tree.items() if key != FILE_KEY}
    found = problems(body)
    if found:
        raise TypeError(_values_message(found))
    buffer = io.BytesIO()
    torch.save({**body, FILE_KEY: _file_entry(body)}, buffer)
    return buffer.getvalue()


def _values_message(found: list[str]) -> str:
    shown = "; ".join(found[:SHOWN_PROBLEMS])
    if len(found) > SHOWN_PROBLEMS:
        shown += f"; and {len(found) - SHOWN_PROBLEMS} more"
    return (
        f"tree holds what mujou.load cannot read back, so nothing was written: {shown}. "
        f"A state file holds only {ALLOWED}: convert each (torch.from_numpy(array), str(path), "
        "...) or keep it out of the state"
    )


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a state tree written by :func:`mujou.save`, without running any code in it.

    Uses ``torch.load(weights_only=True)``: a file holding anything but tensors and plain
    values is refused. The checksum ``mujou.save`` stored is checked (a file without one, as
    ``torch.save`` writes, loads unchecked). See :ref:`state.save-load` and
    :ref:`state.load-errors`.

    Raises:
        StateFileError: the file is not a state file, or is damaged; the message says how.
        OSError: the file cannot be opened (missing, a directory, not readable).
        TypeError, ValueError: ``path`` is not a file path, or names no file.
    """
    source = file_path("path", path)
    name = os.fspath(path)
    with open(source, "rb") as file:  # OSError: it names the file
        if os.fstat(file.fileno()).st_size == 0:
            raise StateFileError(name, "it is empty")
        return _read(file, name)


def loads(data: bytes, name: str) -> dict[str, Any]:
    """The state tree of ``data``, the bytes :func:`save` writes (a recording's keyframe), read
    and checked as :func:`load` reads a file; errors name ``name``.

    Raises:
        StateFileError: ``data`` is not a state file's bytes, or is damaged.
    """
    if not data:
        raise StateFileError(name, "it is empty")
    return _read(io.BytesIO(data), name)


def _read(file: BinaryIO, name: str) -> dict[str, Any]:
    """The checked state tree of the open state file ``file`` (see :func:`load`)."""
    try:
        records = zipfile.ZipFile(file).namelist()
    except MemoryError:
        raise
    except Exception as exc:  # BadZipFile mostly; a damaged directory may raise others
        raise StateFileError(name, f"it is truncated, or not a file torch.save writes ({exc})") from exc
    if not any(record.endswith("/data.pkl") for record in records):
        raise StateFileError(name, "it is a zip archive, but not one torch.save writes (it has no data.pkl)")
    file.seek(0)
    try:
        tree = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason, cause = _unpickling_reason(exc)
        raise StateFileError(name, reason) from cause
    except MemoryError:
        raise
    except Exception as exc:
        raise StateFileError(
            name, f"it is damaged: torch.load raised {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    if not isinstance(tree, dict):
        raise StateFileError(name, f"it holds a {type_name(type(tree))}, not a state tree (a dict)")
    entry = tree.pop(FILE_KEY, None)
    if entry is not None:
        _check_entry(name, entry, tree)
    return tree


def _check_entry(name: str, entry: object, tree: dict[str, Any]) -> None:
    """Check the ``"@mujou-file"`` entry of a loaded file against the tree (state.file-checksum)."""
    version = entry.get("version") if isinstance(entry, dict) else None
    checksum = entry.get("checksum") if isinstance(entry, dict) else None
    if type(version) is int and version > FILE_VERSION:
        raise StateFileError(
            name,
            f"it was written by a newer Mujou (file format {version}); this one reads format {FILE_VERSION}",
        )
    if version != FILE_VERSION or not isinstance(checksum, str):
        raise StateFileError(name, f"it is damaged: its {FILE_KEY!r} entry is not valid: {entry!r:.200}")
    if problems(tree) or digest(tree) != checksum:
        raise StateFileError(
            name,
            "it is damaged: its content does not match the checksum mujou.save wrote "
            "(the file was changed after it was written)",
        )


def _unpickling_reason(exc: pickle.UnpicklingError) -> tuple[str, pickle.UnpicklingError]:
    """What the weights-only unpickler refused, and a cause that keeps only its own reason.

    torch's message advises loading with ``weights_only=False``, which would run the code a
    file may hold: the cause shown keeps the unpickler's reason, not that advice.
    """
    text = str(exc)
    found = _UNSUPPORTED_GLOBAL.search(text)
    if found is not None:
        reason = (
            f"it holds an object of (or built by) {found[1]}, which a state file cannot hold: only {ALLOWED}"
        )
        detail = f"Unsupported global: GLOBAL {found[1]}"
    else:
        found = _UNPICKLER_ERROR.search(text)
        detail = " ".join(found[1].split()) if found is not None else ""
        if not detail or "weights_only" in detail:
            detail = "the weights-only unpickler refused it"
        reason = f"it is damaged: its pickled data cannot be read ({detail})"
    cause = pickle.UnpicklingError(detail)
    return reason, cause.with_traceback(exc.__traceback__)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else repr(exc)
