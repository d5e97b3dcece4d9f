"""Conformance tests for reading a recording: ``mujou.Recording`` and ``python -m mujou record info``.

Rules: the "Reading a recording" section of spec/en/record-and-replay.md (``record.read-*``).
The files are written with ``mcap``'s own writer following the layout of the spec
(``_recording_files.py``), so that a cut file, a file of another version and files that are
not recordings can be made on demand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from _support import Bag

import mujou

pytest.importorskip("mcap")
import _recording_files as files  # (skips without mcap and protobuf)

REPO_ROOT = Path(__file__).resolve().parent.parent
PORTS = [files.tensor_port("sensor", "reading"), files.tensor_port("ctl", "u", shape=(2,), period="0.05")]


def run_messages(steps: int = 40) -> list[tuple[int, float, int, torch.Tensor]]:
    """A sensor at 10 Hz and a controller at 20 Hz (its messages at microstep 1), in tag order."""
    found = [(0, round(i * 0.1, 9), 0, torch.arange(3.0) + i) for i in range(steps)]
    found += [(1, round(i * 0.05, 9), 1, torch.full((2,), float(i))) for i in range(2 * steps)]
    return sorted(found, key=lambda message: (message[1], message[2]))


def opened(path: Path) -> mujou.Recording:
    with warnings.catch_warnings():
        warnings.simplefilter("error", mujou.MujouWarning)  # a whole file of this version: none
        return mujou.Recording(path)


def as_tuples(messages: Iterator[mujou.RecordedMessage]) -> list[tuple[str, float, int, list[float]]]:
    return [(m.port, m.time, m.microstep, m.value.tolist()) for m in messages]


def expected(
    messages: list[tuple[int, float, int, torch.Tensor]],
) -> list[tuple[str, float, int, list[float]]]:
    names = [f"{port['node']}.{port['port']}" for port in PORTS]
    return [(names[port], time, microstep, value.tolist()) for port, time, microstep, value in messages]


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    path = tmp_path / "run.mcap"
    keyframes = {0.0: {"x": torch.zeros(2)}, 1.0: {"x": torch.ones(2)}, 2.0: {"x": torch.full((2,), 2.0)}}
    files.write(path, PORTS, run_messages(), keyframes=keyframes, chunk_size=400)
    return path


# --- record.read-open ------------------------------------------------------------------------


@pytest.mark.rule("record.read-open")
def test_import_mujou_does_not_import_mcap_and_without_it_recording_says_how_to_install(
    tmp_path: Path,
) -> None:
    compressed = tmp_path / "zstd.mcap"
    files.write(compressed, PORTS, run_messages(2), compression="zstd")
    code = (
        "import sys, mujou\n"
        "assert 'mcap' not in sys.modules, 'import mujou imported mcap'\n"
        "sys.modules['zstandard'] = None\n"
        f"recording = mujou.Recording({str(compressed)!r})\n"
        "try:\n"
        "    list(recording.messages())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "sys.modules['mcap'] = None\n"
        "try:\n"
        f"    mujou.Recording({str(compressed)!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "reading a chunk compressed with zstd needs the zstandard package: pip install 'mujou[record]'",
        "reading a recording needs the mcap package: pip install 'mujou[record]'",
    ], result.stdout


@pytest.mark.rule("record.read-open")
def test_opening_reads_the_summary_only_and_close_ends_reading(recording: Path) -> None:
    # Damage the records of the first chunk: opening, the ports and the times come from the
    # summary, and the messages after that chunk are found by the chunk index; only reading
    # the damaged chunk fails.
    from mcap.reader import SeekingReader

    with recording.open("rb") as file:
        summary = SeekingReader(file).get_summary()
    assert summary is not None
    first_chunk = min(index.chunk_start_offset for index in summary.chunk_indexes)
    records = first_chunk + 9 + 8 + 8 + 8 + 4 + 4 + 8  # past the chunk's header ("" compression)
    data = bytearray(recording.read_bytes())
    data[records : records + 16] = b"\xff" * 16
    recording.write_bytes(bytes(data))
    with opened(recording) as read:
        assert set(read.ports) == {"sensor.reading", "ctl.u"}
        assert (read.start, read.end) == (0.0, 3.95)
        late = list(read.messages(start=3.0))
        assert late and all(message.time >= 3.0 for message in late)
        with pytest.raises(ValueError, match="runs past the end of its chunk"):
            list(read.messages())
    with pytest.raises(ValueError, match="is closed"):
        read.messages()
    with pytest.raises(ValueError, match="is closed"):
        read.state_at(1.0)


# --- record.read-ports, record.read-times ---------------------------------------------------


@pytest.mark.rule("record.read-ports")
def test_ports_hold_the_channels_metadata_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "run.mcap"
    ports = [
        *PORTS,
        {**files.tensor_port("arm.policy", "action", shape=()), "shape": "", "period": "", "dtype": ""},
    ]
    messages = [*run_messages(4), (2, 0.25, 2, torch.zeros(4))]
    files.write(path, ports, sorted(messages, key=lambda m: (m[1], m[2])))
    with opened(path) as read:
        assert list(read.ports) == ["sensor.reading", "ctl.u", "arm.policy.action"]
        sensor = read.ports["sensor.reading"]
        assert sensor == mujou.RecordedPort(
            name="sensor.reading",
            node="sensor",
            port="reading",
            kind="tensor",
            dtype="float32",
            shape=(3,),
            period=0.1,
            device="cpu",
            messages=4,
            topic="/sensor/reading",
        )
        assert read.ports["ctl.u"].messages == 8
        varying = read.ports["arm.policy.action"]
        assert (varying.node, varying.port, varying.shape, varying.period, varying.dtype) == (
            "arm.policy",
            "action",
            None,
            None,
            "",
        )
        assert read.message_count == 13


@pytest.mark.rule("record.read-times")
def test_start_end_keyframes_metadata_and_lost(tmp_path: Path) -> None:
    path = tmp_path / "run.mcap"
    messages = [(0, 0.5 + 0.1 * i, 0, torch.zeros(3)) for i in range(10)]
    files.write(
        path, PORTS, messages, keyframes={2.0: {"x": torch.ones(1)}, 1.0: {"x": torch.zeros(1)}}, lost=3
    )
    with opened(path) as read:
        assert read.start == 0.5
        assert read.end == 2.0  # the last keyframe is after the last message
        assert read.keyframes == (1.0, 2.0)
        assert read.lost == 3
        assert read.cut is None
        assert read.metadata["version"] == mujou.__version__
        assert read.metadata["timer"] == "virtual"
        assert read.net == {"nodes": ["sensor", "ctl"]}


# --- record.read-messages -------------------------------------------------------------------


@pytest.mark.rule("record.read-messages")
@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_messages_come_in_tag_order_with_their_values(tmp_path: Path, compression: str) -> None:
    path = tmp_path / "run.mcap"
    messages = run_messages()
    files.write(path, PORTS, messages, chunk_size=300, compression=compression)
    with opened(path) as read:
        assert as_tuples(read.messages()) == expected(messages)
        first = next(read.messages())
        assert isinstance(first, mujou.RecordedMessage)
        assert (first.port, first.time, first.microstep) == ("sensor.reading", 0.0, 0)


@pytest.mark.rule("record.read-messages")
def test_messages_by_port_and_time_range_bounds_included(recording: Path) -> None:
    every = expected(run_messages())
    with opened(recording) as read:
        window = as_tuples(read.messages(start=1.0, end=2.0))
        assert window == [m for m in every if 1.0 <= m[1] <= 2.0]
        assert window[0][1] == 1.0 and window[-1][1] == 2.0
        only = as_tuples(read.messages("ctl.u", start=3.5))
        assert only == [m for m in every if m[0] == "ctl.u" and m[1] >= 3.5]
        both = as_tuples(read.messages(["sensor.reading", "ctl.u"], end=0.3))
        assert both == [m for m in every if m[1] <= 0.3]
        assert list(read.messages(start=10.0)) == []


@pytest.mark.rule("record.read-messages")
@pytest.mark.parametrize("chunk_size", [200, 1 << 20], ids=["another chunk", "the same chunk"])
def test_a_tag_written_late_still_comes_in_tag_order(tmp_path: Path, chunk_size: int) -> None:
    # Under the real-time timer the writer thread may write a message after one of a later
    # tag, in the same chunk or another: reading still orders by time, then microstep.
    path = tmp_path / "run.mcap"
    messages = [(0, 1.0, 1, torch.ones(3)), *[(1, 1.0 + 0.01 * i, 0, torch.zeros(2)) for i in range(30)]]
    messages.append((0, 1.0, 0, torch.full((3,), 7.0)))  # tag (1.0, 0), written last
    files.write(path, PORTS, messages, chunk_size=chunk_size)
    with opened(path) as read:
        got = [(m.port, m.time, m.microstep) for m in read.messages(start=1.0, end=1.0)]
    # Of one tag, the order written: ctl.u's (1.0, 0) came before sensor.reading's.
    assert got == [("ctl.u", 1.0, 0), ("sensor.reading", 1.0, 0), ("sensor.reading", 1.0, 1)]


@pytest.mark.rule("record.read-messages")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool])
def test_tensors_come_back_bit_for_bit(tmp_path: Path, dtype: torch.dtype) -> None:
    path = tmp_path / "run.mcap"
    source = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)) * 1e3
    sent = [source.to(dtype), (source + 1).to(dtype)]
    port = files.tensor_port("n", "y", dtype=str(dtype).removeprefix("torch."), shape=(4, 5))
    files.write(path, [port], [(0, 0.1 * i, 0, tensor) for i, tensor in enumerate(sent)])
    with opened(path) as read:
        values = [message.value for message in read.messages()]
    for got, want in zip(values, sent, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


@pytest.mark.rule("record.read-messages")
def test_bad_arguments_of_messages(recording: Path) -> None:
    with opened(recording) as read:
        with pytest.raises(
            ValueError, match=r"has no port 'sensor\.nope'; it holds 'sensor\.reading', 'ctl\.u'"
        ):
            read.messages(["sensor.nope"])
        with pytest.raises(ValueError, match=r"^start must not be after end, got start=2\.0, end=1\.0$"):
            read.messages(start=2.0, end=1.0)
        with pytest.raises(TypeError, match=r"^start must be a time in seconds \(a number\), got str: '1'$"):
            read.messages(start="1")  # type: ignore[arg-type]  # on purpose
        with pytest.raises(TypeError, match=r"^ports must be port names"):
            read.messages([3])  # type: ignore[list-item]  # on purpose
        with pytest.raises(ValueError, match=r"^end must be a finite time"):
            read.messages(end=float("nan"))


# --- record.read-state ----------------------------------------------------------------------


@pytest.mark.rule("record.read-state")
def test_state_at_is_the_last_keyframe_at_or_before_the_time(recording: Path, tmp_path: Path) -> None:
    with opened(recording) as read:
        assert torch.equal(read.state_at(1.0)["x"], torch.ones(2))
        assert torch.equal(read.state_at(1.999)["x"], torch.ones(2))
        assert torch.equal(read.state_at(100.0)["x"], torch.full((2,), 2.0))
        tree = read.state_at(0.0)
        with pytest.raises(ValueError, match=r"has no keyframe at or before t=-0\.5: its first is at t=0$"):
            read.state_at(-0.5)
    mujou.save(tree, tmp_path / "again.pt")  # the tree is one mujou.save takes, as mujou.load gives it
    assert torch.equal(mujou.load(tmp_path / "again.pt")["x"], torch.zeros(2))
    bare = tmp_path / "bare.mcap"
    files.write(bare, PORTS, run_messages(2))
    with opened(bare) as read, pytest.raises(ValueError, match=r"has no keyframes \(a run records them"):
        read.state_at(1.0)


# --- record.read-cut ------------------------------------------------------------------------


@pytest.mark.rule("record.read-cut")
def test_a_cut_recording_is_read_up_to_its_last_whole_chunk(tmp_path: Path) -> None:
    messages = run_messages()
    whole = tmp_path / "whole.mcap"
    files.write(whole, PORTS, messages, chunk_size=300, end=False)
    data = whole.read_bytes()
    last_chunk = max(offset for opcode, offset, _ in files.records(data) if opcode == 0x06)
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: last_chunk + 100])  # into the last chunk on disk
    with pytest.warns(
        mujou.TruncatedRecordingWarning, match=r"was cut .*it is read up to its last whole chunk"
    ):
        read = mujou.Recording(cut)
    with read:
        assert read.cut is not None
        assert "no 'mujou.end' record" in read.cut and "a partial chunk record" in read.cut
        assert read.lost is None
        got = as_tuples(read.messages())
        assert got == expected(messages)[: len(got)]  # a prefix, in order, nothing made up
        assert 0 < len(got) < len(messages)
        assert read.message_count == len(got)
        assert read.end == got[-1][1]
        assert f"the last message kept is at t={got[-1][1]:.9g}" in read.cut
    with pytest.warns(mujou.TruncatedRecordingWarning) as caught:  # not closed, no bytes lost
        mujou.Recording(whole).close()
    assert "and the last" not in str(caught[0].message)


# --- record.read-not-recording --------------------------------------------------------------


@pytest.mark.rule("record.read-not-recording")
def test_a_file_that_is_no_recording_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not an mcap file\n" * 10)
    with pytest.raises(
        ValueError,
        match=r"'.*notes\.txt' is not a Mujou recording: it does not start with MCAP's magic bytes",
    ):
        mujou.Recording(text)
    empty = tmp_path / "empty.mcap"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="is not a Mujou recording"):
        mujou.Recording(empty)
    other = tmp_path / "other.mcap"
    files.write(other, PORTS, run_messages(2), identify=False)
    with pytest.raises(
        ValueError, match=r"is not a Mujou recording: it is an MCAP file, but has no 'mujou' metadata record"
    ):
        mujou.Recording(other)
    with pytest.raises(FileNotFoundError, match="missing"):
        mujou.Recording(tmp_path / "missing.mcap")


# --- record.read-version --------------------------------------------------------------------


@pytest.mark.rule("record.read-version")
def test_a_recording_of_another_version_says_so_and_is_read(tmp_path: Path) -> None:
    path = tmp_path / "old.mcap"
    messages = run_messages(3)
    files.write(path, PORTS, messages, version="0.0.9")
    match = rf"was written by Mujou 0\.0\.9, and is read by Mujou {mujou.__version__}"
    with pytest.warns(mujou.RecordingVersionWarning, match=match):
        read = mujou.Recording(path)
    with read:
        assert read.metadata["version"] == "0.0.9"
        assert as_tuples(read.messages()) == expected(messages)


# --- record.read-check-net ------------------------------------------------------------------


class Sensor(mujou.Node):
    reading = mujou.Output(dtype=torch.float32, shape=(3,))

    def __init__(self, period: float = 0.1) -> None:
        super().__init__(period=period)


class Control(mujou.Node):
    x = mujou.Input()
    u = mujou.Output(dtype=torch.float32, shape=(None,))

    def __init__(self, period: float = 0.05) -> None:
        super().__init__(period=period)


class Robot(mujou.Net):
    def __init__(self, sensor: mujou.Node, ctl: mujou.Node) -> None:
        super().__init__()
        self.sensor = sensor
        self.ctl = ctl
        self.connect(sensor.reading, ctl.x)  # type: ignore[attr-defined]


class RenamedSensor(mujou.Node):
    reading_v2 = mujou.Output(dtype=torch.float32, shape=(3,))

    def __init__(self) -> None:
        super().__init__(period=0.1)

    @property
    def reading(self) -> mujou.Output[torch.Tensor]:
        return self.reading_v2


class WideSensor(mujou.Node):
    reading = mujou.Output(dtype=torch.float64, shape=(4,))
    extra = mujou.Output()


@pytest.mark.rule("record.read-check-net")
def test_check_net_names_the_ports_that_do_not_match(recording: Path) -> None:
    with opened(recording) as read:
        net = Robot(Sensor(), Control())
        read.check_net(net)
        read.check_net(net, [net.sensor])
        slow = Robot(Sensor(period=0.2), Control())
        with pytest.raises(
            ValueError, match=r"'sensor\.reading': the node's period is 0\.2, the recording's 0\.1$"
        ):
            read.check_net(slow, [slow.sensor])
        read.check_net(slow, [slow.ctl])  # only the nodes asked for are checked
        wide = Robot(WideSensor(), Control())
        with pytest.raises(ValueError) as raised:
            read.check_net(wide)
        message = str(raised.value)
        assert "does not match the net" in message
        assert "'sensor.reading': the port declares dtype float64, the recording's is float32" in message
        assert "'sensor.reading': the port declares shape [4], the recording's is [3]" in message
        assert "'sensor.extra' is not in the recording" in message
        assert "ctl" not in message.replace("'sensor", "")
        renamed = Robot(RenamedSensor(), Control())
        with pytest.raises(ValueError) as raised:
            read.check_net(renamed, [renamed.sensor])
        assert "'sensor.reading' is recorded, but node 'sensor' has no output 'reading'" in str(raised.value)
        with pytest.raises(TypeError, match="nodes must be nodes of the net"):
            read.check_net(net, [Sensor()])


class Quiet(mujou.Node):
    """Sends on ``said``, never on ``silent``."""

    said = mujou.Output()
    silent = mujou.Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)

    def on_update(self, dt: float) -> None:
        self.said.send(torch.ones(2))


@pytest.mark.rule("record.read-check-net")
def test_check_net_takes_an_output_that_sent_nothing_and_names_one_left_out(tmp_path: Path) -> None:
    """An output recorded but silent has no channel and matches; one left out by outputs=
    does not. Planted: the recorded net's outputs not consulted (q.silent "is not in the
    recording" in the first file), and outputs= not consulted (the second file passes)."""
    every, chosen = tmp_path / "every.mcap", tmp_path / "chosen.mcap"
    for path, outputs in ((every, None), (chosen, ["q.said"])):
        with mujou.run(
            Bag(q=Quiet()), timer=mujou.VirtualTimer(), record=mujou.Recorder(path, outputs=outputs)
        ) as run:
            run.sleep(0.3)
    net = Bag(q=Quiet())
    with opened(every) as read:
        assert sorted(read.ports) == ["q.said"]
        read.check_net(net)
    with opened(chosen) as read, pytest.raises(ValueError) as raised:
        read.check_net(net)
    assert str(raised.value).endswith(
        "does not match the net: 'q.silent' was left out of the recording (Recorder(outputs=)); "
        "record every output"
    )


# --- record.read-info -----------------------------------------------------------------------


def record_info(path: Path) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "mujou", "record", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        check=False,
    )


@pytest.mark.rule("record.read-info")
def test_record_info_prints_the_summary_as_a_table(recording: Path, tmp_path: Path) -> None:
    result = record_info(recording)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        lines[0].startswith("recording     run.mcap: ")
        and f"written by Mujou {mujou.__version__}" in lines[0]
    )
    assert "time          0 s to 3.95 s (3.95 s)" in lines
    assert "messages      120, lost 0" in lines
    assert "keyframes     3: 0, 1, 2" in lines
    assert "cut           no" in lines
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["port", "kind", "dtype", "shape", "period", "messages", "rate", "(1/s)"]
    assert table[1].split() == ["sensor.reading", "tensor", "float32", "[3]", "0.1", "40", "10.13"]
    assert table[2].split() == ["ctl.u", "tensor", "float32", "[2]", "0.05", "80", "20.25"]
    ends = [
        table[0].index("messages") + len("messages"),
        table[1].index(" 40 ") + 3,
        table[2].index(" 80 ") + 3,
    ]
    assert len(set(ends)) == 1, table  # the counts are right-aligned under their heading
    cut = tmp_path / "cut.mcap"
    files.write(cut, PORTS, run_messages(), chunk_size=300, end=False)
    result = record_info(cut)
    assert result.returncode == 0, result.stderr
    assert "cut           yes: it has no 'mujou.end' record" in result.stdout
    assert "lost unknown (cut)" in result.stdout
    result = record_info(tmp_path / "none.mcap")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("python -m mujou record info: error: ") and "none.mcap" in result.stderr


# --- Real recordings: mujou.Recorder's files ---------------------------------------------------


class Wave(mujou.Node):
    """Sends sin of its update count on a float32 (3,) port, and keeps what it sent."""

    y = mujou.Output(dtype=torch.float32, shape=(3,))
    state_exclude: ClassVar[tuple[str, ...]] = ("sent",)  # what the test looks at, not the node's state

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=1)
        self.sent: list[torch.Tensor] = []

    def on_start(self) -> None:
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        value = torch.sin(torch.arange(3.0) + self.n) + torch.randn(3, generator=self.generator)
        self.sent.append(value.clone())
        self.y.send(value)


class Steer(mujou.Node):
    """Reads the wave and sends a nest: a dict of a tensor and an int."""

    x = mujou.Input()
    cmd: mujou.Output[dict[str, Any]] = mujou.Output()
    state_exclude: ClassVar[tuple[str, ...]] = ("sent",)

    def __init__(self) -> None:
        super().__init__(period=0.05)
        self.sent: list[dict[str, Any]] = []

    def on_start(self) -> None:
        self.count = 0

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        self.count += 1
        u = torch.zeros(3, dtype=torch.float64) if x is None else 2 * x.double()
        message = {"u": u, "step": self.count}
        self.sent.append(message)
        self.cmd.send(message)


class Rig(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.wave = Wave()
        self.steer = Steer()
        self.connect(self.wave.y, self.steer.x)


def record_rig(path: Path, seconds: float = 2.0, **options: object) -> Rig:
    rig = Rig()
    recorder = mujou.Recorder(path, state_every=0.5, **options)  # type: ignore[arg-type]  # options as given
    with mujou.run(rig, timer=mujou.VirtualTimer(), record=recorder) as run:
        run.sleep(seconds)
    return rig


@pytest.mark.rule("record.read-messages")
@pytest.mark.rule("record.read-ports")
@pytest.mark.rule("record.read-times")
def test_a_run_recorded_by_mujou_recorder_reads_back_as_it_ran(tmp_path: Path) -> None:
    path = tmp_path / "rig.mcap"
    rig = record_rig(path, chunk_size=2048)
    with opened(path) as read:
        assert set(read.ports) == {"wave.y", "steer.cmd"}
        wave = read.ports["wave.y"]
        assert (wave.kind, wave.dtype, wave.shape) == ("tensor", "float32", (3,))
        assert (wave.period, wave.device) == (0.1, "cpu")
        assert (read.ports["steer.cmd"].kind, read.ports["steer.cmd"].period) == ("structured", 0.05)
        assert wave.messages == len(rig.wave.sent) and read.ports["steer.cmd"].messages == len(rig.steer.sent)
        assert read.keyframes == (0.0, 0.5, 1.0, 1.5, 2.0)
        assert (read.start, read.end, read.lost, read.cut) == (0.0, 2.0, 0, None)
        messages = list(read.messages())
        assert [m.time for m in messages] == sorted(m.time for m in messages)
        waves = [m for m in messages if m.port == "wave.y"]
        assert [m.time for m in waves] == [round(0.1 * i, 9) for i in range(1, len(waves) + 1)]
        for got, want in zip(waves, rig.wave.sent, strict=True):
            assert torch.equal(got.value, want)
        steers = [m.value for m in messages if m.port == "steer.cmd"]
        assert [s["step"] for s in steers] == [s["step"] for s in rig.steer.sent]
        for got_nest, want_nest in zip(steers, rig.steer.sent, strict=True):
            assert torch.equal(got_nest["u"], want_nest["u"])
        later = list(read.messages("wave.y", start=1.0, end=1.5))
        assert [m.time for m in later] == [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]


@pytest.mark.rule("record.read-state")
def test_state_at_of_a_real_recording_resumes_a_run(tmp_path: Path) -> None:
    path = tmp_path / "rig.mcap"
    record_rig(path)
    with opened(path) as read:
        tree = read.state_at(1.2)  # the keyframe of t=1.0
        recorded = [m.value for m in read.messages("wave.y", start=1.05)]
    rig = Rig()
    with mujou.run(rig, timer=mujou.VirtualTimer(), state=tree) as run:
        assert run.time == 1.0
        run.sleep(1.0)
    for got, want in zip(rig.wave.sent, recorded, strict=True):  # the run goes on as it went
        assert torch.equal(got, want)


@pytest.mark.rule("record.read-any-decoder")
def test_recorded_bytes_decode_with_protobufs_own_parser_against_the_stored_schema(tmp_path: Path) -> None:
    from mcap.reader import make_reader

    descriptor_pb2, descriptor_pool = files.descriptor_pb2, files.descriptor_pool

    path = tmp_path / "rig.mcap"
    record_rig(path, seconds=0.5)
    with path.open("rb") as file:
        decoded = []
        for schema, channel, record in make_reader(file).iter_messages(log_time_order=True):
            assert schema is not None and schema.encoding == channel.message_encoding == "protobuf"
            pool = descriptor_pool.DescriptorPool()
            for proto in descriptor_pb2.FileDescriptorSet.FromString(schema.data).file:
                pool.Add(proto)
            parser = files.message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name))
            decoded.append((channel.metadata["node"], record.log_time, parser.FromString(record.data)))
    with opened(path) as read:
        ours = list(read.messages())
    assert len(decoded) == len(ours)
    for (node, log_time, parsed), message in zip(decoded, ours, strict=True):
        assert (node, log_time) == (message.port.split(".")[0], round(message.time * 1e9))
        if node == "wave":
            assert list(parsed.shape) == [3] and parsed.dtype == "float32"
            assert torch.equal(torch.tensor(list(parsed.f32), dtype=torch.float32), message.value)
        else:
            assert parsed.step == message.value["step"]
            assert torch.equal(torch.tensor(list(parsed.u.f64), dtype=torch.float64), message.value["u"])
