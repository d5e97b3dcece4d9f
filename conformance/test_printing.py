"""Conformance tests for what ``print`` shows: ``net.print`` (spec/en/nodes-and-ports.md) and
``observe.stats-print`` (spec/en/observing.md).

The net's text has no measured number in it, so it is compared whole. The table of the stats
is checked by its structure: columns, alignment, units, the exact counts of the virtual timer;
never a measured float's digits.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from _support import vt

import mujou
from mujou import Input, Net, Node, NodeDict, NodeList, Output, TensorSpec

# --------------------------------------------------------------------------------------------
# net.print


class Camera(Node):
    frame = Output(dtype=torch.uint8, shape=(480, 640, 3))

    def on_update(self, dt: float) -> None:
        self.frame.send(torch.zeros(480, 640, 3, dtype=torch.uint8), copy=False)


class Detector(Node):
    frame = Input(dtype=torch.uint8, shape=(None, None, 3))
    boxes: Output[dict[str, Any]] = Output(spec={"boxes": TensorSpec(torch.float32, (None, 4)), "frame": int})

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("frame"), dedicated_thread=True)

    def on_update(self, dt: float) -> None:
        self.boxes.send({"boxes": torch.zeros(2, 4), "frame": 1})


class Logger(Node):
    boxes: Input[dict[str, Any]] = Input()
    cmd = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(period=1.0)


class Joint(Node):
    pass


class Arm(Net):
    def __init__(self) -> None:
        super().__init__()
        self.joint = Joint(rate=50)


class Robot(Net):
    """The net of the spec's example."""

    def __init__(self) -> None:
        super().__init__()
        self.camera = Camera(rate=30)
        self.detector = Detector()
        self.logger = Logger()
        self.arm = Arm()
        self.connect(self.camera.frame, self.detector.frame)
        self.connect(self.detector.boxes, self.logger.boxes)


SPEC_EXAMPLE = """\
Robot(
  (camera): Camera(period=33.33 ms (30 Hz), cpu, worker pool)
    out frame: Output[uint8[480, 640, 3]] -> detector.frame
  (detector): Detector(trigger=on('frame'), cpu, own thread)
    in  frame: Input[uint8[?, ?, 3]] <- camera.frame
    out boxes: Output[{'boxes': float32[?, 4], 'frame': int}] -> logger.boxes
  (logger): Logger(period=1 s (1 Hz), cpu, worker pool)
    in  boxes: Input <- detector.boxes
    in  cmd: Input (optional) <- host
  (arm): Arm(
    (joint): Joint(period=20 ms (50 Hz), cpu, worker pool)
  )
)"""


@pytest.mark.rule("net.print")
def test_a_net_prints_as_the_tree_of_its_nodes_ports_and_connections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """> str() of a net or node container (what print shows) is its tree, as print shows a
    > torch.nn.Module ... str() of a node is its part of the tree. repr() stays one line."""
    robot = Robot()
    print(robot)
    assert capsys.readouterr().out == SPEC_EXAMPLE + "\n"
    assert repr(robot) == "<Robot net: 4 nodes>"
    assert str(robot.camera) == (
        "Camera(period=33.33 ms (30 Hz), cpu, worker pool)\n"
        "  out frame: Output[uint8[480, 640, 3]] -> detector.frame"
    )
    assert str(robot.arm) == "Arm(\n  (joint): Joint(period=20 ms (50 Hz), cpu, worker pool)\n)"
    assert repr(robot.camera) == "<Camera 'camera' period=0.0333333 cpu>"


class Timed(Node):
    x = Input()
    y = Output(spec=(torch.Tensor, TensorSpec(shape=(2,))))

    def __init__(self) -> None:
        super().__init__(period=2.5, trigger=mujou.on("x"), min_interval=0.0005, delay=0.25)


class Containers(Net):
    def __init__(self) -> None:
        super().__init__()
        self.legs = NodeList([Joint(period=0.5), Timed()])
        self.hands = NodeDict({"left": Joint()})
        self.none: NodeList[Joint] = NodeList()
        self.connect(self.legs[1].y, self.legs[1].x)  # type: ignore[attr-defined]  # a Timed


@pytest.mark.rule("net.print")
def test_containers_triggers_and_timings_print_in_the_tree() -> None:
    """> A sub-net or container is a nested tree. A node is Class(settings): its period with its
    > rate in Hz, or its trigger (or both), min_interval and delay when not 0, its device, and
    > worker pool or own thread."""
    net = Containers()
    assert str(net).splitlines() == [
        "Containers(",
        "  (legs): NodeList(",
        "    (0): Joint(period=500 ms (2 Hz), cpu, worker pool)",
        "    (1): Timed(period=2.5 s (0.4 Hz), trigger=on('x'), min_interval=500 µs, delay=250 ms, cpu, "
        "worker pool)",
        "      in  x: Input <- legs.1.y",
        "      out y: Output[(tensor, tensor[2])] -> legs.1.x",
        "  )",
        "  (hands): NodeDict(",
        "    (left): Joint(period=10 ms (100 Hz), cpu, worker pool)",
        "  )",
        "  (none): NodeList()",
        ")",
    ]
    assert str(NodeList()) == "NodeList()"


# --------------------------------------------------------------------------------------------
# observe.stats-print


class Source(Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.zeros(1))


class Slow(Node):
    x = Input()

    def __init__(self) -> None:
        super().__init__(period=1.0)


class Alone(Node):
    def __init__(self) -> None:
        super().__init__(period=0.5, dedicated_thread=True)


class Observed(Net):
    def __init__(self) -> None:
        super().__init__()
        self.source = Source()
        self.slow = Slow()
        self.alone = Alone()
        self.connect(self.source.y, self.slow.x)


DURATION = r"(0|\d+\.\d µs|\d+\.\d\d ms|\d+\.\d\d\d s)"


@pytest.mark.rule("observe.stats-print")
def test_stats_print_as_an_aligned_table_with_units() -> None:
    """> str() of a RunStats (what print shows) is a table: a heading line ...; a row per node,
    > in the order of nodes ...; the columns aligned, each duration with its unit ...; then,
    > after an empty line, a row per worker with its worker_busy as a percentage."""
    with mujou.run(Observed(), timer=vt(), workers=2) as run:
        run.sleep(2.0)
        stats = run.stats()
    lines = str(stats).splitlines()
    assert lines[0] == "RunStats at t=2.000 s: 3 nodes, 2 workers"
    columns = ["node", "updates", "skipped", "late p50", "late p99", "late max", "busy", "coalesced"]
    assert lines[1].split() == " ".join(columns).split()
    table = lines[1:5]
    assert len({len(line) for line in table}) == 1, table  # right-aligned: one width
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert list(rows) == ["source", "slow", "alone"]
    # Under the virtual timer the counts are exact and every lateness is 0.
    summed = str(sum(stats.nodes["slow"].coalesced.values()))  # the sum over its inputs
    expected = {"source": ("8", "0", "-"), "slow": ("2", "0", summed), "alone": ("4", "0", "-")}
    for name, (updates, skipped, coalesced) in expected.items():
        match = re.fullmatch(
            rf"{name}\s+{updates}\s+{skipped}\s+0\s+0\s+0\s+{DURATION}\s+{re.escape(coalesced)}", rows[name]
        )
        assert match, rows[name]
    assert list(stats.nodes["slow"].coalesced) == ["x"] and int(summed) > 0
    assert lines[5] == ""
    assert lines[6].split() == ["worker", "busy"]
    assert len(lines) == 9
    for index, line in enumerate(lines[7:]):
        assert re.fullmatch(rf"{index}\s+\d{{1,3}}%", line), line
    assert repr(stats) == "<RunStats t=2.000 s: 3 nodes, 2 workers>"
    assert repr(stats.nodes["slow"]).startswith("NodeStats(updates=2, skipped=0, busy=")


@pytest.mark.rule("observe.stats-print")
def test_durations_carry_their_unit() -> None:
    """> each duration with its unit (µs, ms or s, and 0 for zero)."""
    node = mujou.NodeStats(
        updates=1,
        skipped=0,
        busy=2.5,
        dt_min=0.0,
        dt_mean=0.0,
        dt_max=0.0,
        lateness_p50=12.34e-6,
        lateness_p99=1.5e-3,
        lateness_max=0.0,
        coalesced={},
    )
    stats = mujou.RunStats(time=1.0, workers=0, nodes={"n": node}, worker_busy=())
    lines = str(stats).splitlines()
    assert lines[2].split() == ["n", "1", "0", "12.3", "µs", "1.50", "ms", "0", "2.500", "s", "-"]
    assert lines[3:] == ["", "no workers: every node has a thread of its own"]
    lost = mujou.RunStats(time=1.0, workers=0, nodes={"n": node}, worker_busy=(), lost=3)
    assert (
        str(lost).splitlines()[0]
        == "RunStats at t=1.000 s: 1 node, 0 workers, 3 messages lost by the recording"
    )
    assert repr(lost) == "<RunStats t=1.000 s: 1 node, 0 workers, 3 messages lost by the recording>"
