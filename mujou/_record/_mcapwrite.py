"""Mujou's own MCAP writer: the recorder process's and a snapshot's.

It writes what ``mcap``'s ``Writer`` writes with its defaults (the records, chunks, message
indexes and summary of https://mcap.dev/spec, with the chunk's CRC), with the same methods, for
less Python a message: a message is one header packed into the chunk, its bytes copied after it
and two ints kept for its channel's message index. ``mcap``'s writer builds a record object and
a statistics update for each message, and copies the chunk three more times before it reaches
the file; for small messages that Python was the recorder's bound (4.6 µs a message of 256 B,
against 0.8 µs here). What a chunk's time range and each channel's count need is worked out once
per chunk, from the message indexes. The files are read back with ``mcap``'s own reader in the
tests (conformance/test_record.py).

This module imports the standard library only (and the compressor of a compressed chunk): the
recorder process imports it without torch.
"""

from __future__ import annotations

import importlib
import struct
import sys
import zlib
from array import array
from collections.abc import Callable
from typing import Any, Protocol

MAGIC = b"\x89MCAP0\r\n"
_RECORD = struct.Struct("<BQ")  # opcode, length of the body
_MESSAGE = struct.Struct("<BQHIQQ")  # the record's header, channel id, sequence, log and publish time
_MESSAGE_BODY = 22  # the bytes of a message's body before its data
_CHUNK = struct.Struct("<QQQI")  # start time, end time, uncompressed size, uncompressed CRC
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SUMMARY_OFFSET = struct.Struct("<BQQ")
_FOOTER = struct.Struct("<QQI")
_STATISTICS = struct.Struct("<QHIIIIQQ")
# Opcodes (MCAP's spec, "Records").
_HEADER, _FOOTER_OP, _SCHEMA, _CHANNEL, _MESSAGE_OP, _CHUNK_OP = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06
_MESSAGE_INDEX, _CHUNK_INDEX, _ATTACHMENT, _ATTACHMENT_INDEX = 0x07, 0x08, 0x09, 0x0A
_STATISTICS_OP, _METADATA, _METADATA_INDEX, _SUMMARY_OFFSET_OP, _DATA_END = 0x0B, 0x0C, 0x0D, 0x0E, 0x0F
_LITTLE = sys.byteorder == "little"


class Stream(Protocol):
    """What the writer writes to: a file opened for binary writing."""

    def write(self, data: bytes | bytearray | memoryview, /) -> int: ...

    def tell(self) -> int: ...


def _string(text: str) -> bytes:
    data = text.encode()
    return _U32.pack(len(data)) + data


def _string_map(values: dict[str, str]) -> bytes:
    body = b"".join(_string(key) + _string(value) for key, value in values.items())
    return _U32.pack(len(body)) + body


def _record(opcode: int, body: bytes | bytearray) -> bytes:
    return _RECORD.pack(opcode, len(body)) + body


def _compressor(compression: str | None) -> tuple[str, Callable[[bytes | bytearray], bytes] | None]:
    """The name written in a chunk and the function that compresses it (None: stored)."""
    if compression is None:
        return "", None
    modules = {"zstd": "zstandard", "lz4": "lz4.frame"}
    if compression not in modules:
        raise ValueError(f"compression must be 'zstd', 'lz4' or None, got {compression!r}")
    compress: Callable[[bytes | bytearray], bytes] = importlib.import_module(modules[compression]).compress
    return compression, compress


class Writer:
    """Writes an MCAP file to ``stream``, in chunks of about ``chunk_size`` bytes of records,
    each compressed with ``compression`` ("zstd", "lz4" or None).

    The methods are ``mcap.writer.Writer``'s: :meth:`start`, :meth:`register_schema`,
    :meth:`register_channel`, :meth:`add_message`, :meth:`add_attachment`,
    :meth:`add_metadata`, :meth:`finish`.
    """

    def __init__(self, stream: Stream, *, chunk_size: int, compression: str | None) -> None:
        self._stream = stream
        self._chunk_size = chunk_size
        self._compression, self._compress = _compressor(compression)
        self._chunk = bytearray()
        # Channel id -> [log time, offset in the chunk, ...] of the chunk's messages.
        self._indexes: dict[int, list[int]] = {}
        self._schemas: list[bytes] = []  # the records, for the summary
        self._channels: list[bytes] = []
        self._chunk_indexes: list[bytes] = []
        self._attachment_indexes: list[bytes] = []
        self._metadata_indexes: list[bytes] = []
        self._counts: dict[int, int] = {}  # messages per channel id
        self._start_time: int | None = None
        self._end_time = 0
        self._attachments = 0
        self._metadata = 0

    def start(self, profile: str = "", library: str = "") -> None:
        """The magic bytes and the header record."""
        self._stream.write(MAGIC + _record(_HEADER, _string(profile) + _string(library)))

    def register_schema(self, name: str, encoding: str, data: bytes) -> int:
        """A new schema's id (1, 2, ...); its record goes in the chunk and the summary."""
        schema_id = len(self._schemas) + 1
        record = _record(
            _SCHEMA, _U16.pack(schema_id) + _string(name) + _string(encoding) + _U32.pack(len(data)) + data
        )
        self._schemas.append(record)
        self._chunk += record
        return schema_id

    def register_channel(
        self, topic: str, message_encoding: str, schema_id: int, metadata: dict[str, str] | None = None
    ) -> int:
        """A new channel's id (1, 2, ...); its record goes in the chunk and the summary."""
        channel_id = len(self._channels) + 1
        body = (
            struct.pack("<HH", channel_id, schema_id)
            + _string(topic)
            + _string(message_encoding)
            + _string_map(metadata or {})
        )
        record = _record(_CHANNEL, body)
        self._channels.append(record)
        self._chunk += record
        return channel_id

    def add_message(
        self, channel_id: int, log_time: int, data: bytes | memoryview, publish_time: int, sequence: int = 0
    ) -> None:
        """A message into the chunk (copied), which is written once it holds ``chunk_size`` bytes."""
        chunk = self._chunk
        index = self._indexes.get(channel_id)
        if index is None:
            index = self._indexes[channel_id] = []
        index += (log_time, len(chunk))
        chunk += _MESSAGE.pack(
            _MESSAGE_OP, _MESSAGE_BODY + len(data), channel_id, sequence, log_time, publish_time
        )
        chunk += data
        if len(chunk) > self._chunk_size:
            self._finish_chunk()

    def add_attachment(
        self, create_time: int, log_time: int, name: str, media_type: str, data: bytes
    ) -> None:
        """An attachment record, written now (before the chunk begun, as ``mcap`` does)."""
        body = bytearray(_U64.pack(log_time) + _U64.pack(create_time) + _string(name) + _string(media_type))
        body += _U64.pack(len(data))
        body += data
        body += _U32.pack(zlib.crc32(body))
        offset = self._stream.tell()
        self._stream.write(_record(_ATTACHMENT, body))
        self._attachments += 1
        index = (
            _U64.pack(offset)
            + _U64.pack(_RECORD.size + len(body))
            + _U64.pack(log_time)
            + _U64.pack(create_time)
            + _U64.pack(len(data))
            + _string(name)
            + _string(media_type)
        )
        self._attachment_indexes.append(_record(_ATTACHMENT_INDEX, index))

    def add_metadata(self, name: str, data: dict[str, str]) -> None:
        """A metadata record, written now (before the chunk begun, as ``mcap`` does)."""
        record = _record(_METADATA, _string(name) + _string_map(data))
        offset = self._stream.tell()
        self._stream.write(record)
        self._metadata += 1
        index = _U64.pack(offset) + _U64.pack(len(record)) + _string(name)
        self._metadata_indexes.append(_record(_METADATA_INDEX, index))

    def _finish_chunk(self) -> None:
        """Write the chunk begun (if it holds a message) and its message indexes."""
        indexes = self._indexes
        if not indexes:
            return
        chunk = self._chunk
        start = min(min(index[0::2]) for index in indexes.values())
        end = max(max(index[0::2]) for index in indexes.values())
        data: bytes | bytearray = chunk if self._compress is None else self._compress(chunk)
        head = _CHUNK.pack(start, end, len(chunk), zlib.crc32(chunk)) + _string(self._compression)
        head += _U64.pack(len(data))
        stream = self._stream
        chunk_offset = stream.tell()
        chunk_length = _RECORD.size + len(head) + len(data)
        stream.write(_RECORD.pack(_CHUNK_OP, len(head) + len(data)) + head)
        stream.write(data)
        index_offset = chunk_offset + chunk_length
        offsets = bytearray()
        records = bytearray()
        for channel_id, index in indexes.items():
            offsets += _U16.pack(channel_id) + _U64.pack(index_offset + len(records))
            entries = array("Q", index)
            if not _LITTLE:  # pragma: no cover (no big-endian machine in CI)
                entries.byteswap()
            body = _U16.pack(channel_id) + _U32.pack(len(entries) * 8) + entries.tobytes()
            records += _record(_MESSAGE_INDEX, body)
            self._counts[channel_id] = self._counts.get(channel_id, 0) + len(index) // 2
        stream.write(records)
        self._start_time = start if self._start_time is None else min(start, self._start_time)
        self._end_time = max(end, self._end_time)
        self._chunk_indexes.append(
            _record(
                _CHUNK_INDEX,
                _U64.pack(start)
                + _U64.pack(end)
                + _U64.pack(chunk_offset)
                + _U64.pack(chunk_length)
                + _U32.pack(len(offsets))
                + offsets
                + _U64.pack(len(records))
                + _string(self._compression)
                + _U64.pack(len(data))
                + _U64.pack(len(chunk)),
            )
        )
        self._chunk = bytearray()
        indexes.clear()

    def finish(self) -> None:
        """The last chunk, the data end, the summary, the footer and the magic bytes."""
        self._finish_chunk()
        stream = self._stream
        stream.write(_record(_DATA_END, _U32.pack(0)))
        summary_start = stream.tell()
        counts = b"".join(_U16.pack(channel) + _U64.pack(count) for channel, count in self._counts.items())
        statistics = _STATISTICS.pack(
            sum(self._counts.values()),
            len(self._schemas),
            len(self._channels),
            self._attachments,
            self._metadata,
            len(self._chunk_indexes),
            self._start_time or 0,
            self._end_time,
        )
        groups = [
            (_SCHEMA, self._schemas),
            (_CHANNEL, self._channels),
            (_STATISTICS_OP, [_record(_STATISTICS_OP, statistics + _U32.pack(len(counts)) + counts)]),
            (_CHUNK_INDEX, self._chunk_indexes),
            (_ATTACHMENT_INDEX, self._attachment_indexes),
            (_METADATA_INDEX, self._metadata_indexes),
        ]
        summary = bytearray()
        offsets = bytearray()
        for opcode, records in groups:
            group_start = summary_start + len(summary)
            for record in records:
                summary += record
            body = _SUMMARY_OFFSET.pack(opcode, group_start, summary_start + len(summary) - group_start)
            offsets += _record(_SUMMARY_OFFSET_OP, body)
        offset_start = summary_start + len(summary)
        summary += offsets
        footer_head = (
            _RECORD.pack(_FOOTER_OP, _FOOTER.size) + _FOOTER.pack(summary_start, offset_start, 0)[:16]
        )
        crc = zlib.crc32(footer_head, zlib.crc32(summary))
        stream.write(bytes(summary) + footer_head + _U32.pack(crc) + MAGIC)


def new_writer(stream: Any, chunk_size: int, compression: str | None, library: str) -> Writer:
    """A writer on ``stream``, started: the recorder process's and a snapshot's."""
    started = Writer(stream, chunk_size=chunk_size, compression=compression)
    started.start(profile="mujou", library=library)
    return started
