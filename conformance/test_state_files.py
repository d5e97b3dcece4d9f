"""Conformance tests for the files Mujou writes and reads: state files and the trace's file.

Rules: the "Saving and loading" section of spec/en/state.md (``state.save-load-arguments``,
``state.save-values``, ``state.file-checksum``, ``state.load-errors``, ``state.save-temporary``,
``state.file-mode``) and ``observe.trace-start`` of spec/en/observing.md.

A writer killed mid-save is a child process that kills itself with SIGKILL right after
``torch.save`` wrote its temporary file, so the kill is always mid-save, with no timing; a
writer still saving is one that waits there for the test.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import math
import os
import pathlib
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import traceback
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from _support import HANG_GUARD, Bag, Drawer, vt

import mujou

POSIX = os.name == "posix"
ROOT = POSIX and os.geteuid() == 0  # permissions do not stop root


def drawer_tree(seconds: float = 0.5) -> dict[str, Any]:
    """The state tree of a small run: a node's generator and tensor, and Mujou's metadata."""
    with mujou.run(Bag(d=Drawer()), timer=vt()) as run:
        run.sleep(seconds)
        return run.state_dict()


def bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """A strided tensor's elements as bytes, in order."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same(a: object, b: object, path: str = "tree") -> None:
    """The same structure, the same types exactly, equal values, tensors bit for bit."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad), path
        if a.layout is torch.strided:
            assert torch.equal(bytes_of(a), bytes_of(b)), f"{path}: {a} vs {b}"
        else:
            assert torch.equal(a.to_dense(), b.to_dense()), f"{path}: {a} vs {b}"
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping)
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), f"{path}: {a!r} vs {b!r}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def temporaries(folder: Path, name: str) -> list[str]:
    """The temporary files of ``folder / name``, as state.save-temporary names them."""
    return sorted(
        p.name for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp")
    )


def shown_chain(error: BaseException) -> list[BaseException]:
    """The exceptions a traceback of ``error`` shows: it, then its causes and contexts."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


# --- state.save-load-arguments -------------------------------------------------------------


@pytest.mark.rule("state.save-load-arguments")
def test_path_and_tree_arguments_are_checked(tmp_path: Path) -> None:
    """> The tree of mujou.save is a mapping, and the path of mujou.save and mujou.load a str or
    an os.PathLike (else TypeError) that names a file (an empty path or one that ends in a
    separator: ValueError); each message names the argument and what is allowed."""
    tree = {"x": torch.zeros(2)}
    for bad in (5, None, b"state.pt", ["state.pt"]):
        shown = repr(bad)
        with pytest.raises(
            TypeError, match=r"^path must be a file path \(a str or an os\.PathLike\), got "
        ) as info:
            mujou.save(tree, bad)  # type: ignore[arg-type]  # the wrong type, on purpose
        assert shown in str(info.value)
        with pytest.raises(TypeError, match=r"^path must be a file path \(a str or an os\.PathLike\), got "):
            mujou.load(bad)  # type: ignore[arg-type]  # the wrong type, on purpose
    for empty in ("", str(tmp_path) + os.sep):
        with pytest.raises(ValueError, match=r"^path must name a file, got "):
            mujou.save(tree, empty)
        with pytest.raises(ValueError, match=r"^path must name a file, got "):
            mujou.load(empty)
    with pytest.raises(TypeError, match=r"^tree must be a state tree \(a dict\), got list$"):
        mujou.save([torch.zeros(2)], tmp_path / "s.pt")  # type: ignore[arg-type]  # on purpose
    assert list(tmp_path.iterdir()) == [], "a refused save wrote something"


@pytest.mark.rule("state.save-load-arguments")
def test_a_path_that_cannot_be_written_raises_the_os_error_naming_it(tmp_path: Path) -> None:
    """> A path that cannot be written raises the OSError of its cause (PermissionError,
    IsADirectoryError, ...), naming the path, and leaves the old file whole."""
    tree = drawer_tree()
    folder = tmp_path / "folder.pt"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=r"^\[Errno \d+\] cannot write the state file ") as info:
        mujou.save(tree, folder)
    assert repr(str(folder)) in str(info.value)
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory", encoding="utf-8")
    with pytest.raises(NotADirectoryError, match=r"^\[Errno \d+\] cannot write the state file ") as info2:
        mujou.save(tree, blocker / "s.pt")
    assert repr(str(blocker / "s.pt")) in str(info2.value)
    with pytest.raises(FileNotFoundError, match=r"^\[Errno \d+\] cannot write the state file "):
        mujou.save(tree, tmp_path / "missing" / "s.pt")
    if POSIX and not ROOT:
        locked = tmp_path / "locked"
        locked.mkdir()
        mujou.save(tree, locked / "s.pt")
        before = (locked / "s.pt").read_bytes()
        locked.chmod(0o500)
        try:
            with pytest.raises(PermissionError, match=r"^\[Errno \d+\] cannot write the state file "):
                mujou.save(drawer_tree(0.75), locked / "s.pt")
        finally:
            locked.chmod(0o700)
        assert (locked / "s.pt").read_bytes() == before, "the old file changed"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.rule("state.save-load")
def test_a_save_that_fails_while_writing_leaves_the_old_file_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """> mujou.save(tree, path) writes atomically (a complete file or the old one, never a
    partial one)."""
    path = tmp_path / "s.pt"
    old = drawer_tree(0.25)
    mujou.save(old, path)
    real_save = torch.save

    def fails_halfway(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
        real_save(obj, f, *args, **kwargs)
        f.truncate(f.tell() // 2)  # half a file written, then the disk fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", fails_halfway)
    with pytest.raises(
        OSError, match=r"^\[Errno 28\] cannot write the state file .*: No space left on device$"
    ):
        mujou.save(drawer_tree(0.5), path)
    monkeypatch.undo()
    assert_same(mujou.load(path), old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pt"], "the failed save left a file"


# --- state.save-values ----------------------------------------------------------------------


class Pose(NamedTuple):
    x: float
    y: float


class Mode(enum.IntEnum):
    ON = 1


class Tagged(torch.Tensor):
    """A tensor subclass."""


REFUSED: list[tuple[str, Callable[[], object], str]] = [
    ("numpy array", lambda: np.zeros(3), "numpy.ndarray"),
    ("numpy scalar", lambda: np.float64(1.5), "numpy.float64"),
    ("path", lambda: pathlib.PurePosixPath("/data"), "pathlib.PurePosixPath"),
    ("object", object, "object"),
    ("function", lambda: len, "builtin_function_or_method"),
    ("defaultdict", lambda: collections.defaultdict(int), "collections.defaultdict"),
    ("namedtuple", lambda: Pose(1.0, 2.0), f"{__name__}.Pose"),
    ("enum", lambda: Mode.ON, f"{__name__}.Mode"),
    ("frozenset", lambda: frozenset({1}), "frozenset"),
    ("slice", lambda: slice(1, 2), "slice"),
    ("range", lambda: range(3), "range"),
    ("tensor subclass", lambda: torch.zeros(2).as_subclass(Tagged), f"{__name__}.Tagged"),
    ("generator object", torch.Generator, "torch._C.Generator"),
]


@pytest.mark.rule("state.save-values")
@pytest.mark.parametrize(("what", "make", "name"), REFUSED, ids=[r[0] for r in REFUSED])
def test_save_refuses_what_load_would_not_read_back(
    tmp_path: Path, what: str, make: Callable[[], object], name: str
) -> None:
    """> mujou.save refuses, with TypeError and before it writes anything, a tree holding a
    value that mujou.load would not read back [...] The message names each value refused by
    its key path (tree['learner']['buffer'][3]), says what it is, and lists what is allowed."""
    value = make()
    # What torch itself does with it: written by torch.save, refused by the weights-only load.
    raw = tmp_path / "raw.pt"
    with pytest.raises(Exception):  # noqa: B017  # whichever torch raises
        torch.save({"v": value}, raw)
        torch.load(raw, weights_only=True)
    raw.unlink(missing_ok=True)
    path = tmp_path / "s.pt"
    mujou.save({"kept": torch.ones(1)}, path)
    before = path.read_bytes()
    tree = {"learner": {"buffer": [torch.zeros(1), 3, "x", value]}, "other": 1}
    expected = (
        r"^tree holds what mujou\.load cannot read back, so nothing was written: "
        rf"tree\['learner'\]\['buffer'\]\[3\] is a {re.escape(name)}\. "
    )
    with pytest.raises(TypeError, match=expected) as info:
        mujou.save(tree, path)
    message = str(info.value)
    assert "A state file holds only tensors (torch.Tensor, torch.nn.Parameter), None, bools" in message
    assert path.read_bytes() == before, "the refused save changed the file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pt"], "the refused save left a file"


@pytest.mark.rule("state.save-values")
def test_save_names_refused_keys_set_elements_and_every_value(tmp_path: Path) -> None:
    """> [...] allowed, as keys and as values [...] The message names each value refused."""
    tree = {
        "a": {np.int64(3): torch.zeros(1)},
        "b": {1, 2, Pose(0.0, 1.0)},
        "c": [np.zeros(1)] * 7,
    }
    with pytest.raises(TypeError) as info:
        mujou.save(tree, tmp_path / "s.pt")
    message = str(info.value)
    assert "a key of tree['a'] is a numpy.int64" in message, message
    assert f"an element of tree['b'] is a {__name__}.Pose" in message, message
    assert "tree['c'][0] is a numpy.ndarray" in message, message
    assert "and 4 more" in message, message  # 9 refused values: the first 5 are named
    assert list(tmp_path.iterdir()) == []


def allowed_tree() -> dict[str, Any]:
    """A tree with every kind of value a state file may hold."""
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,), check_invariants=True
    )
    grid = torch.arange(12.0).reshape(3, 4)
    recursive: list[Any] = [1]
    recursive.append(recursive)
    return {
        "plain": [None, True, False, 0, -(10**30), 1.5, math.nan, -math.inf, 2 - 3j, "ü\n", b"\x00b"],
        "bytearray": bytearray(b"xy"),
        "torch": [
            torch.float16,
            torch.device("cpu"),
            torch.strided,
            torch.per_tensor_affine,
            torch.Size([2, 3]),
        ],
        "containers": (
            collections.OrderedDict(b=1, a=2),
            collections.Counter("abca"),
            {3, "x", (1, 2)},
            {(1, "k"): [], 7: {}, None: ()},
        ),
        "tensors": {
            "parameter": torch.nn.Parameter(torch.ones(2)),
            "grad": torch.ones(2, requires_grad=True),
            "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
            "complex": torch.tensor([1 + 2j]),
            "bool": torch.tensor([True, False]),
            "empty": torch.zeros(0, 3),
            "scalar": torch.tensor(7, dtype=torch.int64),
            "view": grid[:, 1],
            "transposed": grid.t(),
            "sparse": sparse,
            "uint8": torch.arange(256, dtype=torch.uint8),
        },
        "recursive": recursive,
    }


@pytest.mark.rule("state.save-values")
# torch 2.11 warns that invariant checks are off even for a tensor made with check_invariants=True
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled:UserWarning")
def test_save_accepts_exactly_what_load_reads_back(tmp_path: Path) -> None:
    """> only torch.Tensor and torch.nn.Parameter, None, bool, int, float, complex, str, bytes,
    bytearray, torch.dtype, torch.device, torch.layout, torch.qscheme and torch.Size, and dict,
    OrderedDict, Counter, list, tuple and set of them are allowed."""
    tree = allowed_tree()
    path = tmp_path / "s.pt"
    mujou.save(tree, path)
    loaded = mujou.load(path)
    recursive = loaded.pop("recursive")
    assert recursive[0] == 1 and recursive[1] is recursive, recursive
    tree.pop("recursive")
    assert_same(loaded, tree)
    raw = torch.load(path, weights_only=True)
    raw.pop("@mujou-file")
    raw.pop("recursive")
    assert_same(raw, tree)


# --- state.file-checksum --------------------------------------------------------------------


def flip_a_tensor_byte(path: Path, tensor: torch.Tensor) -> None:
    """Change one byte of ``tensor``'s data in the file, keeping its zip records valid."""
    data = bytearray(path.read_bytes())
    pattern = tensor.numpy().tobytes()
    at = data.find(pattern)
    assert at >= 0 and data.find(pattern, at + 1) < 0, "the tensor's bytes are not once in the file"
    data[at + len(pattern) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.rule("state.file-checksum")
def test_a_file_whose_tensor_bytes_changed_is_refused(tmp_path: Path) -> None:
    """> mujou.load removes the entry, computes the checksum of what it read, and raises
    mujou.StateFileError naming the file when the two differ."""
    weights = torch.arange(4096, dtype=torch.float32) * 0.5 + 1000.0
    tree = {**drawer_tree(), "model": {"weights": weights, "step": 12}}
    path = tmp_path / "s.pt"
    mujou.save(tree, path)
    assert_same(mujou.load(path), tree)
    flip_a_tensor_byte(path, weights)
    changed = torch.load(path, weights_only=True)["model"]["weights"]
    assert not torch.equal(changed, weights), "the test did not change the tensor"
    with pytest.raises(
        mujou.StateFileError, match=r"^cannot load the state file '.*': it is damaged: "
    ) as info:
        mujou.load(path)
    assert info.value.path == str(path)
    assert "does not match the checksum mujou.save wrote" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.rule("state.file-checksum")
def test_a_large_tensor_is_checked_to_its_last_bytes(tmp_path: Path) -> None:
    """> a CRC-32 of each tensor's bytes (a tensor large enough to be checked on several
    threads, changed near its end)."""
    big = torch.arange(12_000_000, dtype=torch.float32)  # 48 MB
    path = tmp_path / "s.pt"
    mujou.save({"big": big, "small": torch.ones(3)}, path)
    assert torch.equal(mujou.load(path)["big"], big)
    flip_a_tensor_byte(path, big[11_999_000:11_999_016])
    with pytest.raises(mujou.StateFileError, match=r"it is damaged: its content does not match the checksum"):
        mujou.load(path)


@pytest.mark.rule("state.file-checksum")
def test_a_file_whose_plain_values_changed_is_refused(tmp_path: Path) -> None:
    """> a checksum of the tree's content (SHA-256 over its structure, keys and plain values,
    each tensor's class, dtype and shape [...])."""
    path = tmp_path / "s.pt"
    tree = {**drawer_tree(), "count": {"n": 12, "name": "a"}}
    mujou.save(tree, path)
    changes: list[Callable[[dict[str, Any]], object]] = [
        lambda raw: raw["count"].__setitem__("n", 13),
        lambda raw: raw["count"].__setitem__("extra", None),
        lambda raw: raw["count"].pop("name"),
        lambda raw: raw["d"].__setitem__("last", raw["d"]["last"].double()),
    ]
    for change in changes:
        raw = torch.load(path, weights_only=True)
        change(raw)
        torch.save(raw, tmp_path / "edited.pt")  # the entry of the original is kept
        with pytest.raises(
            mujou.StateFileError, match=r"it is damaged: its content does not match the checksum"
        ):
            mujou.load(tmp_path / "edited.pt")


@pytest.mark.rule("state.file-checksum")
def test_the_entry_is_written_beside_the_tree_and_removed_at_load(tmp_path: Path) -> None:
    """> mujou.save writes, beside the tree, the entry "@mujou-file": the file's format version
    and a checksum of the tree's content [...] mujou.load removes the entry."""
    tree = drawer_tree()
    path = tmp_path / "s.pt"
    mujou.save(tree, path)
    raw = torch.load(path, weights_only=True)
    entry = raw.pop("@mujou-file")
    assert isinstance(entry, dict) and entry.get("version") == 1 and isinstance(entry.get("checksum"), str), (
        entry
    )
    assert_same(raw, tree)
    loaded = mujou.load(path)
    assert "@mujou-file" not in loaded
    assert_same(loaded, tree)
    # A tree that holds an entry already (a raw torch.load of a state file) gets a new one.
    mujou.save({**raw, "@mujou-file": {"version": 1, "checksum": "stale"}}, path)
    assert_same(mujou.load(path), tree)


@pytest.mark.rule("state.file-checksum")
def test_entries_of_newer_or_broken_formats_are_refused_and_files_without_one_load(tmp_path: Path) -> None:
    """> a file of a newer format version is refused the same way. A file without the entry
    (one that torch.save wrote) loads unchecked."""
    tree = drawer_tree()
    path = tmp_path / "plain.pt"
    torch.save(tree, path)
    assert_same(mujou.load(path), tree)
    torch.save({**tree, "@mujou-file": {"version": 2, "checksum": "sha3:..."}}, path)
    with pytest.raises(mujou.StateFileError, match=r"it was written by a newer Mujou \(file format 2\)"):
        mujou.load(path)
    for broken in ({"version": 1}, {"checksum": "x"}, "sha256:...", {"version": "1", "checksum": "x"}):
        torch.save({**tree, "@mujou-file": broken}, path)
        with pytest.raises(
            mujou.StateFileError, match=r"it is damaged: its '@mujou-file' entry is not valid"
        ):
            mujou.load(path)


# --- state.load-errors ----------------------------------------------------------------------


def good_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "good.pt"
    mujou.save({**drawer_tree(), "w": torch.arange(2000.0)}, path)
    return path.read_bytes()


def zip_without_pickle(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/other", b"not a torch file")


class Trap:
    """Unpickling it would call print."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (print, ("code ran",))


BAD_FILES: list[tuple[str, Callable[[Path, bytes], object], str]] = [
    ("empty", lambda p, good: p.write_bytes(b""), r"it is empty$"),
    (
        "truncated",
        lambda p, good: p.write_bytes(good[: len(good) // 2]),
        r"it is truncated, or not a file torch\.save writes",
    ),
    (
        "end cut",
        lambda p, good: p.write_bytes(good[:-10]),
        r"it is truncated, or not a file torch\.save writes",
    ),
    (
        "random",
        lambda p, good: p.write_bytes(bytes(range(256)) * 20),
        r"it is truncated, or not a file torch\.save writes",
    ),
    (
        "text",
        lambda p, good: p.write_text("hello\n", encoding="utf-8"),
        r"it is truncated, or not a file torch\.save writes",
    ),
    (
        "pickle",
        lambda p, good: p.write_bytes(pickle.dumps({"a": 1})),
        r"it is truncated, or not a file torch\.save writes",
    ),
    (
        "legacy torch",
        lambda p, good: torch.save({"a": torch.zeros(1)}, p, _use_new_zipfile_serialization=False),
        r"it is truncated, or not a file torch\.save writes",
    ),
    (
        "other zip",
        lambda p, good: zip_without_pickle(p),
        r"it is a zip archive, but not one torch\.save writes",
    ),
    (
        "a tensor",
        lambda p, good: torch.save(torch.zeros(3), p),
        r"it holds a torch\.Tensor, not a state tree \(a dict\)$",
    ),
    ("a list", lambda p, good: torch.save([1, 2], p), r"it holds a list, not a state tree \(a dict\)$"),
    (
        "numpy",
        lambda p, good: torch.save({"a": np.zeros(2)}, p),
        r"it holds an object of \(or built by\) numpy\.",
    ),
    (
        "defaultdict",
        lambda p, good: torch.save({"a": collections.defaultdict(int)}, p),
        r"it holds an object of \(or built by\) collections\.defaultdict, which a state file cannot hold",
    ),
    (
        "code",
        lambda p, good: torch.save({"a": Trap()}, p),
        r"it holds an object of \(or built by\) (builtins\.)?print, ",
    ),
    ("pickle bytes", lambda p, good: p.write_bytes(damage_pickle(good)), r"it is damaged"),
]


def damage_pickle(good: bytes) -> bytes:
    """``good`` with the first bytes of its data.pkl record overwritten (its CRC is not checked)."""
    data = bytearray(good)
    at = data.find(b"data.pkl") + len(b"data.pkl")
    at = data.find(b"\x80\x02", at)  # the pickle's PROTO 2 opcode: the record's data begins
    data[at + 2 : at + 6] = b"\xff\xfe\xfd\xfc"
    return bytes(data)


@pytest.mark.rule("state.load-errors")
@pytest.mark.parametrize(("what", "make", "reason"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_file_that_is_no_state_file_raises_state_file_error(
    tmp_path: Path, what: str, make: Callable[[Path, bytes], object], reason: str
) -> None:
    """> mujou.load raises mujou.StateFileError, a ValueError, when the file is empty,
    truncated, not a file that torch.save writes, damaged, holds objects other than the values
    of state.save-values, or holds no dict: its message names the file and what is wrong, it
    is chained from the error that showed it, and it never advises loading with
    weights_only=False."""
    path = tmp_path / f"{what}.pt"
    make(path, good_bytes(tmp_path))
    with pytest.raises(mujou.StateFileError) as info:
        mujou.load(path)
    error = info.value
    assert isinstance(error, ValueError)
    assert error.path == str(path)
    assert str(error).startswith(f"cannot load the state file {str(path)!r}: "), str(error)
    assert re.search(reason, str(error)), f"{str(error)!r} does not match {reason!r}"
    if what not in ("empty", "a tensor", "a list", "other zip"):
        assert error.__cause__ is not None, "not chained from the error that showed it"
    shown = "\n".join(traceback.format_exception_only(e)[-1] for e in shown_chain(error))
    assert "weights_only" not in shown, f"the error advises weights_only:\n{shown}"


@pytest.mark.rule("state.load-errors")
def test_a_file_that_cannot_be_opened_raises_the_os_error_of_open(tmp_path: Path) -> None:
    """> A file that cannot be opened (missing, a directory, not readable) raises the OSError
    of open, which names it."""
    with pytest.raises(FileNotFoundError) as missing:
        mujou.load(tmp_path / "missing.pt")
    assert str(tmp_path / "missing.pt") in str(missing.value)
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(OSError) as folder:  # IsADirectoryError; PermissionError on Windows
        mujou.load(tmp_path / "dir.pt")
    assert str(tmp_path / "dir.pt") in str(folder.value)
    if POSIX and not ROOT:
        locked = tmp_path / "locked.pt"
        locked.write_bytes(good_bytes(tmp_path))
        locked.chmod(0o000)
        with pytest.raises(PermissionError) as unreadable:
            mujou.load(locked)
        assert str(locked) in str(unreadable.value)


# --- state.save-temporary and observe.trace-start with writers in other processes ------------

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    import mujou

    class Still(mujou.Node):
        pass

    class One(mujou.Net):
        def __init__(self):
            super().__init__()
            self.still = Still()

    real_save = torch.save

    def save_then_wait_then_die(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.flush()
        print("written", flush=True)
        sys.stdin.readline()  # the test looks at the files of a writer still saving
        os.kill(os.getpid(), signal.SIGKILL)  # killed mid-save: before the rename

    torch.save = save_then_wait_then_die
    run = mujou.run(One(), timer=mujou.VirtualTimer(), trace=sys.argv[2])
    mujou.save({"from": "child", "x": torch.zeros(3)}, sys.argv[1])
    """
)


@contextlib.contextmanager
def child_saving(path: Path, trace: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process that runs a net with ``trace=trace`` and stops in mid-save of ``path``."""
    here = str(Path(mujou.__file__).resolve().parent.parent)  # this mujou, not another
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(trace)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=HANG_GUARD)


LOOKALIKES = [
    ".state.pt.backup",
    ".state.pt.tmp",
    ".state.pt.12345.tmp",
    ".state.pt.0a1b2c3d-1-0a1b2c3d.tmp",
    "state.pt.tmp",
    ".run.json.old",
]


@pytest.mark.skipif(not POSIX, reason="the child kills itself with SIGKILL")
@pytest.mark.rule("state.save-temporary")
@pytest.mark.rule("observe.trace-start")
def test_the_temporary_files_of_a_killed_writer_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    """> mujou.save writes to a temporary file beside the path [...] and before it removes the
    temporary files of the same path whose writer is gone: those of a process of this machine
    that has ended (killed while it saved). It never removes the temporary file of a writer
    that is still saving to the same path (another process [...]) [...] or any other file.

    > mujou.run(net, trace=path) creates the trace's temporary file beside path [...] before any
    node starts, named, cleaned up after killed runs [...] as those of mujou.save are."""
    path, trace = tmp_path / "state.pt", tmp_path / "run.json"
    for name in LOOKALIKES:
        (tmp_path / name).write_text("keep", encoding="utf-8")

    def saves() -> list[str]:
        return [n for n in temporaries(tmp_path, "state.pt") if n not in LOOKALIKES]

    def traces() -> list[str]:
        return temporaries(tmp_path, "run.json")

    tree = drawer_tree()
    with child_saving(path, trace) as child:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line == "written\n", f"the child did not save: {line!r} {child.communicate()[1]}"
        (live_save,), (live_trace,) = saves(), traces()
        # Another writer saves the same path, and runs with the same trace, meanwhile.
        mujou.save(tree, path)
        with mujou.run(Bag(d=Drawer()), timer=vt(), trace=trace) as run:
            run.sleep(0.5)
        assert (saves(), traces()) == ([live_save], [live_trace]), "a live writer's file was removed"
        child.stdin.write("go on\n")
        child.stdin.flush()
        assert child.wait(timeout=HANG_GUARD) == -signal.SIGKILL
    # Killed mid-save: its files stay until the next writer of the same path, which removes them.
    assert (saves(), traces()) == ([live_save], [live_trace])
    assert_same(mujou.load(path), tree)  # the kill left the file whole
    mujou.save(tree, path)
    assert (saves(), traces()) == ([], [live_trace]), "a save removed only what it must"
    run = mujou.run(Bag(d=Drawer()), timer=vt(), trace=trace)
    try:
        (own,) = traces()
        assert own != live_trace, "the killed run's temporary file is left"
    finally:
        run.stop()
    assert traces() == []
    for name in LOOKALIKES:
        assert (tmp_path / name).read_text(encoding="utf-8") == "keep", f"{name} was changed"


@pytest.mark.rule("state.save-temporary")
def test_a_save_keeps_the_temporary_file_of_another_thread_saving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """> It never removes the temporary file of a writer that is still saving to the same path
    (another process, or another thread of this one)."""
    path = tmp_path / "s.pt"
    written, release = threading.Event(), threading.Event()
    real_save = torch.save

    def slow_in_one_thread(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
        real_save(obj, f, *args, **kwargs)
        if threading.current_thread().name == "slow-saver":
            written.set()
            assert release.wait(HANG_GUARD), "hang guard: never released"

    monkeypatch.setattr(torch, "save", slow_in_one_thread)
    errors: list[BaseException] = []

    def save_slowly() -> None:
        try:
            mujou.save({"from": "thread"}, path)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=save_slowly, name="slow-saver")
    thread.start()
    try:
        assert written.wait(HANG_GUARD), "hang guard: the thread did not write"
        (theirs,) = temporaries(tmp_path, "s.pt")
        mujou.save({"from": "main"}, path)
        assert temporaries(tmp_path, "s.pt") == [theirs], "the other thread's file was removed"
        assert mujou.load(path) == {"from": "main"}
    finally:
        release.set()
        thread.join(HANG_GUARD)
    assert not errors, errors
    assert mujou.load(path) == {"from": "thread"}
    assert temporaries(tmp_path, "s.pt") == []


# --- state.file-mode ------------------------------------------------------------------------


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Set the process's umask for the block (one test at a time per process, under xdist too)."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.skipif(not POSIX, reason="file modes and the umask are POSIX")
@pytest.mark.rule("state.file-mode")
@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002, 0o000])
def test_a_new_state_file_gets_the_mode_open_gives(tmp_path: Path, mask: int) -> None:
    """> A file that mujou.save creates gets the mode that open(path, "w") gives a new file,
    0o666 less the process's umask."""
    with umask(mask):
        mujou.save({"x": torch.zeros(1)}, tmp_path / "s.pt")
        with open(tmp_path / "plain", "w", encoding="utf-8"):
            pass
    assert mode(tmp_path / "s.pt") == mode(tmp_path / "plain") == 0o666 & ~mask, oct(mode(tmp_path / "s.pt"))


@pytest.mark.skipif(not POSIX, reason="file modes and the umask are POSIX")
@pytest.mark.rule("state.file-mode")
def test_a_replaced_state_file_keeps_its_mode(tmp_path: Path) -> None:
    """> a file it replaces keeps its mode."""
    path = tmp_path / "s.pt"
    with umask(0o022):
        mujou.save({"x": torch.zeros(1)}, path)
        for kept in (0o600, 0o640, 0o604):
            path.chmod(kept)
            mujou.save({"x": torch.ones(1)}, path)
            assert mode(path) == kept, f"{oct(mode(path))} instead of {oct(kept)}"


# --- observe.trace-start --------------------------------------------------------------------


@pytest.mark.rule("observe.trace-start")
def test_the_trace_file_is_created_before_any_node_starts(tmp_path: Path) -> None:
    """> mujou.run(net, trace=path) creates the trace's temporary file beside path (and the
    missing directories above it) before any node starts."""
    folder = tmp_path / "new" / "traces"
    seen: list[list[str]] = []

    class Looks(mujou.Node):
        def on_start(self) -> None:
            seen.append(temporaries(folder, "t.json"))

    with mujou.run(Bag(looks=Looks()), timer=vt(), trace=folder / "t.json") as run:
        run.sleep(0.25)
    assert len(seen) == 1 and len(seen[0]) == 1, f"at on_start, the temporary files were {seen}"
    assert sorted(p.name for p in folder.iterdir()) == ["t.json"]


UNWRITABLE: list[tuple[str, type[OSError]]] = [
    ("a directory", IsADirectoryError),
    ("under a file", NotADirectoryError),
    ("read-only directory", PermissionError),
]


@pytest.mark.rule("observe.trace-start")
@pytest.mark.parametrize(("where", "error"), UNWRITABLE, ids=[u[0] for u in UNWRITABLE])
def test_a_trace_path_that_cannot_be_written_is_refused_at_the_start(
    tmp_path: Path, where: str, error: type[OSError]
) -> None:
    """> A path that cannot be written (a directory, a directory without write permission,
    under a file) raises the OSError of its cause from mujou.run, naming trace= and the path,
    and starts nothing."""
    if where == "a directory":
        path = tmp_path / "t.json"
        path.mkdir()
    elif where == "under a file":
        (tmp_path / "file").write_text("a file", encoding="utf-8")
        path = tmp_path / "file" / "t.json"
    else:
        if not POSIX or ROOT:
            pytest.skip("permissions do not stop root (or are not POSIX here)")
        (tmp_path / "locked").mkdir(mode=0o500)
        path = tmp_path / "locked" / "t.json"
    log: list[str] = []
    net = Bag(d=Drawer(log=log))
    where_ = re.escape(f"trace={str(path)!r}")
    with pytest.raises(error, match=rf"^\[Errno \d+\] {where_} cannot be written: "):
        mujou.run(net, timer=vt(), trace=path)
    assert log == [], "a node started"
    with mujou.run(net, timer=vt()) as run:  # nothing was left of the refused start
        run.sleep(0.25)
    assert log == ["on_start"]


@pytest.mark.rule("observe.trace-start")
def test_a_run_refused_before_any_hook_ran_leaves_no_trace_file(tmp_path: Path) -> None:
    """> A run refused before any hook ran (a tree that does not fit, a node in another run)
    leaves no file at or beside path."""
    path = tmp_path / "t.json"
    tree = drawer_tree()
    misfit = {"@mujou": tree["@mujou"], "other": tree["d"]}
    with pytest.raises(ValueError, match=r"^Error\(s\) in loading state"):
        mujou.run(Bag(d=Drawer()), timer=vt(), state=misfit, trace=path)
    assert list(tmp_path.iterdir()) == []
    net = Bag(d=Drawer())
    with mujou.run(net, timer=vt()):
        with pytest.raises(RuntimeError, match=r"is in a run that has not ended"):
            mujou.run(net, timer=vt(), trace=path)
        assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not POSIX, reason="file modes and the umask are POSIX")
@pytest.mark.rule("observe.trace-start")
def test_the_trace_file_gets_the_mode_open_gives(tmp_path: Path) -> None:
    """> [...] given its mode as those of mujou.save are (state.file-mode)."""
    with umask(0o027):
        with mujou.run(Bag(d=Drawer()), timer=vt(), trace=tmp_path / "t.json") as run:
            run.sleep(0.25)
        assert mode(tmp_path / "t.json") == 0o640, oct(mode(tmp_path / "t.json"))
        (tmp_path / "t.json").chmod(0o600)
        with mujou.run(Bag(d=Drawer()), timer=vt(), trace=tmp_path / "t.json") as run:
            run.sleep(0.25)
        assert mode(tmp_path / "t.json") == 0o600, oct(mode(tmp_path / "t.json"))
