"""What a recording's MCAP file holds, found without reading its messages.

A whole file is opened from its summary section (``mcap``'s reader parses it): the chunk
indexes say where each chunk lies and which time range and channels it holds, the attachment
and metadata indexes where the keyframes and the metadata records are, the statistics how many
messages each channel has. A file that a killed run left has no summary: it is read by one pass
over its records, up to the last whole one, and what followed is named (:ref:`record.read-cut`).

The chunks themselves are read by :func:`read_records`: the chunk's records are read (or
decompressed) into one writable buffer, and each message's payload is a ``memoryview`` of it,
so a tensor decoded from it needs no second copy (``mcap``'s own reader copies each message's
bytes out of the chunk). The record layouts are MCAP's (https://mcap.dev/spec).
"""

from __future__ import annotations

import importlib
import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from io import BufferedReader
from typing import Any

MAGIC = b"\x89MCAP0\r\n"
_HEADER = struct.Struct("<BQ")  # a record's opcode and the length of its body
_MESSAGE = struct.Struct("<HIQQ")  # channel id, sequence, log time, publish time
_CHUNK = struct.Struct("<QQQI")  # start time, end time, uncompressed size, uncompressed CRC
_ATTACHMENT_TIMES = struct.Struct("<QQ")  # log time, create time
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
FOOTER_OPCODE = 0x02
_FOOTER_LENGTH = 20  # summary start, summary offset start, summary CRC
# Opcodes (MCAP's spec, "Records").
_SCHEMA, _CHANNEL, _MESSAGE_OP, _CHUNK_OP, _ATTACHMENT, _METADATA, _DATA_END = 3, 4, 5, 6, 9, 12, 15
_RECORDS = {  # what each opcode is, for the note on a cut file
    0x01: "header",
    0x02: "footer",
    0x03: "schema",
    0x04: "channel",
    0x05: "message",
    0x06: "chunk",
    0x07: "message index",
    0x08: "chunk index",
    0x09: "attachment",
    0x0A: "attachment index",
    0x0B: "statistics",
    0x0C: "metadata",
    0x0D: "metadata index",
    0x0E: "summary offset",
    0x0F: "data end",
}


class NotMcapError(ValueError):
    """The bytes are not an MCAP file (the reader turns it into its own message)."""


@dataclass(frozen=True)
class Channel:
    """A channel with its schema: a recorded port."""

    id: int
    topic: str
    encoding: str
    metadata: dict[str, str]
    schema_name: str
    schema_encoding: str
    schema_data: bytes


@dataclass(frozen=True)
class Chunk:
    """Where a chunk lies, the time range of its messages and their channels (None: unknown)."""

    start_ns: int
    end_ns: int
    offset: int  # of the chunk record, its opcode
    length: int  # of the chunk record, its 9-byte header included
    channels: frozenset[int] | None


@dataclass(frozen=True)
class Attachment:
    """An attachment's name, media type, log time and where its record lies."""

    name: str
    media_type: str
    log_time: int
    offset: int
    length: int


@dataclass
class Contents:
    """Everything a file holds but its messages."""

    channels: dict[int, Channel] = field(default_factory=dict)
    chunks: list[Chunk] = field(default_factory=list)
    attachments: list[Attachment] = field(default_factory=list)
    metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)  # messages per channel id
    cut: str | None = None  # what a pass over a file without a summary could not read
    unindexed: int = 0  # messages outside chunks: a Mujou recording writes none


def read_contents(file: BufferedReader, size: int) -> Contents:
    """The contents of an MCAP file: from its summary, or from one pass when it has none.

    Raises:
        NotMcapError: the file does not start with MCAP's magic bytes.
    """
    file.seek(0)
    if file.read(len(MAGIC)) != MAGIC:
        raise NotMcapError("it does not start with MCAP's magic bytes")
    summary_start = _summary_start(file, size)
    if summary_start:
        return _from_summary(file)
    return _from_records(file, size)


def _summary_start(file: BufferedReader, size: int) -> int:
    """The summary section's offset from the footer; 0 when there is no footer or summary."""
    footer_at = size - len(MAGIC) - _HEADER.size - _FOOTER_LENGTH
    if footer_at < len(MAGIC):
        return 0
    file.seek(footer_at)
    tail = file.read(_HEADER.size + _FOOTER_LENGTH + len(MAGIC))
    opcode, length = _HEADER.unpack_from(tail)
    if opcode != FOOTER_OPCODE or length != _FOOTER_LENGTH or tail[-len(MAGIC) :] != MAGIC:
        return 0
    start: int = _U64.unpack_from(tail, _HEADER.size)[0]
    return start if len(MAGIC) <= start < footer_at else 0


def _from_summary(file: BufferedReader) -> Contents:
    from mcap.reader import SeekingReader

    file.seek(0)
    reader = SeekingReader(file)
    summary = reader.get_summary()
    assert summary is not None  # a summary start was found
    contents = Contents()
    for channel in summary.channels.values():
        schema = summary.schemas.get(channel.schema_id)
        contents.channels[channel.id] = Channel(
            channel.id,
            channel.topic,
            channel.message_encoding,
            dict(channel.metadata),
            schema.name if schema is not None else "",
            schema.encoding if schema is not None else "",
            bytes(schema.data) if schema is not None else b"",
        )
    for index in summary.chunk_indexes:
        offsets = index.message_index_offsets
        contents.chunks.append(
            Chunk(
                index.message_start_time,
                index.message_end_time,
                index.chunk_start_offset,
                index.chunk_length,
                frozenset(offsets) if offsets else None,
            )
        )
    for entry in summary.attachment_indexes:
        contents.attachments.append(
            Attachment(entry.name, entry.media_type, entry.log_time, entry.offset, entry.length)
        )
    for record in reader.iter_metadata():
        contents.metadata[record.name] = dict(record.metadata)
    statistics = summary.statistics
    if statistics is not None:
        contents.counts = dict(statistics.channel_message_counts)
        if not contents.chunks:
            contents.unindexed = statistics.message_count
    else:
        contents.counts = _count_messages(file, contents)
    return contents


def _count_messages(file: BufferedReader, contents: Contents) -> dict[int, int]:
    """Count the messages per channel by reading every chunk (a summary without statistics)."""
    counts: dict[int, int] = {}
    for chunk in contents.chunks:
        for opcode, body, start, _ in read_records(file, chunk):
            if opcode == _MESSAGE_OP:
                channel = _U16.unpack_from(body, start)[0]
                counts[channel] = counts.get(channel, 0) + 1
    return counts


def _from_records(file: BufferedReader, size: int) -> Contents:
    """One pass over the records of a file with no summary, up to the last whole one."""
    contents = Contents()
    schemas: dict[int, tuple[str, str, bytes]] = {}
    channels: dict[int, tuple[int, str, str, dict[str, str]]] = {}
    offset = len(MAGIC)
    while True:
        if offset + _HEADER.size > size:
            if offset < size:
                contents.cut = _cut_note(size - offset, offset, "a partial record header")
            break
        file.seek(offset)
        opcode, length = _HEADER.unpack(file.read(_HEADER.size))
        if opcode not in _RECORDS:
            contents.cut = _cut_note(
                size - offset, offset, f"bytes that are no MCAP record (opcode {opcode})"
            )
            break
        end = offset + _HEADER.size + length
        if end > size:
            what = f"a partial {_RECORDS[opcode]} record"
            contents.cut = _cut_note(size - offset, offset, what)
            break
        if opcode in (_DATA_END, FOOTER_OPCODE):
            break
        if opcode == _CHUNK_OP:
            chunk = Chunk(0, 0, offset, end - offset, None)
            try:
                start_ns, end_ns = _chunk_times(file, chunk)
                ids: set[int] = set()
                for inner, body, start, stop in read_records(file, chunk):
                    _take(
                        inner,
                        body[start:stop],
                        schemas=schemas,
                        channels=channels,
                        contents=contents,
                        ids=ids,
                    )
            except (ValueError, struct.error, EOFError) as exc:
                contents.cut = _cut_note(size - offset, offset, f"a damaged chunk ({exc})")
                break
            contents.chunks.append(Chunk(start_ns, end_ns, offset, end - offset, frozenset(ids)))
        else:
            body = memoryview(file.read(length))
            if opcode == _MESSAGE_OP:
                contents.unindexed += 1
            elif opcode == _ATTACHMENT:
                log_time = _ATTACHMENT_TIMES.unpack_from(body)[0]
                name, at = _string(body, _ATTACHMENT_TIMES.size)
                media_type, _ = _string(body, at)
                contents.attachments.append(Attachment(name, media_type, log_time, offset, end - offset))
            else:
                _take(opcode, body, schemas=schemas, channels=channels, contents=contents, ids=set())
        offset = end
    for channel_id, (schema_id, topic, encoding, metadata) in channels.items():
        schema_name, schema_encoding, data = schemas.get(schema_id, ("", "", b""))
        contents.channels[channel_id] = Channel(
            channel_id, topic, encoding, metadata, schema_name, schema_encoding, data
        )
    return contents


def _take(
    opcode: int,
    body: memoryview,
    *,
    schemas: dict[int, tuple[str, str, bytes]],
    channels: dict[int, tuple[int, str, str, dict[str, str]]],
    contents: Contents,
    ids: set[int],
) -> None:
    """Keep what a record found by the pass says: a schema, channel, message or metadata."""
    if opcode == _MESSAGE_OP:
        channel = _U16.unpack_from(body)[0]
        contents.counts[channel] = contents.counts.get(channel, 0) + 1
        ids.add(channel)
    elif opcode == _SCHEMA:
        schema_id = _U16.unpack_from(body)[0]
        name, at = _string(body, 2)
        encoding, at = _string(body, at)
        data_length = _U32.unpack_from(body, at)[0]
        schemas[schema_id] = (name, encoding, bytes(body[at + 4 : at + 4 + data_length]))
    elif opcode == _CHANNEL:
        channel_id, schema_id = struct.unpack_from("<HH", body)
        topic, at = _string(body, 4)
        encoding, at = _string(body, at)
        metadata, _ = _string_map(body, at)
        channels[channel_id] = (schema_id, topic, encoding, metadata)
    elif opcode == _METADATA:
        name, at = _string(body, 0)
        contents.metadata[name], _ = _string_map(body, at)


def _cut_note(count: int, offset: int, what: str) -> str:
    return f"the last {count} bytes, from offset {offset}, hold {what} and were not read"


def _string(body: memoryview, at: int) -> tuple[str, int]:
    length = _U32.unpack_from(body, at)[0]
    end = at + 4 + length
    if end > len(body):
        raise ValueError("a string runs past its record")
    return str(body[at + 4 : end], "utf-8"), end


def _string_map(body: memoryview, at: int) -> tuple[dict[str, str], int]:
    end = at + 4 + _U32.unpack_from(body, at)[0]
    at += 4
    found: dict[str, str] = {}
    while at < end:
        key, at = _string(body, at)
        found[key], at = _string(body, at)
    return found, end


def _chunk_times(file: BufferedReader, chunk: Chunk) -> tuple[int, int]:
    file.seek(chunk.offset + _HEADER.size)
    start_ns, end_ns, _, _ = _CHUNK.unpack(file.read(_CHUNK.size))
    return start_ns, end_ns


def read_records(file: BufferedReader, chunk: Chunk) -> Iterator[tuple[int, memoryview, int, int]]:
    """The records of a chunk: ``(opcode, buffer, start, end)``, the body at ``buffer[start:end]``.

    The chunk's records are read into one ``bytearray`` (decompressed when the chunk is), which
    every body is a view of.

    Raises:
        ValueError: the chunk's compression is unknown, or its records overrun it.
        ImportError: the chunk is compressed with lz4 or zstd and that package is missing.
    """
    file.seek(chunk.offset + _HEADER.size)
    head = file.read(_CHUNK.size + 4)
    _, _, uncompressed_size, _ = _CHUNK.unpack_from(head)
    name_length = _U32.unpack_from(head, _CHUNK.size)[0]
    compression = file.read(name_length).decode("utf-8")
    records_length = _U64.unpack(file.read(8))[0]
    if compression == "":
        data = bytearray(records_length)
        if file.readinto(data) != records_length:
            raise EOFError("the chunk ends early")
    else:
        data = _decompress(compression, file.read(records_length), uncompressed_size)
    view = memoryview(data)
    at = 0
    while at < len(data):
        opcode, length = _HEADER.unpack_from(view, at)
        start = at + _HEADER.size
        at = start + length
        if at > len(data):
            raise ValueError(f"a record runs past the end of its chunk at offset {chunk.offset}")
        yield opcode, view, start, at


def message_fields(body: memoryview, start: int) -> tuple[int, int, int]:
    """A message record's channel id, sequence and log time."""
    channel, sequence, log_time, _ = _MESSAGE.unpack_from(body, start)
    return channel, sequence, log_time


MESSAGE_DATA = _MESSAGE.size  # where a message's payload starts in its body


def _decompress(compression: str, data: bytes, size: int) -> bytearray:
    if compression == "lz4":
        out: bytearray = _package("lz4.frame", compression).decompress(data, return_bytearray=True)
        return out
    if compression != "zstd":
        raise ValueError(f"a chunk is compressed with {compression!r}; Mujou reads 'lz4', 'zstd' and none")
    out = bytearray(size)
    with _package("zstandard", compression).ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
        filled = 0
        while filled < size:
            read = reader.readinto(memoryview(out)[filled:])
            if read == 0:
                raise EOFError("the zstd chunk ends early")
            filled += read
    return out


def _package(name: str, compression: str) -> Any:
    """The module ``name`` that decompresses ``compression``, or ImportError saying how to get it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(
            f"reading a chunk compressed with {compression} needs the {name.partition('.')[0]} package: "
            "pip install 'mujou[record]'"
        ) from None


def read_attachment_data(file: BufferedReader, attachment: Attachment) -> bytes:
    """The data of an attachment."""
    file.seek(attachment.offset + _HEADER.size)
    body = memoryview(file.read(attachment.length - _HEADER.size))
    _, at = _string(body, _ATTACHMENT_TIMES.size)
    _, at = _string(body, at)
    length = _U64.unpack_from(body, at)[0]
    return bytes(body[at + 8 : at + 8 + length])
