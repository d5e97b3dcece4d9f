"""Conformance tests for recording a run: the "Recording" section of spec/en/record-and-replay.md.

Recordings are read back with ``mcap``'s own reader and their messages decoded with the
``protobuf`` package against the schemas stored in the file, so that the file is checked as a
viewer would read it, not through Mujou's reader.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from _support import HANG_GUARD, Bag, hang_guard, vt, wait_until

import mujou
from mujou import Input, Node, Output

mcap_reader = pytest.importorskip("mcap.reader")
descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
descriptor_pool = pytest.importorskip("google.protobuf.descriptor_pool")
message_factory = pytest.importorskip("google.protobuf.message_factory")


# --- reading a file back, as a viewer would ------------------------------------------------


@dataclasses.dataclass
class Message:
    topic: str
    channel: Any
    log_time: int
    publish_time: int
    sequence: int
    value: Any  # the protobuf message, parsed against the channel's schema


@dataclasses.dataclass
class File:
    channels: list[Any]
    messages: list[Message]
    attachments: list[Any]
    metadata: dict[str, dict[str, str]]
    counts: dict[int, int]

    def on(self, topic: str) -> list[Message]:
        return [message for message in self.messages if message.topic == topic]


def message_class(schema: Any) -> Any:
    files = descriptor_pb2.FileDescriptorSet.FromString(schema.data)
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name))


def read(path: Path) -> File:
    with open(path, "rb") as stream:
        reader = mcap_reader.make_reader(stream)
        summary = reader.get_summary()
        assert summary is not None
        classes: dict[int, Any] = {}
        messages = []
        for schema, channel, message in reader.iter_messages(log_time_order=False):
            cls = classes.get(schema.id)
            if cls is None:
                cls = classes[schema.id] = message_class(schema)
            messages.append(
                Message(
                    channel.topic,
                    channel,
                    message.log_time,
                    message.publish_time,
                    message.sequence,
                    cls.FromString(message.data),
                )
            )
        attachments = list(reader.iter_attachments())
        metadata = {record.name: dict(record.metadata) for record in reader.iter_metadata()}
    return File(
        list(summary.channels.values()),
        messages,
        attachments,
        metadata,
        dict(summary.statistics.channel_message_counts),
    )


def tensor_of(parsed: Any) -> torch.Tensor:
    """The tensor a parsed mujou.Tensor holds, from protobuf's fields."""
    dtype = getattr(torch, parsed.dtype)
    field = {
        torch.float32: "f32",
        torch.float64: "f64",
        torch.int64: "i64",
        torch.bool: "b",
        torch.int32: "i32",
    }
    name = field.get(dtype)
    if name is not None:
        return torch.tensor(list(getattr(parsed, name)), dtype=dtype).reshape(list(parsed.shape))
    return torch.frombuffer(bytearray(parsed.raw), dtype=dtype).reshape(list(parsed.shape))


# --- the nets ---------------------------------------------------------------------------


class Pose(NamedTuple):
    position: torch.Tensor
    frame: str


class Counter(Node):
    """Periodic: sends its count as a tensor, and a nest holding it."""

    out = Output()
    nest: Output[dict[str, Any]] = Output()

    def __init__(self, period: float = 0.1) -> None:
        super().__init__(period=period, seed=1)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(torch.tensor([float(self.count), torch.rand(1, generator=self.generator).item()]))
        self.nest.send(
            {"pose": Pose(torch.full((2,), self.count, dtype=torch.float64), "w"), "n": self.count}
        )

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count = state["count"]


class Plus(Node):
    """Triggered by ``x``: sends x + 1 at the same time, one microstep later."""

    x = Input()
    out = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=2)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.out.send(x + 1)


class Summer(Node):
    """Periodic: adds what it reads, with a draw; its state is the sum."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=3)
        self.total = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.total = self.total + x + torch.rand(2, generator=self.generator)


class Counting(mujou.Net):
    """counter -> plus (triggered, a microstep later) -> summer."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()
        self.plus = Plus()
        self.summer = Summer()
        self.connect(self.counter.out, self.plus.x)
        self.connect(self.plus.out, self.summer.x)


def counting_net() -> Counting:
    return Counting()


def same_tree(left: Any, right: Any) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and torch.equal(left, right)
    if isinstance(left, dict):
        return (
            isinstance(right, dict)
            and left.keys() == right.keys()
            and all(same_tree(left[k], right[k]) for k in left)
        )
    if isinstance(left, list | tuple):
        return type(left) is type(right) and len(left) == len(right) and all(map(same_tree, left, right))
    return bool(left == right)


# --- the tests --------------------------------------------------------------------------


@pytest.mark.rule("record.recorder", "record.channels", "record.encoding", "record.structured", "record.time")
def test_every_message_is_in_the_file_as_a_viewer_reads_it(tmp_path: Path) -> None:
    """Each output's messages, decoded with protobuf against the stored schema, are the ones the
    host saw (subscriptions), with their stamps and microsteps. Planted: the microstep not
    passed to the writer (Plus's sequence is 0), and the dict keys in insertion order (the nest's
    fields swapped: wrong values)."""
    path = tmp_path / "run.mcap"
    net = counting_net()
    recorder = mujou.Recorder(path)
    with mujou.run(net, timer=vt(), record=recorder) as run:
        seen = {
            port: run.subscribe(port, maxsize=1000)
            for port in (net.counter.out, net.counter.nest, net.plus.out)
        }
        run.sleep(1.0)
        sent = {port.name: subscription.drain() for port, subscription in seen.items()}
    assert recorder.messages == 30 and recorder.lost == 0
    file = read(path)
    topics = {channel.topic: channel for channel in file.channels}
    assert sorted(topics) == ["/counter/nest", "/counter/out", "/plus/out"]
    out = topics["/counter/out"].metadata
    assert out == {
        "node": "counter",
        "port": "out",
        "dtype": "float32",
        "shape": "[2]",
        "period": "0.1",
        "device": "cpu",
        "kind": "tensor",
        "layout": '"tensor"',
        "direction": "output",
    }
    assert topics["/plus/out"].metadata["period"] == ""
    assert topics["/counter/nest"].metadata["kind"] == "structured"
    assert all(channel.message_encoding == "protobuf" for channel in file.channels)
    for topic, name in [("/counter/out", "counter.out"), ("/plus/out", "plus.out")]:
        recorded = file.on(topic)
        assert [tensor_of(m.value).tolist() for m in recorded] == [t.tolist() for t in sent[name]]
        assert all(m.value.dtype == "float32" for m in recorded)
    stamps = [m.log_time for m in file.on("/counter/out")]
    assert stamps == [round(0.1 * k * 1e9) for k in range(1, 11)]
    for m in file.messages:
        assert m.publish_time == m.log_time
    assert {m.sequence for m in file.on("/counter/out")} == {0}
    assert {m.sequence for m in file.on("/plus/out")} == {1}  # one microstep after its trigger
    nests = file.on("/counter/nest")
    for m, nest in zip(nests, sent["counter.nest"], strict=True):
        assert m.value.n == nest["n"]
        assert tensor_of(m.value.pose.position).tolist() == nest["pose"].position.tolist()
        assert m.value.pose.frame == "w"
    layout = json.loads(topics["/counter/nest"].metadata["layout"])
    assert layout["names"] == ["n", "pose"] and layout["children"][1]["kind"] == "namedtuple"


@pytest.mark.rule("record.structured")
def test_a_port_whose_structure_changes_gets_a_channel_per_structure(tmp_path: Path) -> None:
    """Planted: one plan per port whatever the structure (the second message is written
    against the first schema: protobuf reads it wrong)."""

    class Shifty(Node):
        out: Output[dict[str, Any]] = Output()

        def __init__(self) -> None:
            super().__init__(period=0.5, seed=0)
            self.n = 0

        def on_update(self, dt: float) -> None:
            self.n += 1
            self.out.send(
                {"a": torch.ones(1)} if self.n % 2 else {"a": 1.5, "b": [torch.zeros(2, dtype=torch.int32)]}
            )

    path = tmp_path / "shifty.mcap"
    with mujou.run(Bag(s=Shifty()), timer=vt(), record=path) as run:
        run.sleep(2.0)
    file = read(path)
    assert [c.topic for c in file.channels] == ["/s/out", "/s/out"]
    values = file.on("/s/out")
    assert len(values) == 4
    assert tensor_of(values[0].value.a).tolist() == [1.0]
    assert values[1].value.a == 1.5
    assert tensor_of(values[1].value.b.item_0).dtype == torch.int32


@pytest.mark.rule("record.keyframes", "record.virtual-lossless", "record.metadata")
def test_keyframes_are_the_state_and_recording_changes_nothing(tmp_path: Path) -> None:
    """Each keyframe is mujou.save's bytes of the state at its time, the same tree a run
    without recording has there; with a queue of 1 nothing is lost, and every read is the same
    (the summer's sum). Planted: the keyframe taken after the advance past its time (the tree
    is of a later time), and a virtual tap that drops when full (messages are missing)."""
    path = tmp_path / "k.mcap"
    recorder = mujou.Recorder(path, state_every=0.5, queue=1, compression="lz4")
    with mujou.run(counting_net(), timer=vt(), record=recorder) as run:
        run.sleep(1.2)
        recorded_end = run.state_dict()
    expected = {}
    with mujou.run(counting_net(), timer=vt()) as plain:
        for at in (0.0, 0.5, 1.0):
            plain.sleep(at - plain.time)
            expected[round(at * 1e9)] = plain.state_dict()
        plain.sleep(1.2 - plain.time)
        plain_end = plain.state_dict()
    assert same_tree(recorded_end, plain_end)
    file = read(path)
    assert len(file.messages) == recorder.messages == 33 and recorder.lost == 0
    names = [a.name for a in file.attachments]
    assert names == ["state/0", "state/500000000", "state/1000000000"]
    for attachment in file.attachments:
        assert attachment.media_type == "application/x-mujou-state"
        saved = tmp_path / "state.pt"
        saved.write_bytes(attachment.data)
        tree = mujou.load(saved)
        assert same_tree(tree, expected[attachment.log_time])
    header = file.metadata["mujou"]
    assert header["timer"] == "virtual" and header["version"] == mujou.__version__
    assert header["torch"] == torch.__version__ and header["state_every"] == "0.5"
    assert json.loads(header["seed"]) == {"counter": 1, "plus": 2, "summer": 3}
    structure = json.loads(file.metadata["mujou.net"]["structure"])
    assert [node["name"] for node in structure["nodes"]] == ["counter", "plus", "summer"]
    assert ["counter.out", "plus.x"] in structure["edges"]
    assert file.metadata["mujou.end"] == {"lost": "0", "messages": "33", "end_time_ns": "1200000000"}


@pytest.mark.rule("record.recorder")
def test_only_the_chosen_outputs_are_recorded(tmp_path: Path) -> None:
    path = tmp_path / "some.mcap"
    net = counting_net()
    with mujou.run(
        net, timer=vt(), record=mujou.Recorder(path, outputs=[net.plus.out, "counter.nest"], compression=None)
    ) as run:
        run.sleep(0.5)
    assert sorted(c.topic for c in read(path).channels) == ["/counter/nest", "/plus/out"]


@pytest.mark.rule("record.metadata", "record.process")
def test_a_file_is_complete_only_once_the_run_stopped(tmp_path: Path) -> None:
    """The header and the metadata records are in the file once mujou.run returned, mujou.end
    once the run stopped. Planted: the recorder process not waited for at the start (the
    file is still empty)."""
    from mcap.records import Metadata
    from mcap.stream_reader import StreamReader

    path = tmp_path / "open.mcap"
    run = mujou.run(counting_net(), timer=vt(), record=path)
    try:
        with open(path, "rb") as stream:  # the header and what is written so far
            assert stream.read(8) == b"\x89MCAP0\r\n"
            stream.seek(0)
            names = []
            for record in StreamReader(stream).records:
                if isinstance(record, Metadata):
                    names.append(record.name)
                if len(names) == 2:
                    break
        assert names == ["mujou", "mujou.net"]
        run.sleep(0.3)
    finally:
        run.stop()
    assert "mujou.end" in read(path).metadata


@pytest.mark.rule("record.process")
def test_a_killed_run_leaves_a_file_its_recorder_process_completed(tmp_path: Path) -> None:
    """The run's process killed in the middle of its run: its recorder process writes every
    message the run sent and the file's summary, without mujou.end. Planted: the recorder
    process not watching its standard input (it never ends: the file gets no summary)."""
    from _support import checkout_environ

    path = tmp_path / "killed.mcap"
    script = textwrap.dedent(
        f"""
        import os, signal, torch, mujou
        class Source(mujou.Node):
            out = mujou.Output()
            def __init__(self):
                super().__init__(period=0.01, seed=0)
            def on_update(self, dt):
                self.out.send(torch.ones(4))
        net = mujou.Net()
        net.source = Source()
        run = mujou.run(net, timer=mujou.VirtualTimer(), record={str(path)!r})
        run.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
        env=checkout_environ(quiet=True),
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    began = time.monotonic()
    while not path.read_bytes().endswith(b"\x89MCAP0\r\n"):  # the recorder process writes on
        assert time.monotonic() - began < HANG_GUARD, "the recorder process did not end the file"
        time.sleep(0.01)
    file = read(path)
    assert [m.log_time for m in file.on("/source/out")] == [10_000_000 * k for k in range(1, 101)]
    assert "mujou.end" not in file.metadata and "mujou.net" in file.metadata
    with pytest.warns(mujou.TruncatedRecordingWarning):
        opened = mujou.Recording(path)
    with opened:
        assert opened.cut is not None and "no 'mujou.end' record" in opened.cut
        assert opened.message_count == 100


class Burst(Node):
    """Sends ``count`` messages in each update."""

    out = Output()

    def __init__(self, count: int) -> None:
        super().__init__(period=0.01, seed=0)
        self.count = count
        self.sent = 0

    def on_update(self, dt: float) -> None:
        for i in range(self.count):
            self.out.send(torch.full((16,), float(i)))
        self.sent += self.count


@pytest.mark.rule("record.lost")
def test_real_time_drops_and_counts_what_the_writer_cannot_take(tmp_path: Path) -> None:
    """With a queue of 1, a hook that sends 2000 messages at once outruns the writer: every
    message is written or counted, and the count is in stats, the recorder and the file.
    Planted: the real-time tap waiting for room (nothing lost: the test fails), and lost not
    added to the stats (0 there)."""
    path = tmp_path / "rt.mcap"
    burst = Burst(2000)
    recorder = mujou.Recorder(path, queue=1)
    run = mujou.run(Bag(b=burst), record=recorder)
    with run:
        while burst.sent < 2000:  # the node's own count, read racily: only a lower bound
            run.sleep(0.01)
        run.stop()
        stats = run.stats()
    file = read(path)
    assert recorder.lost > 0
    assert stats.lost == recorder.lost
    assert int(file.metadata["mujou.end"]["lost"]) == recorder.lost
    assert len(file.messages) + recorder.lost == burst.sent
    assert file.metadata["mujou"]["timer"] == "real"
    assert {m.sequence for m in file.messages} == {0}


class Ticking(Node):
    """Sends its count each update (on a worker, or on a dedicated thread)."""

    out = Output()

    def __init__(self, *, dedicated_thread: bool = False) -> None:
        super().__init__(period=0.05, seed=0, dedicated_thread=dedicated_thread)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.out.send(torch.full((4,), float(self.count)))


def _taken(recorder: mujou.Recorder, count: int) -> bool:
    return recorder.messages >= count


@pytest.mark.rule("record.real-time-copy")
def test_real_time_messages_reach_the_file_while_the_run_goes(tmp_path: Path) -> None:
    """Under the real-time timer the messages kept by the hooks are copied as the run goes by
    the thread about to wait: a worker, and a dedicated node's own thread (the worker parks
    for good there: nothing else is due on it). The host waits on its own, not in a run's
    call, so that its thread copies nothing. Planted: a dedicated thread that waits without
    copying (its run's messages reach the recorder process only at the end: the wait fails),
    and the same of a worker."""
    for dedicated in (False, True):  # 20 messages a second: the tap's bound is not reached
        path = tmp_path / f"live-{dedicated}.mcap"
        recorder = mujou.Recorder(path)
        with mujou.run(Bag(n=Ticking(dedicated_thread=dedicated)), workers=1, record=recorder):
            wait_until(functools.partial(_taken, recorder, 5), f"5 messages taken (dedicated: {dedicated})")
        assert recorder.lost == 0
        values = [tensor_of(m.value)[0].item() for m in read(path).on("/n/out")]
        assert values == [float(k) for k in range(1, len(values) + 1)]


class Mixed(Node):
    """In its first updates sends, on one port, small tensors (more than the tap keeps), a
    nest, a large tensor, then small ones again, numbered in the order sent."""

    out: Output[Any] = Output()

    def __init__(self) -> None:
        super().__init__(period=0.02, seed=0)
        self.sent = 0
        self.updates = 0

    def _small(self, n: int) -> None:
        for _ in range(n):
            self.sent += 1
            self.out.send(torch.full((4,), float(self.sent)))

    def on_update(self, dt: float) -> None:
        self.updates += 1
        if self.updates > 3:
            return
        self._small(1500)
        self.sent += 1
        self.out.send({"n": torch.tensor([float(self.sent)])})
        self.sent += 1
        self.out.send(torch.full((40_000,), float(self.sent)))  # 160 kB: copied at once
        self._small(200)


@pytest.mark.rule("record.real-time-copy", "record.time")
def test_real_time_keeps_each_ports_order_and_stamps(tmp_path: Path) -> None:
    """Small tensors kept by the tap, past its bound, and a nest and a large tensor copied at
    once, all on one port: the file has them in the order sent, each with its update's stamp,
    none lost. Planted: the kept messages copied newest first, and a large message copied
    before the small ones kept before it (both: the order in the file differs)."""
    path = tmp_path / "order.mcap"
    mixed = Mixed()
    recorder = mujou.Recorder(path, queue=1 << 20)
    with mujou.run(Bag(m=mixed), workers=1, record=recorder) as run:
        wait_until(lambda: mixed.updates > 3, "three updates")
        run.stop()
    assert recorder.lost == 0
    messages = read(path).on("/m/out")
    values = []
    for message in messages:
        parsed = message.value
        tensor = tensor_of(parsed.n) if hasattr(parsed, "n") else tensor_of(parsed)
        values.append(tensor[0].item())
    assert values == [float(k) for k in range(1, mixed.sent + 1)]
    per_update = len(messages) // 3
    stamps = [m.log_time for m in messages]
    for k in range(3):
        assert len(set(stamps[k * per_update : (k + 1) * per_update])) == 1
    assert stamps[0] < stamps[per_update] < stamps[2 * per_update]
    assert {m.sequence for m in messages} == {0}


class Changer(Node):
    """Sends a tensor with copy=False and changes it afterwards (against ports.send-no-copy),
    then sends a clean one, in its first update; the host waits for ``done``."""

    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0)
        self.done = threading.Event()

    def on_update(self, dt: float) -> None:
        if self.done.is_set():
            return
        kept = torch.ones(4)
        self.out.send(kept, copy=False)
        kept.add_(1.0)
        self.out.send(torch.full((4,), 7.0))
        self.done.set()


@pytest.mark.rule("record.real-time-copy", "record.lost")
def test_a_message_changed_after_it_was_sent_is_counted_not_written(tmp_path: Path) -> None:
    """The tap keeps a reference; a tensor the node changed before it was copied is dropped
    and counted, never written changed. One worker, and a host that waits on an event: no
    thread can copy between the send and the change. Planted: no version check at the copy
    (the file holds [2, 2, 2, 2])."""
    path = tmp_path / "changed.mcap"
    changer = Changer()
    recorder = mujou.Recorder(path)
    with mujou.run(Bag(c=changer), workers=1, record=recorder):
        assert changer.done.wait(HANG_GUARD)
    assert recorder.lost == 1
    file = read(path)
    assert [tensor_of(m.value).tolist() for m in file.on("/c/out")] == [[7.0] * 4]
    assert file.metadata["mujou.end"]["lost"] == "1"


@pytest.mark.rule("record.recorder")
def test_a_resumed_run_records_what_it_sends_not_the_messages_its_restore_puts_back(tmp_path: Path) -> None:
    """A run resumed from a state tree records the messages it sends; the latest messages
    the restore puts back on the outputs were sent by the run the tree was taken from. Under
    both timers (the real-time tap keeps messages, the virtual one copies them). Planted:
    muting that leaves the taps on (the file's first count is the saved one)."""
    net = counting_net()
    with mujou.run(net, timer=vt()) as first:
        first.sleep(1.0)
        tree = first.state_dict()
    saved = net.counter.count
    for timer in (vt(), mujou.RealTimeTimer()):
        path = tmp_path / f"resumed-{timer.virtual}.mcap"
        with mujou.run(counting_net(), timer=timer, state=tree, record=path) as run:
            run.sleep(0.25)
        counts = [tensor_of(m.value)[0].item() for m in read(path).on("/counter/out")]
        assert counts, f"nothing recorded (virtual: {timer.virtual})"
        assert counts == [float(saved + k) for k in range(1, len(counts) + 1)]


@pytest.mark.rule("record.keyframes")
def test_real_time_keyframes_are_taken_as_the_run_goes(tmp_path: Path) -> None:
    path = tmp_path / "rtk.mcap"
    with mujou.run(counting_net(), record=mujou.Recorder(path, state_every=0.1)) as run:
        run.sleep(0.35)
    file = read(path)
    assert len(file.attachments) >= 1
    times = [a.log_time for a in file.attachments]
    assert times == sorted(times)
    for attachment in file.attachments:
        assert attachment.name == f"state/{attachment.log_time}"
        saved = tmp_path / "s.pt"
        saved.write_bytes(attachment.data)
        assert "counter" in mujou.load(saved)


@pytest.mark.rule("record.snapshot")
def test_snapshot_mode_keeps_the_last_seconds(tmp_path: Path) -> None:
    """Planted: no trimming (the file holds the whole run), and the keyframes trimmed to the
    window (none at or before its first message)."""
    recorder = mujou.Recorder(snapshot=0.5, state_every=0.4)
    with mujou.run(counting_net(), timer=vt(), record=recorder) as run:
        run.sleep(2.0)
        run.snapshot(tmp_path / "during.mcap")
        run.sleep(1.0)
    recorder.snapshot(tmp_path / "after.mcap")
    for name, end in [("during.mcap", 2.0), ("after.mcap", 3.0)]:
        file = read(tmp_path / name)
        times = sorted(m.log_time for m in file.messages)
        assert times[0] >= round((end - 0.5) * 1e9) and times[-1] == round(end * 1e9)
        assert len(file.on("/counter/out")) in (5, 6)
        keyframes = [a.log_time for a in file.attachments]
        assert keyframes and keyframes[0] <= times[0]
        assert keyframes[0] > times[0] - round(0.4 * 1e9) - 1
        assert "mujou.end" in file.metadata and "mujou" in file.metadata
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.rule("record.snapshot")
def test_snapshot_needs_a_snapshot_recorder(tmp_path: Path) -> None:
    with (
        mujou.run(counting_net(), timer=vt()) as run,
        pytest.raises(RuntimeError, match=r"^run.snapshot\(\): this run is not recorded"),
    ):
        run.snapshot(tmp_path / "x.mcap")
    with (
        mujou.run(counting_net(), timer=vt(), record=tmp_path / "y.mcap") as run,
        pytest.raises(RuntimeError, match=r"^snapshot\(\): this recorder writes as the run goes"),
    ):
        run.snapshot(tmp_path / "x.mcap")


@pytest.mark.rule("record.arguments")
def test_bad_arguments_are_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^state_every must be a positive number of seconds, got 0"):
        mujou.Recorder(tmp_path / "a", state_every=0)
    with pytest.raises(ValueError, match=r"^compression must be 'zstd', 'lz4' or None, got 'gzip'"):
        mujou.Recorder(tmp_path / "a", compression="gzip")
    with pytest.raises(ValueError, match=r"^queue must be a positive int, got 0"):
        mujou.Recorder(tmp_path / "a", queue=0)
    with pytest.raises(ValueError, match=r"^path must be a file path, or None with snapshot="):
        mujou.Recorder()
    with pytest.raises(ValueError, match=r"^a snapshot recorder writes only when asked: give it no path"):
        mujou.Recorder(tmp_path / "a", snapshot=1.0)
    with pytest.raises(TypeError, match=r"^outputs must be a list of Output ports"):
        mujou.Recorder(tmp_path / "a", outputs="counter.out")
    net = counting_net()
    with pytest.raises(TypeError, match=r"^record must be a mujou.Recorder, a file path or None, got int"):
        mujou.run(net, timer=vt(), record=3)
    with pytest.raises(
        ValueError,
        match=r"^outputs: 'counter.nope' is not an output of this net, nor an input without a source; "
        r"those are 'counter.out', 'counter.nest', 'plus.out'$",
    ):
        mujou.run(net, timer=vt(), record=mujou.Recorder(tmp_path / "b.mcap", outputs=["counter.nope"]))
    with pytest.raises(OSError, match=r"cannot write the recording"):
        mujou.run(net, timer=vt(), record=tmp_path / "missing" / "c.mcap")
    assert not (tmp_path / "b.mcap").exists()
    recorder = mujou.Recorder(tmp_path / "d.mcap")
    with mujou.run(net, timer=vt(), record=recorder) as run:  # the net was left free each time
        run.sleep(0.1)
    with pytest.raises(RuntimeError, match=r"^this mujou.Recorder has recorded a run already"):
        mujou.run(net, timer=vt(), record=recorder)


@pytest.mark.rule("record.optional")
def test_mcap_is_optional() -> None:
    """Planted: mcap imported at the top of the recorder's module (import mujou imports it)."""
    script = textwrap.dedent(
        """
        import sys
        import mujou
        assert "mcap" not in sys.modules, "import mujou imported mcap"
        sys.modules["mcap"] = None  # as if it were not installed
        try:
            mujou.Recorder("x.mcap")
        except ImportError as exc:
            print(exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "recording a run needs the mcap package: pip install 'mujou[record]'"


@pytest.mark.rule("record.processes")
def test_outputs_of_other_processes_are_recorded_as_the_host_sees_them(tmp_path: Path) -> None:
    """A node in another process: its messages reach the file through the host's mirror, with
    sequence 0; the host's own node's messages keep their microsteps. Planted: no mirror of the
    other process's ports (its channel is missing)."""
    from _process_nodes import Echo, Ticker

    path = tmp_path / "p.mcap"
    ticker, echo = Ticker(), Echo()
    net = Bag(ticker=ticker, echo=echo)
    net.connect(ticker.tick, echo.x)
    recorder = mujou.Recorder(path)
    with mujou.run(net, timer=vt(), processes={"p": ticker}, record=recorder) as run:
        run.sleep(1.0)
    file = read(path)
    ticks = file.on("/ticker/tick")
    echoes = file.on("/echo/out")
    assert [tensor_of(m.value).item() for m in ticks] == [1.0, 2.0, 3.0, 4.0]
    assert [m.log_time for m in ticks] == [250_000_000, 500_000_000, 750_000_000, 1_000_000_000]
    assert {m.sequence for m in ticks} == {0}
    assert [tensor_of(m.value).item() for m in echoes] == [2.0, 4.0, 6.0, 8.0]
    assert recorder.lost == 0


@pytest.mark.rule("record.processes", "record.writes")
def test_on_start_messages_and_writes_in_other_processes_are_recorded(tmp_path: Path) -> None:
    """A node in another process: both messages of its on_start are in the file, then its
    updates', and the host's writes on its input (inputs= and run.write) as that input's
    messages. Planted: the recording begun after the processes started (the on_start messages
    are missing), and no mirror of a written input of another process (its channel is missing)."""
    from _replay_nodes import Greeter

    path = tmp_path / "greet.mcap"
    greeter = Greeter()
    recorder = mujou.Recorder(path)
    with mujou.run(
        Bag(g=greeter),
        timer=vt(),
        processes={"p": greeter},
        inputs={greeter.x: torch.tensor(10.0)},
        record=recorder,
    ) as run:
        run.sleep(0.5)
        run.write(greeter.x, torch.tensor(20.0))
        run.sleep(0.5)
    file = read(path)
    assert [tensor_of(m.value).item() for m in file.on("/g/out")] == [-1.0, -2.0, 11.0, 12.0, 23.0, 24.0]
    written = file.on("/g/x")
    assert [tensor_of(m.value).item() for m in written] == [10.0, 20.0]
    assert [m.log_time for m in written] == [0, 500_000_000]
    assert written[0].channel.metadata["direction"] == "input"
    assert {m.sequence for m in file.messages} == {0}
    assert recorder.lost == 0


class Doubler(Node):
    """Triggered by ``x`` (the host's): sends 2 x."""

    x = Input()
    out = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.out.send(2 * x)


class Reader(Node):
    """Triggered by ``x``: keeps what it read."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("x"), seed=0)
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        assert x is not None
        self.seen.append(x.item())


def _doubled() -> tuple[Bag, Doubler, Reader]:
    """A Doubler whose output a Reader reads: the net of the tests of host writes."""
    doubler, reader = Doubler(), Reader()
    bag = Bag(d=doubler, r=reader)
    bag.connect(doubler.out, reader.x)
    return bag, doubler, reader


def _writes(run: mujou.Run, doubler: Doubler) -> None:
    """The host's calls of the recorded run, and of its replay."""
    run.sleep(0.1)
    run.write(doubler.x, torch.tensor(1.0))
    run.sleep(0)
    run.write(doubler.x, torch.tensor(2.0))
    run.sleep(0.1)


@pytest.mark.rule("record.writes", "record.channels", "record.read-ports", "record.read-check-net")
def test_host_writes_are_recorded_as_the_inputs_messages(tmp_path: Path) -> None:
    """inputs= and run.write on an input without a source: the input's channel, each write at
    its stamp, its sequence the microstep its woken node's update follows; the reader shows the
    port as an input, check_net accepts it, and a replay of the node replays its outputs, not
    its inputs. Planted: inputs left out of the recorded ports (no /d/x channel), the reader
    calling every port an output (check_net and the replay refuse /d/x), and the replay sending
    a recorded input (the replay fails)."""
    path = tmp_path / "writes.mcap"

    bag, doubler, reader = _doubled()
    with mujou.run(bag, timer=vt(), inputs={doubler.x: torch.tensor(0.5)}, record=path) as run:
        _writes(run, doubler)
    recorded = reader.seen
    file = read(path)
    written, doubled = file.on("/d/x"), file.on("/d/out")
    assert [tensor_of(m.value).item() for m in written] == [0.5, 1.0, 2.0]
    assert [m.log_time for m in written] == [0, 100_000_000, 100_000_000]
    assert [tensor_of(m.value).item() for m in doubled] == [1.0, 2.0, 4.0]
    for write, answer in zip(written, doubled, strict=True):  # trigger.host: the next microstep
        assert (answer.log_time, answer.sequence) == (write.log_time, write.sequence + 1)
    assert written[0].channel.metadata["direction"] == "input"
    assert doubled[0].channel.metadata["direction"] == "output"
    bag, doubler, reader = _doubled()
    with mujou.Recording(path) as recording:
        assert recording.ports["d.x"].direction == "input"
        assert recording.ports["d.out"].direction == "output"
        recording.check_net(bag)
        replay = mujou.Replay(recording, nodes=["d"])
        with (
            hang_guard(HANG_GUARD),
            mujou.run(bag, timer=vt(), inputs={doubler.x: torch.tensor(0.5)}, replay=replay) as run,
        ):
            _writes(run, doubler)
    assert reader.seen == recorded == [1.0, 2.0, 4.0]


@pytest.mark.rule("replay.writes")
def test_a_replay_makes_the_recorded_hosts_writes_itself(tmp_path: Path) -> None:
    """Replay(writes=True): the recorded host's writes (inputs=, and two run.write at one time
    with the woken nodes' instants between them) are made at their tags, so a host that only
    sleeps replays the run bit for bit, with no node replaced, and with the written node
    replaced (the writes wake its stand-in at its tags). A host call more in the replay moves
    the tags: an error naming both. Bad arguments are refused. Planted: the instants of a time
    not run up to a write's microstep (the second write at 0.1 made at microstep 2, refused);
    the advance run to ``until`` before the writes (made at 0.2, refused); the tag check taken
    away (the host call more passes: DID NOT RAISE)."""
    path = tmp_path / "host.mcap"

    bag, doubler, reader = _doubled()
    with mujou.run(bag, timer=vt(), inputs={doubler.x: torch.tensor(0.5)}, record=path) as run:
        _writes(run, doubler)
        recorded_out = run.read(doubler.out)
        recorded_x = run.read(doubler.x)
    recorded = reader.seen
    assert recorded == [1.0, 2.0, 4.0]
    with mujou.Recording(path) as recording:
        bag, doubler, reader = _doubled()
        with (
            hang_guard(HANG_GUARD),
            mujou.run(bag, timer=vt(), replay=mujou.Replay(recording, nodes=[], writes=True)) as run,
        ):
            run.sleep(0.2)  # no write: the replay makes them
            assert run.time == 0.2
            out, x = run.read(doubler.out), run.read(doubler.x)
        assert reader.seen == recorded
        assert out is not None and recorded_out is not None and torch.equal(out, recorded_out)
        assert x is not None and recorded_x is not None and torch.equal(x, recorded_x)
        bag, doubler, reader = _doubled()
        replay = mujou.Replay(recording, nodes=["d"], writes=True)  # d's writes wake its stand-in
        with hang_guard(HANG_GUARD), mujou.run(bag, timer=vt(), replay=replay) as run:
            run.sleep(0.2)
            assert run.read(doubler.x) == 2.0
        assert reader.seen == recorded
        bag, doubler, reader = _doubled()
        with pytest.raises(ValueError, match=r"inputs= gives 'd\.x', whose first message the replay writes"):
            mujou.run(
                bag,
                timer=vt(),
                inputs={doubler.x: torch.tensor(0.5)},
                replay=mujou.Replay(recording, nodes=[], writes=True),
            )
        bag, doubler, reader = _doubled()
        with (
            hang_guard(HANG_GUARD),
            mujou.run(bag, timer=vt(), replay=mujou.Replay(recording, nodes=[], writes=True)) as run,
        ):
            run.sleep(0.05)
            run.write(doubler.x, torch.tensor(9.0))  # not in the recording: the tags move on
            with pytest.raises(ValueError, match=r"writes 'd\.x' after tag \(0\.1, .*not of this run"):
                run.sleep(0.15)
        with pytest.raises(ValueError, match="only the virtual timer"):
            mujou.run(_doubled()[0], replay=mujou.Replay(recording, nodes=[], writes=True))
        with pytest.raises(ValueError, match="in the host's process only"):
            bag, doubler, reader = _doubled()
            mujou.run(
                bag,
                timer=vt(),
                processes={"far": reader},
                replay=mujou.Replay(recording, nodes=[], writes=True),
            )
        with pytest.raises(ValueError, match="run it without state="):
            mujou.run(
                _doubled()[0], timer=vt(), state={}, replay=mujou.Replay(recording, nodes=[], writes=True)
            )
        with pytest.raises(ValueError, match="does not start at a keyframe"):
            mujou.Replay(recording, nodes=[], writes=True, start=0.0)
        with pytest.raises(ValueError, match=r"at least one node to replace \(or writes=True\)"):
            mujou.Replay(recording, nodes=[])
        with pytest.raises(TypeError, match="writes must be a bool, got str"):
            mujou.Replay(recording, nodes=["d"], writes="yes")  # type: ignore[arg-type]
