"""Messages as protobuf bytes and back, and the schemas that describe them, without protobuf.

A recording stores each message in protobuf's wire format so that any protobuf decoder (and
Foxglove's Plot panel, which reads numeric fields and arrays) reads it against the schema stored
beside it: a serialized ``google.protobuf.FileDescriptorSet``, also written here. Only the small
part of protobuf that Mujou writes is implemented: varints, fixed-width and length-delimited fields.

NOTE [ the mujou.Tensor message ]
``mujou.Tensor`` (proto3, file ``mujou/tensor.proto``)::

    message Tensor {
      repeated int64 shape = 1;     // packed; absent for a 0-d tensor
      string dtype = 2;             // torch's name without "torch.": "float32", "bfloat16"
      repeated float f32 = 3;       // float32
      repeated double f64 = 4;      // float64
      repeated sfixed64 i64 = 5;    // int64
      repeated bool b = 6;          // bool
      bytes raw = 7;                // any other dtype: its little-endian bytes
      repeated sfixed32 i32 = 8;    // int32
    }

A dtype has a field of its own when its memory *is* the packed field's wire form: float32,
float64, int64 (as ``sfixed64``, not ``sint64``), int32 (``sfixed32``) and bool (one byte, 0 or
1). Then encoding is one copy of the tensor's bytes and decoding is none: ``torch.frombuffer``
over the payload's slice. (``sint64``'s zigzag varints would cost a Python step per element
both ways.) Every other dtype (float16, bfloat16, complex, uint8, int8, int16, unsigned, float8)
goes to ``raw``: readable, not plottable. Elements are written in C order; at most one data field
is present, none when the tensor is empty. A big-endian host is refused at encode and decode.

NOTE [ structured messages ]
A nest (:ref:`ports.message`) becomes a message of its own, ``mujou.<Node>_<port>`` in file
``mujou/<Node>_<port>.proto``: one field per child of the top container, in order, numbered from
1; a child container becomes a nested message type (``C<number>``), a tensor a ``mujou.Tensor``,
``bool`` a ``bool``, ``int`` a ``sint64`` (an int outside int64 a ``string`` of its digits),
``float`` a ``double``, ``str`` a ``string``; ``None`` has no field. Field names are the dict keys,
NamedTuple and dataclass fields, made identifiers (``item_<i>`` for list and tuple items); a
dict's keys in sorted order, as optree flattens it (a decoded dict has its keys sorted). Every
field is written, defaults included. The layout (JSON, in the channel's metadata) says how to
rebuild the nest from the fields: see :func:`plan`. Messages whose structure or leaf kinds differ
need another plan (another channel: the recorder makes one per structure).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib
import json
import math
import re
import struct
import sys
import threading
import warnings
from collections import namedtuple
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch

from .._messages import flatten

TENSOR_SCHEMA_NAME = "mujou.Tensor"
TENSOR_FILE = "mujou/tensor.proto"

# wire types
_VARINT = 0
_I64 = 1
_LEN = 2
_I32 = 5

# FieldDescriptorProto.Type and .Label
_T_DOUBLE = 1
_T_FLOAT = 2
_T_INT64 = 3
_T_BOOL = 8
_T_STRING = 9
_T_MESSAGE = 11
_T_BYTES = 12
_T_SFIXED32 = 15
_T_SFIXED64 = 16
_T_SINT64 = 18
_OPTIONAL = 1
_REPEATED = 3

_FIELD_OF_DTYPE: dict[torch.dtype, int] = {
    torch.float32: 3,
    torch.float64: 4,
    torch.int64: 5,
    torch.bool: 6,
    torch.int32: 8,
}
_RAW = 7
_DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in vars(torch).values()
    if isinstance(dtype, torch.dtype)
}
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _check_byteorder() -> None:
    if sys.byteorder != "little":
        raise RuntimeError("recordings are written and read on little-endian hosts only")


# --- writing the wire format ------------------------------------------------------------------


def varint(value: int) -> bytes:
    """``value`` (>= 0, or a negative int64 as its two's complement) as a protobuf varint."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _key(number: int, wire: int) -> bytes:
    return varint((number << 3) | wire)


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, _LEN) + varint(len(payload)) + payload


def _str_field(number: int, text: str) -> bytes:
    return _len_field(number, text.encode())


def _int_field(number: int, value: int) -> bytes:
    return _key(number, _VARINT) + varint(value)


# --- tensors ----------------------------------------------------------------------------------

_DTYPE_FIELDS: dict[torch.dtype, bytes] = {dtype: _str_field(2, name) for name, dtype in _DTYPES.items()}


def tensor_parts(tensor: torch.Tensor) -> tuple[int, list[Any]]:
    """The ``mujou.Tensor`` encoding of ``tensor`` as parts to join, and their total length.

    ``tensor`` must be on the CPU. The data part is a view of the tensor's memory (of a
    contiguous copy when it is not contiguous), valid while the parts are alive: join them
    (:func:`encode_tensor`) before the tensor can change.
    """
    tensor, head, nbytes = _prepared(tensor)
    if not nbytes:
        return len(head), [head]
    return len(head) + nbytes, [head, tensor_bytes(tensor)]


def _prepared(tensor: torch.Tensor) -> tuple[torch.Tensor, bytes, int]:
    """``tensor`` detached and contiguous, the bytes of its encoding before its data, and the
    bytes of its data: what :func:`tensor_parts` and :func:`encode_tensor` start from."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor, tensor_head(tensor.dtype, tensor.shape), tensor.nbytes


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A byte view of a contiguous CPU tensor's memory (no copy); keeps the tensor alive."""
    nbytes = tensor.nbytes
    array = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
    array._mujou_tensor = tensor  # type: ignore[attr-defined]  # keeps the memory alive with the view
    return memoryview(array).cast("B")


_SMALL_TENSOR = 1 << 16  # bytes: a smaller tensor's bytes are copied out whole (fewer calls)
_MAX_HEADS = 1024  # the (dtype, shape) heads kept; past this many, forgotten all at once
_heads: dict[tuple[torch.dtype, tuple[int, ...]], bytes] = {}


def tensor_head(dtype: torch.dtype, shape: tuple[int, ...]) -> bytes:
    """The bytes of a ``mujou.Tensor`` of ``dtype`` and ``shape`` before its data (all of them
    for an empty tensor): its shape, its dtype and its data field's key and length. They depend
    on the dtype and shape only, and are kept for each."""
    key = (dtype, shape)
    head = _heads.get(key)
    if head is not None:
        return head
    _check_byteorder()
    parts = []
    if shape:
        packed = b"".join(varint(size) for size in shape)
        parts.append(b"\x0a" + varint(len(packed)) + packed)
    parts.append(_DTYPE_FIELDS[dtype])
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes:
        parts.append(_key(_FIELD_OF_DTYPE.get(dtype, _RAW), _LEN) + varint(nbytes))
    head = b"".join(parts)
    if len(_heads) >= _MAX_HEADS:
        _heads.clear()
    _heads[key] = head
    return head


def encode_tensor(tensor: torch.Tensor) -> bytes:
    """The ``mujou.Tensor`` bytes of a CPU ``tensor`` (one join)."""
    tensor, head, nbytes = _prepared(tensor)
    if not nbytes:
        return head
    if nbytes < _SMALL_TENSOR:
        return head + ctypes.string_at(tensor.data_ptr(), nbytes)
    return b"".join((head, tensor_bytes(tensor)))


class _Fields:
    """The fields of one protobuf message: number -> list of (wire type, value or (start, end))."""

    __slots__ = ("fields",)

    def __init__(self) -> None:
        self.fields: dict[int, list[tuple[int, int]]] = {}


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes: the message is corrupt")


def parse(data: memoryview, start: int = 0, end: int | None = None) -> dict[int, list[tuple[int, int, int]]]:
    """The fields of the protobuf message ``data[start:end]``.

    Returns field number -> its occurrences ``(wire type, value, end)``: for a varint, the value
    and 0; for a fixed field, its offset and end; for a length-delimited one, its payload's
    offset and end (offsets into ``data``).
    """
    if end is None:
        end = len(data)
    fields: dict[int, list[tuple[int, int, int]]] = {}
    pos = start
    while pos < end:
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
            entry = (wire, value, 0)
        elif wire == _LEN:
            size, pos = _read_varint(data, pos)
            entry = (wire, pos, pos + size)
            pos += size
        elif wire == _I64:
            entry = (wire, pos, pos + 8)
            pos += 8
        elif wire == _I32:
            entry = (wire, pos, pos + 4)
            pos += 4
        else:
            raise ValueError(f"wire type {wire} of field {number}: the message is corrupt or not Mujou's")
        if pos > end:
            raise ValueError(f"field {number} runs past the end of its message: the message is cut")
        fields.setdefault(number, []).append(entry)
    return fields


_quieted: list[bool] = []  # made non-empty once torch's warning about a read-only buffer is spent
_quiet_lock = threading.Lock()


def _frombuffer(data: memoryview, dtype: torch.dtype, count: int, offset: int) -> torch.Tensor:
    """``torch.frombuffer`` over ``data``, also when it is read-only (then the tensor must not be
    changed in place: the decoded message is read-only, as any received message is)."""
    if data.readonly and not _quieted:
        # torch warns once per process that the buffer is not writable; the first time is here
        with _quiet_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.frombuffer(data, dtype=dtype, count=count, offset=offset)
            _quieted.append(True)
            return tensor
    return torch.frombuffer(data, dtype=dtype, count=count, offset=offset)


def decode_tensor(
    data: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> torch.Tensor:
    """The tensor of the ``mujou.Tensor`` bytes ``data[start:end]``, over ``data``'s memory.

    No copy is made where the data's place in ``data`` is aligned for its dtype: the tensor's
    memory is then ``data``'s (which it keeps alive). A misaligned one is copied once.
    Raises ValueError for bytes that are not a ``mujou.Tensor`` Mujou wrote.
    """
    _check_byteorder()
    view = data if isinstance(data, memoryview) else memoryview(data)
    fields = parse(view, start, end)
    shape: list[int] = []
    for wire, value, stop in fields.get(1, ()):
        if wire == _VARINT:
            shape.append(value)
        else:
            pos = value
            while pos < stop:
                size, pos = _read_varint(view, pos)
                shape.append(size)
    dtype_entries = fields.get(2)
    if not dtype_entries:
        raise ValueError("a mujou.Tensor without a dtype: the message is corrupt or not Mujou's")
    _, first, last = dtype_entries[-1]
    name = bytes(view[first:last]).decode()
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise ValueError(f"unknown dtype {name!r} in a mujou.Tensor (this torch has no torch.{name})")
    numel = 1
    for size in shape:
        numel *= size
    number = _FIELD_OF_DTYPE.get(dtype, _RAW)
    entries = fields.get(number)
    if numel == 0 or not entries:
        if numel:
            raise ValueError(f"a mujou.Tensor of shape {shape} without its data: the message is corrupt")
        return torch.empty(shape, dtype=dtype)
    if len(entries) != 1 or entries[0][0] != _LEN:
        raise ValueError(f"field {number} of a mujou.Tensor is not one packed run: not written by Mujou")
    _, first, last = entries[0]
    itemsize = dtype.itemsize
    if last - first != numel * itemsize:
        raise ValueError(
            f"a mujou.Tensor of shape {shape} and dtype {name} has {last - first} bytes of data, "
            f"expected {numel * itemsize}: the message is corrupt"
        )
    tensor = _frombuffer(view, dtype, numel, first)
    if tensor.data_ptr() % itemsize:
        # torch's kernels assume aligned elements (a complex128 op on a misaligned one crashes):
        # then one copy, into a bytearray, whose memory (Python's allocator) is 16-byte aligned
        tensor = torch.frombuffer(bytearray(view[first:last]), dtype=dtype)
    return tensor.view(shape)


@functools.cache
def tensor_file() -> bytes:
    """The ``FileDescriptorProto`` of ``mujou/tensor.proto`` (the ``mujou.Tensor`` message);
    made once (a few hundred µs: the first message of each tensor port registered it)."""
    fields = [
        _field_proto("shape", 1, _T_INT64, _REPEATED),
        _field_proto("dtype", 2, _T_STRING, _OPTIONAL),
        _field_proto("f32", 3, _T_FLOAT, _REPEATED),
        _field_proto("f64", 4, _T_DOUBLE, _REPEATED),
        _field_proto("i64", 5, _T_SFIXED64, _REPEATED),
        _field_proto("b", 6, _T_BOOL, _REPEATED),
        _field_proto("raw", 7, _T_BYTES, _OPTIONAL),
        _field_proto("i32", 8, _T_SFIXED32, _REPEATED),
    ]
    message = _message_proto("Tensor", fields, [])
    return _file_proto(TENSOR_FILE, [], [message])


def tensor_schema() -> bytes:
    """The schema data of a tensor channel: a ``FileDescriptorSet`` holding ``mujou.Tensor``."""
    return _len_field(1, tensor_file())


# --- descriptors ------------------------------------------------------------------------------


def _field_proto(name: str, number: int, type_: int, label: int, type_name: str = "") -> bytes:
    out = _str_field(1, name) + _int_field(3, number) + _int_field(4, label) + _int_field(5, type_)
    if type_name:
        out += _str_field(6, type_name)
    return out + _str_field(10, _json_name(name))


def _message_proto(name: str, fields: list[bytes], nested: list[bytes]) -> bytes:
    return (
        _str_field(1, name)
        + b"".join(_len_field(2, field) for field in fields)
        + b"".join(_len_field(3, message) for message in nested)
    )


def _file_proto(name: str, dependencies: list[str], messages: list[bytes]) -> bytes:
    return (
        _str_field(1, name)
        + _str_field(2, "mujou")
        + b"".join(_str_field(3, dependency) for dependency in dependencies)
        + b"".join(_len_field(4, message) for message in messages)
        + _str_field(12, "proto3")
    )


def _json_name(name: str) -> str:
    """protoc's JSON name of a field: lowerCamelCase of its snake_case name."""
    out: list[str] = []
    upper = False
    for char in name:
        if char == "_":
            upper = True
        elif upper:
            out.append(char.upper())
            upper = False
        else:
            out.append(char)
    return "".join(out)


_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


def identifier(text: str) -> str:
    """``text`` made a protobuf identifier: other characters become ``_``; never starts with a digit."""
    name = _IDENTIFIER.sub("_", text)
    if not name or name[0].isdigit():
        name = "f_" + name
    return name


# --- structured messages ----------------------------------------------------------------------

# Leaf kinds, as the layout names them
TENSOR = "tensor"
_SCALAR_KINDS: dict[type, str] = {bool: "bool", int: "int", float: "float", str: "str", type(None): "none"}
_BIG_INT = "bigint"  # an int outside int64, written as its digits


class Plan(NamedTuple):
    """How messages of one structure are written: the channel's schema and layout.

    ``key`` identifies the structure (a message with another key needs another plan),
    ``schema_name`` and ``schema_data`` are the channel's schema, ``layout`` the JSON of the
    nest (channel metadata ``layout``) that :func:`decode_message` rebuilds it from.
    """

    key: object
    schema_name: str
    schema_data: bytes
    layout: str


def leaf_kind(leaf: object) -> str:
    """The layout's kind of a leaf: tensor, bool, int, bigint, float, str or none."""
    if isinstance(leaf, torch.Tensor):
        return TENSOR
    kind = _SCALAR_KINDS[type(leaf)]
    if kind == "int" and not _INT64_MIN <= leaf <= _INT64_MAX:  # type: ignore[operator]  # an int here
        return _BIG_INT
    return kind


def structure_key(message: object) -> object:
    """What a plan depends on: the nest's structure and its leaves' kinds (hashable)."""
    if isinstance(message, torch.Tensor):
        return TENSOR
    leaves, spec = flatten(message)
    return spec, tuple(leaf_kind(leaf) for leaf in leaves)


def key_of(spec: optree.PyTreeSpec, leaves: list[Any]) -> object:
    """:func:`structure_key` of the nest with ``spec`` and ``leaves`` (already flattened)."""
    return spec, tuple(leaf_kind(leaf) for leaf in leaves)


def plan(message: object, name: str) -> Plan:
    """The plan for messages structured as ``message``, of the port named ``name`` (``node.port``).

    A tensor's plan is ``mujou.Tensor``'s; a nest's names its message ``mujou.<node>_<port>``
    (an identifier made of ``name``). The layout is JSON: ``"tensor"`` for a tensor channel, else
    the nest as a tree of ``{"kind": "dict"|"list"|"tuple"|"namedtuple"|"dataclass", "names":
    [...], "fields": [...], "children": [...], "type": "module:qualname"}`` (names: the keys or
    attribute names; fields: the protobuf field name of each child) and of leaf kinds
    (``"tensor"``, ``"bool"``, ``"int"``, ``"bigint"``, ``"float"``, ``"str"``, ``"none"``).
    """
    if isinstance(message, torch.Tensor):
        return Plan(TENSOR, TENSOR_SCHEMA_NAME, tensor_schema(), json.dumps(TENSOR))
    leaves, spec = flatten(message)
    kinds = tuple(leaf_kind(leaf) for leaf in leaves)
    layout = _layout(spec, iter(kinds))
    top = identifier(name.replace(".", "_"))
    file_name = f"mujou/{top}.proto"
    described = _describe(top, layout)
    schema = _len_field(1, tensor_file()) + _len_field(1, _file_proto(file_name, [TENSOR_FILE], [described]))
    return Plan((spec, kinds), f"mujou.{top}", schema, json.dumps(layout))


def _layout(spec: optree.PyTreeSpec, kinds: Any) -> Any:
    if spec.is_leaf():
        return next(kinds)
    kind = spec.kind
    children = [_layout(child, kinds) for child in spec.children()]
    names: list[str]
    node: dict[str, Any]
    if kind == optree.PyTreeKind.DICT:
        names = [str(key) for key in spec.entries()]
        node = {"kind": "dict"}
    elif kind == optree.PyTreeKind.LIST:
        names = [f"item_{i}" for i in range(len(children))]
        node = {"kind": "list"}
    elif kind == optree.PyTreeKind.TUPLE:
        names = [f"item_{i}" for i in range(len(children))]
        node = {"kind": "tuple"}
    elif kind == optree.PyTreeKind.NAMEDTUPLE:
        cls = spec.type
        assert cls is not None
        names = list(cls._fields)  # type: ignore[attr-defined]  # a NamedTuple class
        node = {"kind": "namedtuple", "type": f"{cls.__module__}:{cls.__qualname__}"}
    else:  # a dataclass, registered in Mujou's namespace
        cls = spec.type
        assert cls is not None
        names = [str(entry) for entry in spec.entries()]
        node = {"kind": "dataclass", "type": f"{cls.__module__}:{cls.__qualname__}"}
    node["names"] = names
    node["fields"] = _field_names(names)
    node["children"] = children
    return node


def _field_names(names: list[str]) -> list[str]:
    """Distinct protobuf field names (and JSON names) for ``names``, in order."""
    taken: set[str] = set()
    out: list[str] = []
    for name in names:
        base = identifier(name)
        field, n = base, 1
        while field.lower() in taken or _json_name(field).lower() in taken:
            n += 1
            field = f"{base}_{n}"
        taken.update((field.lower(), _json_name(field).lower()))
        out.append(field)
    return out


_SCALAR_TYPES = {"bool": _T_BOOL, "int": _T_SINT64, "bigint": _T_STRING, "float": _T_DOUBLE, "str": _T_STRING}


def _describe(name: str, node: dict[str, Any]) -> bytes:
    """The DescriptorProto of the message ``name`` for the container ``node`` of a layout."""
    fields: list[bytes] = []
    nested: list[bytes] = []
    for number, (field, child) in enumerate(zip(node["fields"], node["children"], strict=True), 1):
        if isinstance(child, dict):
            nested_name = f"C{number}"
            nested.append(_describe(nested_name, child))
            fields.append(_field_proto(field, number, _T_MESSAGE, _OPTIONAL, nested_name))
        elif child == TENSOR:
            fields.append(_field_proto(field, number, _T_MESSAGE, _OPTIONAL, "." + TENSOR_SCHEMA_NAME))
        elif child != "none":
            fields.append(_field_proto(field, number, _SCALAR_TYPES[child], _OPTIONAL))
    return _message_proto(name, fields, nested)


def message_parts(
    message: Any, cpu: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> tuple[int, list[Any]]:
    """The bytes of ``message`` (a tensor or a nest) as parts to join, and their total length.

    A nest is written against the plan of its structure (:func:`plan`): each child of a
    container as the field numbered by its position. ``cpu`` (default: ``Tensor.cpu``) brings a
    tensor to the CPU first.
    """
    if isinstance(message, torch.Tensor):
        return tensor_parts(message if message.is_cpu else (cpu or _to_cpu)(message))
    parts: list[Any] = []
    size = _container_parts(message, parts, cpu or _to_cpu)
    return size, parts


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def _children(container: Any) -> list[Any]:
    if isinstance(container, dict):
        return [container[key] for key in sorted(container)]  # optree's order, the layout's
    if isinstance(container, list | tuple):
        return list(container)
    return [getattr(container, field.name) for field in dataclasses.fields(container)]


def _container_parts(container: Any, parts: list[Any], cpu: Callable[[torch.Tensor], torch.Tensor]) -> int:
    size = 0
    for number, child in enumerate(_children(container), 1):
        if isinstance(child, torch.Tensor):
            inner, inner_parts = tensor_parts(child if child.is_cpu else cpu(child))
            head = _key(number, _LEN) + varint(inner)
            parts.append(head)
            parts.extend(inner_parts)
            size += len(head) + inner
        elif child is None:
            continue
        elif isinstance(child, bool):
            part = _key(number, _VARINT) + (b"\x01" if child else b"\x00")
            parts.append(part)
            size += len(part)
        elif isinstance(child, int):
            if _INT64_MIN <= child <= _INT64_MAX:
                part = _key(number, _VARINT) + varint(_zigzag(child))
            else:
                part = _len_field(number, str(child).encode())
            parts.append(part)
            size += len(part)
        elif isinstance(child, float):
            part = _key(number, _I64) + struct.pack("<d", child)
            parts.append(part)
            size += len(part)
        elif isinstance(child, str):
            part = _len_field(number, child.encode())
            parts.append(part)
            size += len(part)
        else:
            mark = len(parts)
            parts.append(b"")
            inner = _container_parts(child, parts, cpu)
            head = _key(number, _LEN) + varint(inner)
            parts[mark] = head
            size += len(head) + inner
    return size


def encode_message(message: Any) -> bytes:
    """The bytes of ``message`` (a tensor or a nest): see :func:`message_parts`."""
    return b"".join(message_parts(message)[1])


def decode_message(data: bytes | bytearray | memoryview, layout: str | Any) -> Any:
    """The message of ``data`` written against a plan whose layout is ``layout`` (JSON or parsed).

    Tensors are rebuilt over ``data``'s memory (:func:`decode_tensor`); NamedTuple and dataclass
    classes are imported by name (``module:qualname``); one that cannot be imported becomes a
    ``collections.namedtuple`` of the same name and fields (a dataclass too).
    """
    tree = json.loads(layout) if isinstance(layout, str) else layout
    view = data if isinstance(data, memoryview) else memoryview(data)
    if tree == TENSOR:
        return decode_tensor(view)
    return _rebuild(view, 0, len(view), tree)


def _rebuild(view: memoryview, start: int, end: int, node: dict[str, Any]) -> Any:
    fields = parse(view, start, end)
    values: list[Any] = []
    for number, child in enumerate(node["children"], 1):
        entries = fields.get(number)
        entry = entries[-1] if entries else None
        values.append(_value(view, entry, child))
    kind = node["kind"]
    if kind == "dict":
        return dict(zip(node["names"], values, strict=True))
    if kind == "list":
        return values
    if kind == "tuple":
        return tuple(values)
    cls = _class(node["type"], node["names"], kind)
    if kind == "namedtuple" or not dataclasses.is_dataclass(cls):
        return cls(*values)
    obj: Any = object.__new__(cls)
    for name, value in zip(node["names"], values, strict=True):
        object.__setattr__(obj, name, value)
    return obj


def _value(view: memoryview, entry: tuple[int, int, int] | None, child: Any) -> Any:
    if isinstance(child, dict):
        if entry is None:
            return _rebuild(view, 0, 0, child)
        return _rebuild(view, entry[1], entry[2], child)
    if child == "none":
        return None
    if child == TENSOR:
        if entry is None:
            raise ValueError("a tensor field is missing: the message is corrupt or not of this layout")
        return decode_tensor(view, entry[1], entry[2])
    if child == "bool":
        return bool(entry[1]) if entry else False
    if child == "int":
        if entry is None:
            return 0
        raw = entry[1]
        return (raw >> 1) ^ -(raw & 1)
    if child == "float":
        return struct.unpack_from("<d", view, entry[1])[0] if entry else 0.0
    text = bytes(view[entry[1] : entry[2]]).decode() if entry else ""
    return int(text) if child == _BIG_INT else text


_classes: dict[str, type] = {}


def _class(where: str, names: list[str], kind: str) -> type:
    """The class named ``module:qualname``, or a namedtuple standing in for it."""
    found = _classes.get(where)
    if found is not None:
        return found
    module_name, _, qualname = where.partition(":")
    cls: Any = None
    try:
        cls = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        cls = None
    ok = isinstance(cls, type) and (
        optree.is_namedtuple_class(cls) if kind == "namedtuple" else dataclasses.is_dataclass(cls)
    )
    if not ok:
        cls = _stand_in(qualname.rpartition(".")[2], names)
    _classes[where] = cls
    return cls  # type: ignore[no-any-return]  # a class found or made above


def _stand_in(name: str, names: list[str]) -> type:
    """A namedtuple called ``name`` with fields ``names`` (made identifiers)."""
    return namedtuple(identifier(name), [identifier(field) for field in names])
