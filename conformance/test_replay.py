"""Replay (the "Replay" section of spec/en/record-and-replay.md): a run with some nodes replaced
by their recording.

The property test records random nets (those of test_trigger_properties.py: periodic and
triggered nodes, joins, delays, host writes) under the virtual timer and replays them with a
random set of nodes replaced, with 1, 2 or 4 workers on either side: every node not replaced
must end the same, bit for bit, with every read it made kept in its state. The other tests use
the camera, detector and sink of ``_replay_nodes``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from _replay_nodes import Camera, Pipeline
from _support import HANG_GUARD, hang_guard, vt, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_trigger_properties import (
    CellSpec,
    Scenario,
    Step,
    Write,
    build,
    differences,
    do,
    outcome,
    scenarios,
)

import mujou
from mujou import Output, TensorSpec

pytest.importorskip("mcap")

REPLAYS = settings(
    max_examples=40,  # each is two small runs and a file: about 0.3 s on 2 busy cores
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
)


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    """A longer guard than conftest's for the property test, which runs many nets; each run
    is guarded on its own too (``HANG_GUARD``)."""
    with hang_guard(300.0):
        yield


Opener = Callable[[Path], mujou.Recording]


@pytest.fixture
def opened() -> Iterator[Opener]:
    """``mujou.Recording(path)``, closed when the test ends."""
    recordings: list[mujou.Recording] = []

    def open_recording(path: Path) -> mujou.Recording:
        recordings.append(mujou.Recording(path))
        return recordings[-1]

    yield open_recording
    for recording in recordings:
        recording.close()


def _without(result: dict[str, Any], replaced: Sequence[int]) -> dict[str, Any]:
    """``outcome`` without what only the replaced nodes hold: their records and tree entries."""
    tree = dict(result["tree"])
    for i in replaced:
        del tree[f"n{i}"]
    records = [None if i in replaced else record for i, record in enumerate(result["records"])]
    return {**result, "tree": tree, "records": records}


# --------------------------------------------------------------------------------------------
# replay.identical: random nets


@pytest.mark.rule("replay.identical", "replay.replaced", "replay.state")
@REPLAYS
@given(scenarios(), st.data())
def test_any_net_replays_bit_for_bit(tmp_path: Path, scenario: Scenario, data: st.DataObject) -> None:
    """> Under the virtual timer, a replay of a recording made under the virtual timer, of the
    same net with the same seeds and the same host calls, is bit-identical to the recorded run
    for every node that is not replaced [...] whatever the number of workers of either run."""
    count = len(scenario.cells)
    replaced = sorted(data.draw(st.sets(st.integers(0, count - 1), min_size=1, max_size=count - 1)))
    recorded_with, replayed_with = (
        data.draw(st.sampled_from((1, 2, 4))),
        data.draw(st.sampled_from((1, 2, 4))),
    )
    path = tmp_path / f"run-{data.draw(st.integers(0, 10**9))}.mcap"
    net, nodes = build(scenario.cells)
    with (
        hang_guard(HANG_GUARD),
        mujou.run(net, timer=vt(), workers=recorded_with, record=mujou.Recorder(path)) as run,
    ):
        for step in scenario.steps:
            do(run, nodes, step)
        recorded = outcome(run, nodes)
    net, nodes = build(scenario.cells)
    with mujou.Recording(path) as recording:
        replay = mujou.Replay(recording, nodes=[f"n{i}" for i in replaced])
        with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=replayed_with, replay=replay) as run:
            for step in scenario.steps:
                do(run, nodes, step)
            replayed = outcome(run, nodes)
    for i in replaced:
        assert replayed["tree"][f"n{i}"] == {}, "a replaced node's entry is empty (replay.state)"
        assert nodes[i].record == [], f"node n{i} is replaced: its on_update must not run"
    found = differences(_without(recorded, replaced), _without(replayed, replaced))
    assert not found, (
        f"replaying nodes {replaced} ({recorded_with} worker(s) recorded, {replayed_with} replayed) "
        "changed the others:\n" + "\n".join(found[:10])
    )


def _cell(
    period: float | None,
    trigger: tuple[str, ...],
    sources: tuple[int | str | None, ...],
    *,
    seed: int,
    delay: float = 0.0,
    min_interval: float = 0.0,
) -> CellSpec:
    return CellSpec(period, trigger, False, None, delay, min_interval, sources, seed)


# Two nets whose tags are easy to confuse on disk, where the property test may not go.
TAG_CASES = {
    # n0 is periodic and woken by its own output 0.005 later, at most every 0.01: at 0.07 it
    # updates at 7 * 0.01 and at 0.06 + 0.01, two instants in one nanosecond (recorded as
    # microsteps 0 and 1 of 70000000 ns); n1 wakes 0.005 after each of n0's messages.
    "one nanosecond": (
        Scenario(
            (
                _cell(0.01, ("c",), (None, None, 0), seed=3, delay=0.005, min_interval=0.01),
                _cell(0.01, ("b",), (None, 0, None), seed=4, delay=0.005),
                _cell(0.02, (), (1, None, None), seed=5),
            ),
            (Step((), 0.1),),
        ),
        [0, 1],
    ),
    # The host writes to n1 three times at time 0.0, in three calls: n1 and then n2 wake in
    # each, at microsteps that go on from call to call.
    "host calls at one time": (
        Scenario(
            (
                _cell(0.01, (), (None, None, None), seed=3),
                _cell(None, ("a",), ("host", None, None), seed=4),
                _cell(None, ("b",), (None, 1, None), seed=5),
            ),
            (
                Step((Write(1, "a", 2.0),), 0.0),
                Step((Write(1, "a", -1.0),), 0.0),
                Step((Write(1, "a", 0.25),), 0.01),
            ),
        ),
        [1],
    ),
}


@pytest.mark.rule("replay.identical", "replay.replaced")
@pytest.mark.parametrize("case", list(TAG_CASES))
def test_every_tag_is_replayed_apart(tmp_path: Path, case: str) -> None:
    """> in each of its updates the messages recorded at that update's tag: two instants in
    one nanosecond, and updates at one time in several host calls, are tags of their own."""
    scenario, replaced = TAG_CASES[case]
    path = tmp_path / "tags.mcap"
    net, nodes = build(scenario.cells)
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=1, record=mujou.Recorder(path)) as run:
        for step in scenario.steps:
            do(run, nodes, step)
        recorded = outcome(run, nodes)
    net, nodes = build(scenario.cells)
    with mujou.Recording(path) as recording:
        assert any(message.microstep > 0 for message in recording.messages(ports=["n1.y"]))
        replay = mujou.Replay(recording, nodes=[f"n{i}" for i in replaced])
        with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=2, replay=replay) as run:
            for step in scenario.steps:
                do(run, nodes, step)
            replayed = outcome(run, nodes)
    found = differences(_without(recorded, replaced), _without(replayed, replaced))
    assert not found, "\n".join(found[:10])


# --------------------------------------------------------------------------------------------
# The camera net


STEPS = (0.05, 0.0, 0.105, 0.2)  # what the host sleeps, in turn (0.0: the tags already due)


def record(path: Path, *, workers: int = 2, state_every: float | None = None) -> dict[str, Any]:
    """Record the camera net under the virtual timer; its final state tree."""
    net = Pipeline()
    recorder = mujou.Recorder(path) if state_every is None else mujou.Recorder(path, state_every=state_every)
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=workers, record=recorder) as run:
        for seconds in STEPS:
            run.sleep(seconds)
        return run.state_dict()


def same_except_camera(recorded: dict[str, Any], replayed: dict[str, Any]) -> list[str]:
    return differences(
        {key: value for key, value in recorded.items() if key != "camera"},
        {key: value for key, value in replayed.items() if key != "camera"},
    )


@pytest.mark.rule("replay.replaced", "replay.identical", "replay.state")
def test_a_replaced_camera_runs_no_hook_and_the_rest_is_the_same(tmp_path: Path, opened: Opener) -> None:
    """> A replaced node keeps its name, ports, period, trigger and inputs [...] its hooks
    [...] do not run. In place of its `on_start` it sends the messages recorded at the run's
    first tag, and in each of its updates the messages recorded at that update's tag."""
    path = tmp_path / "camera.mcap"
    recorded = record(path)
    net = Pipeline()
    replay = mujou.Replay(opened(path), nodes=[net.camera])
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=1, replay=replay) as run:
        first = run.read(net.camera.frame)
        assert first is not None and first.tolist() == [-1.0, -1.0]  # its on_start's message
        for seconds in STEPS:
            run.sleep(seconds)
        replayed = run.state_dict()
        stats = run.stats().nodes["camera"]
    assert net.camera.calls == []
    assert stats.updates == 35  # due as the camera was: at 0.01, 0.02, ..., 0.35
    assert replayed["camera"] == {}
    assert not same_except_camera(recorded, replayed), same_except_camera(recorded, replayed)


@pytest.mark.rule("replay.seed", "replay.identical")
def test_a_replay_takes_the_recorded_runs_seed(tmp_path: Path, opened: Opener) -> None:
    """> When `mujou.run` is given `replay=` and no `seed=`, the run's seed is the recorded
    run's [...]: a node without a seed of its own draws what it drew in the recorded run."""
    path = tmp_path / "seeded.mcap"
    net = Pipeline(detector_seed=None)
    recorder = mujou.Recorder(path)
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=2, seed=1234, record=recorder) as run:
        for seconds in STEPS:
            run.sleep(seconds)
        recorded = run.state_dict()
    net = Pipeline(detector_seed=None)
    replay = mujou.Replay(opened(path), nodes=["camera"])
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=1, replay=replay) as run:
        assert run.seed == 1234
        for seconds in STEPS:
            run.sleep(seconds)
        replayed = run.state_dict()
    assert not same_except_camera(recorded, replayed), same_except_camera(recorded, replayed)


@pytest.mark.rule("replay.start", "replay.identical")
def test_a_replay_from_a_keyframe_ends_as_the_recorded_run(tmp_path: Path, opened: Opener) -> None:
    """> `mujou.Replay(recording, nodes=..., start=t)` starts the run from the recording's
    keyframe at or before `t` [...]; the replaced nodes then send the messages recorded after
    the keyframe's time, and none in place of `on_start`."""
    path = tmp_path / "keyframes.mcap"
    recorded = record(path, state_every=0.1)
    recording = opened(path)
    keyframe = recording.state_at(0.25)
    start = keyframe["@mujou"]["time"]
    assert 0.0 < start <= 0.25
    net = Pipeline()
    replay = mujou.Replay(recording, nodes=["camera"], start=0.25)
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=2, replay=replay) as run:
        assert run.time == start
        run.sleep(sum(STEPS) - start)
        replayed = run.state_dict()
    assert net.camera.calls == []
    assert not same_except_camera(recorded, replayed), same_except_camera(recorded, replayed)


@pytest.mark.rule("replay.tag-mismatch")
@pytest.mark.parametrize("camera", ["slower", "triggered"])
def test_a_recording_of_another_run_stops_the_replay(tmp_path: Path, camera: str, opened: Opener) -> None:
    """> a recorded message of a replaced node at a tag where the node does not update stops
    the run as a failing hook does [...]: when the node updates at a later tag first, or when
    the run stops at a later time. The `HookError`'s cause is a `ValueError` that names the
    node, the port and the message's tag."""
    path = tmp_path / "camera.mcap"
    record(path)
    # A camera at 0.02 updates first at 0.02, after the frame recorded at 0.01; a triggered one
    # never updates, and the run stops at 0.035, after it.
    other = Camera(period=0.02) if camera == "slower" else Camera(triggered=True)
    net = Pipeline(other)
    replay = mujou.Replay(opened(path), nodes=["camera"])
    with (
        pytest.raises(mujou.HookError) as caught,
        hang_guard(HANG_GUARD),
        mujou.run(net, timer=vt(), replay=replay) as run,
    ):
        run.sleep(0.035)
    assert caught.value.hook == ("on_update" if camera == "slower" else "on_stop")
    cause = caught.value.__cause__
    assert isinstance(cause, ValueError)
    assert re.match(
        r"^replay of node 'camera': the recording has a message on 'camera\.frame' at tag \(0\.01, 0\)",
        str(cause),
    ), cause


# --------------------------------------------------------------------------------------------
# replay.mismatch


class CameraOf64(Camera):
    frame = Output(spec=TensorSpec(torch.float64, (2,)))

    def on_start(self) -> None:
        self.frame.send(torch.full((2,), -1.0, dtype=torch.float64))

    def on_update(self, dt: float) -> None:
        self.frame.send(torch.rand(2, generator=self.generator, dtype=torch.float64))


class CameraOf3(Camera):
    """Declares frames of 3 (the recording's are of 2): replay.mismatch, a declared shape."""

    frame = Output(spec=TensorSpec(torch.float32, (3,)))

    def on_start(self) -> None:
        self.frame.send(torch.full((3,), -1.0))

    def on_update(self, dt: float) -> None:
        self.frame.send(torch.rand(3, generator=self.generator))


class CameraWithDepth(Camera):
    depth = Output()

    def on_update(self, dt: float) -> None:
        super().on_update(dt)
        self.depth.send(torch.ones(1))


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The camera net recorded (and its final state tree), and the same net with a camera that
    has a depth output too."""
    folder = tmp_path_factory.mktemp("replay")
    paths: dict[str, Any] = {
        "camera": folder / "camera.mcap",
        "depth": folder / "depth.mcap",
        "no depth": folder / "no-depth.mcap",
    }
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as conftest's fixture does for each test, which runs after this
    try:
        paths["tree"] = record(paths["camera"])
        net = Pipeline(CameraWithDepth())
        with (
            hang_guard(HANG_GUARD),
            mujou.run(net, timer=vt(), workers=1, record=mujou.Recorder(paths["depth"])) as run,
        ):
            run.sleep(0.05)
        net = Pipeline(CameraWithDepth())
        chosen = ["camera.frame", "detector.boxes"]  # camera.depth left out
        with (
            hang_guard(HANG_GUARD),
            mujou.run(net, timer=vt(), workers=1, record=mujou.Recorder(paths["no depth"], outputs=chosen)),
        ):
            pass
    finally:
        torch.set_num_threads(before)
    return paths


MISMATCHES = {
    "unknown": r"^Replay nodes 'camara' are not nodes of the net; its nodes: 'camera', 'detector', 'sink'$",
    "dtype": (
        r"^the recording does not fit the net: 'camera\.frame': the port declares dtype float64, the "
        r"recording's is float32$"
    ),
    "shape": (
        r"^the recording does not fit the net: 'camera\.frame': the port declares shape \[3\], the "
        r"recording's is \[2\]$"
    ),
    "missing": r"^the recording does not fit the net: 'camera\.depth' is not in the recording$",
    "extra": (
        r"^the recording does not fit the net: 'camera\.depth' is recorded, but node 'camera' has no "
        r"output 'depth'$"
    ),
    "left out": (
        r"^the recording does not fit the net: 'camera\.depth' was left out of the recording "
        r"\(Recorder\(outputs=\)\); record every output$"
    ),
    "rate": r"^Replay rate=2\.0 is for the real-time timer",
    "both": r"^give the replay's first state either as Replay\(start=\)",
}


@pytest.mark.rule("replay.mismatch")
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_a_replay_that_does_not_fit_is_refused_before_any_node_starts(
    recordings: dict[str, Any], case: str, opened: Opener
) -> None:
    """> Before any node starts, `mujou.run` raises `ValueError` when a name in `nodes` is not
    a node of the net (the message lists its nodes); when the ports of a replaced node do not
    match the recording as [](#record.read-check-net) checks them, but for the period [...]:
    an output of it not recorded [...], a port the recording holds for it that it does not
    have, a declared kind, dtype or shape recorded otherwise, or an output left out of the
    recording by `Recorder(outputs=)` [...]; when `rate` is not `1.0` under the virtual timer
    [...] and when both `Replay(start=)` and `state=` are given.

    Planted (the shape case, added with the check shared with check_net): the replay's check
    without the declared shape (the run starts)."""
    files = {"extra": "depth", "left out": "no depth"}
    recording = opened(recordings[files.get(case, "camera")])
    cameras: dict[str, Camera] = {
        "dtype": CameraOf64(),
        "shape": CameraOf3(),
        "missing": CameraWithDepth(),
        "left out": CameraWithDepth(),
    }
    net = Pipeline(cameras.get(case))
    nodes = ["camara" if case == "unknown" else "camera"]
    rate = 2.0 if case == "rate" else 1.0
    start = 0.0 if case == "both" else None
    state: dict[str, Any] | None = {"@mujou": {}} if case == "both" else None
    replay = mujou.Replay(recording, nodes=nodes, rate=rate, start=start)
    with pytest.raises(ValueError, match=MISMATCHES[case]):
        mujou.run(net, timer=vt(), replay=replay, state=state)
    assert net.camera.calls == [] and not net.detector.seen
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt()) as run:  # nothing was left running
        run.sleep(0.01)


@pytest.mark.rule("replay.mismatch")
def test_replay_arguments_are_checked(recordings: dict[str, Any], opened: Opener) -> None:
    """> `Replay` raises `TypeError` for a `recording` that is not a `mujou.Recording`, `nodes`
    that is not a list of names or nodes, and `start` or `rate` that are not real numbers;
    `ValueError` for no node, a node named twice, a negative `start` and a `rate` that is not
    `> 0`."""
    recording = opened(recordings["camera"])
    with pytest.raises(TypeError, match=r"^recording must be a mujou\.Recording, got str"):
        mujou.Replay("camera.mcap", nodes=["camera"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^nodes must be a list of node names or nodes, got str"):
        mujou.Replay(recording, nodes="camera")
    with pytest.raises(TypeError, match=r"^nodes must hold node names \(str\) or nodes, got int"):
        mujou.Replay(recording, nodes=[3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^start must be a real number"):
        mujou.Replay(recording, nodes=["camera"], start="0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^rate must be a real number"):
        mujou.Replay(recording, nodes=["camera"], rate="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^nodes must name at least one node"):
        mujou.Replay(recording, nodes=[])
    with pytest.raises(ValueError, match=r"^nodes names 'camera' twice$"):
        mujou.Replay(recording, nodes=["camera", "camera"])
    with pytest.raises(ValueError, match=r"^start must be a finite number"):
        mujou.Replay(recording, nodes=["camera"], start=-1.0)
    with pytest.raises(ValueError, match=r"^rate must be a finite number"):
        mujou.Replay(recording, nodes=["camera"], rate=0.0)
    with pytest.raises(TypeError, match=r"^replay must be a mujou\.Replay or None, got str"):
        mujou.run(Pipeline(), timer=vt(), replay="camera")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# replay.real-time, replay.processes, replay.one-run


@pytest.mark.rule("replay.real-time")
def test_real_time_replay_pauses_seeks_and_sends_in_order(recordings: dict[str, Any], opened: Opener) -> None:
    """> Under the real-time timer a replay has a position in the recording [...] it then moves
    `rate` recording seconds per timer second. [...] a replaced node sends, in order, every
    recorded message up to the position that it has not sent. `replay.pause()` holds the
    position, `replay.resume()` moves it on from there, and `replay.seek(t)` sets it to `t`,
    forward or back (a pause stays): the replaced nodes then send the messages recorded after
    `t`. Under the virtual timer, and outside a running run, the three raise `RuntimeError`."""
    recording = opened(recordings["camera"])
    frames = [message.value.tolist() for message in recording.messages(ports=["camera.frame"])]
    times = [message.time for message in recording.messages(ports=["camera.frame"])]
    replay = mujou.Replay(recording, nodes=["camera"], rate=4.0)
    with pytest.raises(RuntimeError, match=r"^Replay\.pause\(\): the replay is in no running run"):
        replay.pause()
    net = Pipeline()
    with hang_guard(HANG_GUARD), mujou.run(net, replay=replay, workers=2) as run:
        wait_until(lambda: replay.position > 0.15, "the position to pass 0.15 at 4x")
        replay.pause()
        held = replay.position
        run.sleep(0.03)
        assert replay.position == held  # paused: it does not move
        replay.seek(0.1)  # back
        assert replay.position == 0.1  # set, and still paused
        subscription = run.subscribe(net.camera.frame)
        replay.resume()
        first_after = times.index(next(t for t in times if t > 0.1))
        expected = frames[first_after : first_after + 5]
        got: list[Any] = []
        while expected[0] not in got or len(got) - got.index(expected[0]) < len(expected):
            got.append(subscription.get(timeout=HANG_GUARD).tolist())
        assert got[got.index(expected[0]) :][: len(expected)] == expected  # in order, none skipped
    assert net.camera.calls == []
    virtual = mujou.Replay(recording, nodes=["camera"])
    with hang_guard(HANG_GUARD), mujou.run(Pipeline(), timer=vt(), replay=virtual):
        for call in (virtual.pause, virtual.resume, lambda: virtual.seek(0.0)):
            with pytest.raises(RuntimeError, match=r"^Replay\.\w+\(\) is for the real-time timer"):
                call()


@pytest.mark.rule("replay.one-run")
def test_a_replay_is_in_one_run_at_a_time(recordings: dict[str, Any], opened: Opener) -> None:
    """> passing it to `mujou.run` while a run it is in has not ended raises `RuntimeError`;
    once that run ended, it may be passed again, and starts over."""
    replay = mujou.Replay(opened(recordings["camera"]), nodes=["camera"])
    results = []
    for _ in range(2):
        net = Pipeline()
        with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), replay=replay) as run:
            with pytest.raises(RuntimeError, match=r"^this Replay is in a run that has not ended"):
                mujou.run(Pipeline(), timer=vt(), replay=replay)
            run.sleep(0.05)
            results.append(run.state_dict()["sink"])
    assert not differences(results[0], results[1])


@pytest.mark.rule("replay.processes", "replay.identical")
def test_a_replay_with_processes(recordings: dict[str, Any], opened: Opener) -> None:
    """> A replaced node runs in the host's process: one placed in a child process by
    `processes=` makes `mujou.run` raise `ValueError` before any node starts. The other nodes
    may run in processes of their own. (And the replay is identical with them.)"""
    recording = opened(recordings["camera"])
    net = Pipeline()
    with pytest.raises(ValueError, match=r"^Replay nodes 'camera' are placed in a child process"):
        mujou.run(
            net, timer=vt(), processes={"far": net.camera}, replay=mujou.Replay(recording, nodes=["camera"])
        )
    recorded = recordings["tree"]
    replay = mujou.Replay(recording, nodes=["camera"])
    with (
        hang_guard(HANG_GUARD * 2),
        mujou.run(net, timer=vt(), processes={"far": [net.detector, net.sink]}, replay=replay) as run,
    ):
        for seconds in STEPS:
            run.sleep(seconds)
        replayed = run.state_dict()
    assert net.camera.calls == []
    assert not same_except_camera(recorded, replayed), same_except_camera(recorded, replayed)
