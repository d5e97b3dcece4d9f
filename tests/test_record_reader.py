"""The reader's private side (mujou/_record/_reader.py, _mcapfile.py): tensors that share their
chunk's buffer, and the pass over a file a crash left with zeros at its end.

The files are made by mujou.Recorder, under the virtual timer.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
import torch

import mujou

pytest.importorskip("mcap")


class Flags(mujou.Node):
    """Sends 64 bools a step: one byte each, so no decoded tensor is copied for alignment."""

    y = mujou.Output()

    def __init__(self) -> None:
        super().__init__(period=0.1)

    def on_start(self) -> None:
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.y.send(torch.arange(64) % (self.n + 1) == 0)


class One(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.flags = Flags()


def record(path: Path, compression: str | None) -> None:
    recorder = mujou.Recorder(path, compression=compression)
    with mujou.run(One(), timer=mujou.VirtualTimer(), record=recorder) as run:
        run.sleep(1.0)


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_tensors_of_one_chunk_are_views_of_one_buffer(tmp_path: Path, compression: str | None) -> None:
    path = tmp_path / "flags.mcap"
    record(path, compression)
    with mujou.Recording(path) as recording:
        values = [message.value for message in recording.messages()]
    assert len(values) == 10
    # One record per message, all of one length: in one buffer, their data lie that far apart.
    steps = {b.data_ptr() - a.data_ptr() for a, b in itertools.pairwise(values)}
    assert len(steps) == 1, steps
    (step,) = steps
    assert 64 < step < 200  # the payload and the record's header: no allocation in between
    assert all(value.dtype == torch.bool and value.shape == (64,) for value in values)


def test_zeros_after_the_last_record_are_a_cut(tmp_path: Path) -> None:
    path = tmp_path / "flags.mcap"
    record(path, None)
    data = path.read_bytes()
    # As a killed run's file after a crash of the machine: no summary, its tail zero-filled.
    from mcap.reader import SeekingReader

    with path.open("rb") as file:
        summary = SeekingReader(file).get_summary()
    assert summary is not None
    end = max(index.chunk_start_offset + index.chunk_length for index in summary.chunk_indexes)
    crashed = tmp_path / "crashed.mcap"
    crashed.write_bytes(data[:end] + bytes(4096))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recording = mujou.Recording(crashed)
    assert [type(warning.message) for warning in caught] == [mujou.TruncatedRecordingWarning]
    with recording:
        assert recording.cut is not None
        assert "bytes that are no MCAP record (opcode 0)" in recording.cut
        assert len(list(recording.messages())) == 10
