"""What a state file holds: the values ``mujou.load`` reads back, and the digest of a tree.

``mujou.load`` reads with ``torch.load(weights_only=True)``, whose unpickler builds only the
types below (``torch._weights_only_unpickler``'s default allowlist): so ``mujou.save`` refuses
anything else, naming where it is, instead of writing a file that fails only at the resume
(:ref:`state.save-values`). Types are matched exactly: a subclass (an ``IntEnum``, a
``NamedTuple``, a ``defaultdict``, a tensor subclass) is pickled under its own class, which the
unpickler refuses.

The digest covers the content of a tree as ``mujou.load`` returns it: its structure, keys and
plain values, and each tensor's class, dtype, shape and bytes. It is recomputed from the loaded
tree, so any change of the file that changes what loads is caught (:ref:`state.file-checksum`).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ._cpus import usable_cpus

ALLOWED = (
    "tensors (torch.Tensor, torch.nn.Parameter), None, bools, ints, floats, complex numbers, "
    "strings, bytes, torch dtypes, devices and sizes, and dicts, lists, tuples and sets of them"
)
ATOMS: frozenset[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes, bytearray}
    | {torch.dtype, torch.device, torch.layout, torch.qscheme}
)
SEQUENCES: frozenset[type] = frozenset({list, tuple, torch.Size})
MAPPINGS: frozenset[type] = frozenset({dict, OrderedDict, Counter})
TENSORS: frozenset[type] = frozenset({torch.Tensor, torch.nn.Parameter})
ALGORITHM = "sha256+crc32"  # NOTE [ the checksum of a tree ]
CHUNK = 1 << 24  # bytes of a tensor one CRC-32 covers: 16 MiB, a fair share for a thread
PARALLEL_FROM = 1 << 25  # bytes of tensors from which the CRCs are computed on several threads
MAX_THREADS = 8  # beyond this, reading the memory, not computing, bounds the speed
Update = Callable[[bytes | bytearray | memoryview], None]  # a hasher's update


def type_name(kind: type) -> str:
    """A type's name as a user writes it: ``int``, ``numpy.ndarray``, ``pathlib.PosixPath``."""
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def problems(tree: Mapping[Any, Any], root: str = "tree") -> list[str]:
    """Where ``tree`` holds a value ``mujou.load`` could not read back, and what it is."""
    found: list[str] = []
    _check(tree, root, found, set())
    return found


def _check(value: object, path: str, found: list[str], active: set[int]) -> None:
    kind = type(value)
    if kind in ATOMS:
        return
    if kind in TENSORS:
        assert isinstance(value, torch.Tensor)
        state = getattr(value, "__dict__", None)
        if state:  # pickled with the tensor: its attributes must be state values too
            for name, item in state.items():
                _check(item, f"{path}.{name}", found, active)
        return
    if kind not in MAPPINGS and kind not in SEQUENCES and kind is not set:
        found.append(f"{path} is a {type_name(kind)}")
        return
    if id(value) in active:  # a container holding itself: pickled by reference, fine
        return
    active.add(id(value))
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check(key, f"a key of {path}", found, active)
            _check(item, f"{path}[{key!r}]", found, active)
    else:
        assert isinstance(value, Iterable)
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]" if kind is not set else f"an element of {path}", found, active)
    active.discard(id(value))


def digest(tree: Mapping[Any, Any]) -> str:
    """The digest of ``tree``'s content, as ``"sha256+crc32:HEX"``.

    NOTE [ the checksum of a tree ]: SHA-256 over the tree's structure, keys, plain values and
    each tensor's class, dtype and shape, then over the CRC-32 of each :data:`CHUNK` of each
    tensor's bytes, in order. CRC-32 catches every burst of up to 32 changed bits and misses a
    random change once in 2**32, as the zip format's own checks do; it is three times as fast as
    SHA-256 here (62 against 172 ms per 100 MB), and the chunks are checked on several threads
    (zlib releases the GIL), so a large state loads at nearly the speed of the file.
    """
    hasher = hashlib.sha256()
    buffers: list[memoryview] = []
    _feed(hasher.update, tree, {}, buffers)
    hasher.update(b"".join(crc.to_bytes(4, "little") for crc in _crcs(buffers)))
    return f"{ALGORITHM}:{hasher.hexdigest()}"


def _crcs(buffers: list[memoryview]) -> list[int]:
    """The CRC-32 of each CHUNK of each buffer, in order; on several threads for large ones."""
    chunks = [buffer[i : i + CHUNK] for buffer in buffers for i in range(0, max(buffer.nbytes, 1), CHUNK)]
    threads = min(usable_cpus(), len(chunks), MAX_THREADS)
    if threads < 2 or sum(buffer.nbytes for buffer in buffers) < PARALLEL_FROM:
        return [zlib.crc32(chunk) for chunk in chunks]
    with ThreadPoolExecutor(threads, thread_name_prefix="mujou-checksum") as pool:
        return list(pool.map(zlib.crc32, chunks))


def _feed(update: Update, value: Any, active: dict[int, int], buffers: list[memoryview]) -> None:
    """Feed ``value`` to ``update``, unambiguously: a tag, then a length or a fixed size.

    The bytes of tensors go to ``buffers``, to be checked by CRC-32 at the end.
    """
    kind = type(value)
    if kind is type(None):
        update(b"N")
    elif kind is bool:
        update(b"T" if value else b"F")
    elif kind is int:
        update(b"i" + value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True) + b";")
    elif kind is float:
        update(b"f" + struct.pack("<d", value))
    elif kind is complex:
        update(b"c" + struct.pack("<dd", value.real, value.imag))
    elif kind is str:
        _bytes(update, b"s", value.encode("utf-8", "surrogatepass"))
    elif kind is bytes or kind is bytearray:
        _bytes(update, b"b" if kind is bytes else b"B", value)
    elif kind in ATOMS:  # dtype, device, layout, qscheme
        _bytes(update, type_name(kind).encode(), str(value).encode())
    elif kind in TENSORS:
        _tensor(update, value, active, buffers)
    elif id(value) in active:  # the container that holds it, by its depth
        update(b"@" + str(active[id(value)]).encode() + b";")
    else:
        active[id(value)] = len(active)
        _bytes(update, type_name(kind).encode(), str(len(value)).encode())
        if kind is set:
            parts = []
            for item in value:  # a set's order is not kept: its elements' digests, sorted
                part, theirs = hashlib.sha256(), list[memoryview]()
                _feed(part.update, item, active, theirs)
                part.update(b"".join(crc.to_bytes(4, "little") for crc in _crcs(theirs)))
                parts.append(part.digest())
            update(b"".join(sorted(parts)))
        elif isinstance(value, Mapping):
            for key, item in value.items():
                _feed(update, key, active, buffers)
                _feed(update, item, active, buffers)
        else:
            for item in value:
                _feed(update, item, active, buffers)
        del active[id(value)]


def _bytes(update: Update, tag: bytes, data: bytes | bytearray) -> None:
    """``tag``, the size of ``data`` in bytes, then ``data``."""
    update(tag + str(len(data)).encode() + b":")
    update(data)


def _tensor(update: Update, tensor: torch.Tensor, active: dict[int, int], buffers: list[memoryview]) -> None:
    """A tensor's class, dtype, shape, grad flag, bytes (strided ones) and attributes."""
    head = f"{type_name(type(tensor))}|{tensor.dtype}|{tuple(tensor.shape)}|{tensor.requires_grad}"
    _bytes(update, b"t", head.encode())
    data = tensor.detach()
    if data.layout is torch.strided and not data.is_quantized and data.device.type != "meta":
        flat = data.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
        try:
            raw = flat.view(torch.uint8).numpy()  # the bytes in memory, not copied
        except (RuntimeError, TypeError):  # dtypes of less than a byte (torch.uint1, ...)
            raw = None
        if raw is not None:
            update(b"d" + str(raw.nbytes).encode() + b":")
            buffers.append(raw.data)
    elif data.layout is torch.sparse_coo:  # its indices and values, as they are stored
        _tensor(update, data._indices(), active, buffers)
        _tensor(update, data._values(), active, buffers)
    # Other layouts (compressed sparse, quantized, meta): their class, dtype and shape only.
    state = getattr(tensor, "__dict__", None)
    if state:
        _feed(update, dict(state), active, buffers)
