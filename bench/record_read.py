"""Reading a recording: the seek to a time in a 1 GB recording, Mujou's reader and ``mcap``'s.

The recording is written once with ``mcap``'s own writer, in Mujou's layout (one tensor port,
4 KiB float32 messages at 1 kHz, uncompressed 1 MiB chunks, a keyframe-free run), and kept in
the temporary folder for later runs (its name says its size). A seek is the time from an open
reader to the first message at or after a time, drawn at random over the recording; the
reader's opening (its summary) is timed apart. ``mcap``'s own reader does the same seeks on
the same file in the same process (its ``iter_messages(starting_at=...)``). The messages are
encoded with Mujou's own encoder (private, as a recorder uses it), so that no protobuf package
is needed here.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch

import mujou
from mujou._record import _encoding

from ._common import Metrics

ELEMENTS = 1024  # float32 per message: 4 KiB
RATE = 1000  # messages per second of timer time
CHUNK = 1 << 20


def recording(gigabytes: float) -> Path:
    """The recording of about ``gigabytes`` GB, written once with mcap's writer."""
    from mcap.writer import CompressionType, Writer

    path = Path(tempfile.gettempdir()) / f"mujou-bench-seek-{gigabytes:g}GB-v1.mcap"
    if path.exists():
        return path
    count = int(gigabytes * 1e9) // (ELEMENTS * 4 + 60)  # the payload, its header, its index
    partial = path.with_suffix(".partial")
    with partial.open("wb") as stream:
        writer = Writer(stream, chunk_size=CHUNK, compression=CompressionType.NONE)
        writer.start(profile="mujou", library="bench")
        writer.add_metadata(
            "mujou",
            {
                "version": mujou.__version__,
                "torch": torch.__version__,
                "python": "",
                "timer": "virtual",
                "seed": "{}",
                "workers": "1",
                "state_every": "",
            },
        )
        schema = writer.register_schema(_encoding.TENSOR_SCHEMA_NAME, "protobuf", _encoding.tensor_schema())
        metadata = {
            "node": "camera",
            "port": "frame",
            "dtype": "float32",
            "shape": json.dumps([ELEMENTS]),
            "period": repr(1 / RATE),
            "device": "cpu",
            "kind": "tensor",
            "layout": json.dumps("tensor"),
        }
        channel = writer.register_channel("/camera/frame", "protobuf", schema, metadata)
        base = torch.arange(ELEMENTS, dtype=torch.float32)
        for index in range(count):
            time_ns = index * (1_000_000_000 // RATE)
            writer.add_message(channel, time_ns, _encoding.encode_tensor(base + index), time_ns, 0)
        end_ns = count * (1_000_000_000 // RATE)
        writer.add_metadata("mujou.end", {"lost": "0", "messages": str(count), "end_time_ns": str(end_ns)})
        writer.finish()  # type: ignore[no-untyped-call]  # mcap leaves it unannotated
    os.replace(partial, path)
    return path


def seek(gigabytes: float = 1.0, seeks: int = 30, seed: int = 0) -> Metrics:
    """Open the recording, then seek ``seeks`` times, with Mujou's reader and with mcap's."""
    from mcap.reader import make_reader

    path = recording(gigabytes)
    mujou.Recording(path).close()  # the first open imports mcap: not timed
    began = time.perf_counter()
    reader = mujou.Recording(path)
    opened = time.perf_counter() - began
    times = random.Random(seed).sample(range(int(reader.end * RATE)), seeks)
    ours: list[float] = []
    with reader:
        for step in times:
            target = step / RATE
            began = time.perf_counter()
            message = next(reader.messages(start=target))
            ours.append(time.perf_counter() - began)
            if message.time != target or message.value[0].item() != step:
                raise AssertionError(f"the seek to {target} found {message.time}")
    theirs: list[float] = []
    with path.open("rb") as file:
        mcap_reader = make_reader(file)
        began = time.perf_counter()
        summary = mcap_reader.get_summary()
        mcap_opened = time.perf_counter() - began
        chunks = len(summary.chunk_indexes) if summary is not None else 0
        for step in times:
            time_ns = step * (1_000_000_000 // RATE)
            began = time.perf_counter()
            _, _, record = next(iter(mcap_reader.iter_messages(starting_at=time_ns)))
            theirs.append(time.perf_counter() - began)
            if record.log_time != time_ns:
                raise AssertionError(f"mcap's seek to {time_ns} found {record.log_time}")
    ours.sort()
    theirs.sort()
    return {
        "file_gb": path.stat().st_size / 1e9,
        "chunks": float(chunks),
        "open_ms": 1e3 * opened,
        "seek_p50_ms": 1e3 * ours[len(ours) // 2],
        "seek_max_ms": 1e3 * ours[-1],
        "mcap_open_ms": 1e3 * mcap_opened,
        "mcap_seek_p50_ms": 1e3 * theirs[len(theirs) // 2],
        "mcap_seek_max_ms": 1e3 * theirs[-1],
    }
