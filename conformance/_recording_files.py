"""Recording files written with ``mcap``'s own writer, following the layout of
spec/en/record-and-replay.md, for the tests of reading: files a run could not make on demand
(cut, from another version, not a recording). Tensors are encoded with the ``protobuf``
package, against the ``mujou.Tensor`` schema the file stores.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import mujou

mcap_writer = pytest.importorskip("mcap.writer")
descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
message_factory = pytest.importorskip("google.protobuf.message_factory")
descriptor_pool = pytest.importorskip("google.protobuf.descriptor_pool")

_FIELDS = [  # mujou.Tensor (proto3): name, number, type, label
    ("shape", 1, "TYPE_INT64", "LABEL_REPEATED"),
    ("dtype", 2, "TYPE_STRING", "LABEL_OPTIONAL"),
    ("f32", 3, "TYPE_FLOAT", "LABEL_REPEATED"),
    ("f64", 4, "TYPE_DOUBLE", "LABEL_REPEATED"),
    ("i64", 5, "TYPE_SFIXED64", "LABEL_REPEATED"),
    ("b", 6, "TYPE_BOOL", "LABEL_REPEATED"),
    ("raw", 7, "TYPE_BYTES", "LABEL_OPTIONAL"),
    ("i32", 8, "TYPE_SFIXED32", "LABEL_REPEATED"),
]


def tensor_schema() -> bytes:
    """A FileDescriptorSet holding ``mujou.Tensor``."""
    proto = descriptor_pb2.FileDescriptorProto(name="mujou/tensor.proto", package="mujou", syntax="proto3")
    message = proto.message_type.add(name="Tensor")
    for name, number, kind, label in _FIELDS:
        message.field.add(
            name=name,
            number=number,
            type=getattr(descriptor_pb2.FieldDescriptorProto, kind),
            label=getattr(descriptor_pb2.FieldDescriptorProto, label),
        )
    return bytes(descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString())


def _tensor_class() -> Any:
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(tensor_schema()).file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("mujou.Tensor"))


def encode(tensor: torch.Tensor) -> bytes:
    """A float32, float64, int64, int32 or bool tensor as a ``mujou.Tensor`` message."""
    message = _tensor_class()(shape=list(tensor.shape), dtype=str(tensor.dtype).removeprefix("torch."))
    field = {
        torch.float32: "f32",
        torch.float64: "f64",
        torch.int64: "i64",
        torch.int32: "i32",
        torch.bool: "b",
    }[tensor.dtype]
    getattr(message, field).extend(tensor.flatten().tolist())
    return bytes(message.SerializeToString())


Port = Mapping[str, str]  # a channel's metadata


def tensor_port(
    node: str, port: str, *, dtype: str = "float32", shape: Sequence[int] = (3,), period: str = "0.1"
) -> dict[str, str]:
    """The channel metadata of a tensor port."""
    return {
        "node": node,
        "port": port,
        "dtype": dtype,
        "shape": json.dumps(list(shape)),
        "period": period,
        "device": "cpu",
        "kind": "tensor",
        "layout": json.dumps("tensor"),
    }


def write(
    target: Path | io.BytesIO,
    ports: Sequence[Port],
    messages: Sequence[tuple[int, float, int, torch.Tensor]],
    *,
    keyframes: Mapping[float, Mapping[str, Any]] | None = None,
    version: str = mujou.__version__,
    end: bool = True,
    lost: int = 0,
    chunk_size: int = 1024 * 1024,
    compression: str = "none",
    identify: bool = True,
) -> None:
    """Write a recording: ``messages`` are ``(port index, time s, microstep, tensor)``.

    ``end=False`` leaves it as a killed run does: no ``mujou.end``, no summary, its last chunk
    still in memory (lost). ``identify=False`` leaves out the ``mujou`` metadata record.
    """
    stream = io.BytesIO() if isinstance(target, Path) else target
    writer = mcap_writer.Writer(
        stream,
        chunk_size=chunk_size,
        compression=mcap_writer.CompressionType[compression.upper()],
    )
    writer.start(profile="mujou", library="conformance")
    if identify:
        writer.add_metadata(
            "mujou",
            {
                "version": version,
                "torch": torch.__version__,
                "python": "3.11",
                "timer": "virtual",
                "seed": "0",
                "workers": "1",
                "state_every": "1.0" if keyframes else "",
            },
        )
    writer.add_metadata("mujou.net", {"structure": json.dumps({"nodes": [p["node"] for p in ports]})})
    schema = writer.register_schema("mujou.Tensor", "protobuf", tensor_schema())
    channels = [
        writer.register_channel(f"/{p['node']}/{p['port']}", "protobuf", schema, dict(p)) for p in ports
    ]
    for time, tree in sorted((keyframes or {}).items()):
        time_ns = round(time * 1e9)
        writer.add_attachment(
            create_time=time_ns,
            log_time=time_ns,
            name=f"state/{time_ns}",
            media_type="application/x-mujou-state",
            data=_saved_bytes(tree),
        )
    for port, time, microstep, tensor in messages:
        time_ns = round(time * 1e9)
        writer.add_message(channels[port], time_ns, encode(tensor), time_ns, sequence=microstep)
    if end:
        last = max((round(time * 1e9) for _, time, _, _ in messages), default=0)
        writer.add_metadata(
            "mujou.end", {"lost": str(lost), "messages": str(len(messages)), "end_time_ns": str(last)}
        )
        writer.finish()
    if isinstance(target, Path):
        target.write_bytes(stream.getvalue())


def _saved_bytes(tree: Mapping[str, Any]) -> bytes:
    """The bytes ``mujou.save`` writes for ``tree``."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.pt"
        mujou.save(dict(tree), path)
        return path.read_bytes()


def records(data: bytes) -> list[tuple[int, int, int]]:
    """The top-level records of an MCAP file's bytes: ``(opcode, offset, length)``, up to a cut."""
    found = []
    offset = 8  # past the magic
    while offset + 9 <= len(data):
        opcode, length = data[offset], int.from_bytes(data[offset + 1 : offset + 9], "little")
        found.append((opcode, offset, length))
        offset += 9 + length
    return found
