"""Mujou's own MCAP writer (mujou/_record/_mcapwrite.py) and what the recorder process unpickles
(mujou/_record/_sink.py)."""

from __future__ import annotations

import io
import pickle
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mujou._record import _mcapwrite, _sink

mcap_writer = pytest.importorskip("mcap.writer")
mcap_reader = pytest.importorskip("mcap.reader")
pytest.importorskip("zstandard")
pytest.importorskip("lz4")

# One call of a writer: a message (channel, log time, size, sequence), an attachment or metadata.
_message = st.tuples(
    st.just("message"),
    st.integers(0, 2),
    st.integers(0, 2**40),
    st.integers(0, 3000),
    st.integers(0, 2**32 - 1),
)
_other = st.sampled_from([("attachment",), ("metadata",), ("channel",)])
_calls = st.lists(st.one_of(_message, _message, _message, _other), max_size=60)


def _write(writer: Any, calls: list[tuple[Any, ...]]) -> None:
    """The same calls, in the same order, on mcap's writer or Mujou's."""
    writer.start(profile="mujou", library="test")
    schema = writer.register_schema("mujou.Tensor", "protobuf", b"the schema")
    channels = [writer.register_channel("/a/out", "protobuf", schema, {"node": "a", "ü": "é"})]
    for n, call in enumerate(calls):
        if call[0] == "message":
            _, channel, log_time, size, sequence = call
            data = bytes(range(256)) * (size // 256) + bytes(size % 256)
            writer.add_message(channels[channel % len(channels)], log_time, data, log_time + 1, sequence)
        elif call[0] == "attachment":
            writer.add_attachment(n, 2 * n, f"state/{n}", "application/x-mujou-state", bytes(n))
        elif call[0] == "metadata":
            writer.add_metadata(f"m{n}", {"n": str(n)})
        else:
            channels.append(writer.register_channel(f"/c{n}/out", "protobuf", schema, {}))
    writer.add_metadata("mujou.end", {"lost": "0"})
    writer.finish()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    calls=_calls,
    chunk_size=st.sampled_from([1, 500, 4096, 1 << 20]),
    compression=st.sampled_from([None, "zstd", "lz4"]),
)
def test_the_file_is_the_one_mcaps_writer_writes(
    calls: list[tuple[Any, ...]], chunk_size: int, compression: str | None
) -> None:
    """For any calls, Mujou's writer writes the bytes mcap's writer writes with its defaults (the
    chunks, their CRC, the message indexes, the summary), and mcap's reader, with CRCs checked,
    reads them back. Planted: a chunk's start time taken from the offsets (index[1::2]); the
    message index of a channel without the channel id's record; the summary's CRC without the
    footer's head. Each fails here."""
    kinds = mcap_writer.CompressionType
    kind = {None: kinds.NONE, "zstd": kinds.ZSTD, "lz4": kinds.LZ4}[compression]
    theirs = io.BytesIO()
    _write(mcap_writer.Writer(theirs, chunk_size=chunk_size, compression=kind), calls)
    ours = io.BytesIO()
    _write(_mcapwrite.Writer(ours, chunk_size=chunk_size, compression=compression), calls)
    assert ours.getvalue() == theirs.getvalue()
    ours.seek(0)
    reader = mcap_reader.make_reader(ours, validate_crcs=True)
    sent = [call for call in calls if call[0] == "message"]
    read = list(reader.iter_messages(log_time_order=False))
    assert [(m.log_time, m.sequence, len(m.data)) for _, _, m in read] == [(c[2], c[4], c[3]) for c in sent]


def test_the_recorder_process_unpickles_plain_values_only() -> None:
    """A feed record that names a class is refused with a clear error, so that the recorder
    process never imports a module (torch) for one. Planted: the header's torch version left a
    torch.TorchVersion (str() taken away in _recorder._header): the recorder process imported
    torch at each start (two seconds of CPU), and every recording test fails with this error."""
    assert _sink.plain_loads(pickle.dumps(("mujou", {"torch": str(torch.__version__)}))) == (
        "mujou",
        {"torch": str(torch.__version__)},
    )
    with pytest.raises(ValueError, match=r"torch\.torch_version\.TorchVersion.*only plain values"):
        _sink.plain_loads(pickle.dumps(("mujou", {"torch": torch.__version__})))
