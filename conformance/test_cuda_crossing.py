"""Conformance tests for CUDA messages that leave their process: to another process
(spec/en/processes.md, ``proc.transport``), to another host (spec/en/several-machines.md,
``hosts.data-plane``), and into a recording and back out of it (spec/en/record-and-replay.md).

Each places :class:`_cuda_nodes.CudaPipeline` (a CUDA camera, a CUDA and a CPU follower of it,
and a CUDA node that reads the CPU one) and checks, under the virtual timer, that the run gives
the bits of the same net in one process, and that every node found each message on its own
device. They need a CUDA device and skip without one; ``gpu="cpu"`` runs the same logic on the
CPU, which is how it was checked where no GPU is (the CPU paths have tests of their own).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _agents import SECRET, LocalHost
from _cuda_nodes import CudaPipeline
from _support import HANG_GUARD, assert_same, hang_guard, vt

import mujou

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device; CUDA is not available here"
    ),
]

STEPS = (0.05, 0.1, 0.05)  # virtual seconds the host sleeps, in turn: 20 frames of 0.01 s
FRAMES = 20


def pipeline_run(net: CudaPipeline, **run_arguments: Any) -> dict[str, Any]:
    """Run the pipeline under the virtual timer; everything the host sees of it."""
    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt(), workers=2, **run_arguments) as run:
        back = run.subscribe(net.back.out, maxsize=1000)
        frames = run.subscribe(net.camera.frame, maxsize=1000)
        for seconds in STEPS:
            run.sleep(seconds)
        read = run.read(net.gpu.out)
        return {
            "time": run.time,
            "tree": run.state_dict(),
            "back": back.drain(),
            "frames": frames.drain(),
            "read": read,
            "read_device": None if read is None else read.device.type,
        }


def assert_on_their_devices(seen: dict[str, Any], nodes: tuple[str, ...] = ("gpu", "cpu", "back")) -> None:
    """Every follower updated once a frame and found each message on its own device; the
    host's read and subscriptions got CPU copies."""
    tree = seen["tree"]
    for name in nodes:
        assert tree[name]["off_device"] == 0, (name, tree[name]["off_device"])
        assert len(tree[name]["stamps"]) == FRAMES, (name, tree[name]["stamps"])
    assert seen["read_device"] == "cpu"
    assert all(message.device.type == "cpu" for message in seen["back"] + seen["frames"])


def alone(gpu: str = "cuda") -> dict[str, Any]:
    seen = pipeline_run(CudaPipeline(gpu))
    assert_on_their_devices(seen)
    assert len(seen["frames"]) == FRAMES
    return seen


def assert_same_run(first: dict[str, Any], second: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    for key in ("time", "back", "frames", "read"):
        assert_same(first[key], second[key], key)
    assert_same(
        {name: value for name, value in first["tree"].items() if name not in skip},
        {name: value for name, value in second["tree"].items() if name not in skip},
        "tree",
    )


@pytest.mark.rule(
    "proc.transport", "proc.virtual", "devices.messages-on-node-device", "cuda.cpu-readers-get-cpu-copy"
)
def test_cuda_messages_cross_processes_onto_each_readers_device(gpu: str = "cuda") -> None:
    """> A tensor on a CUDA device crosses through host memory. [...] The reader's message is
    a copy of its own, on its node's device. The camera in a process of its own, the CUDA
    followers in another, the CPU follower on the run's host: the same bits as in one process,
    each message on its reader's device."""
    net = CudaPipeline(gpu)
    placed = pipeline_run(net, processes={"camera": net.camera, "gpu": [net.gpu, net.back]})
    assert_on_their_devices(placed)
    assert_same_run(alone(gpu), placed)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHost]:
    agent = LocalHost(tmp_path_factory.mktemp("agents") / "a.log")
    yield agent
    agent.close()


@pytest.mark.rule("hosts.data-plane", "hosts.virtual", "devices.messages-on-node-device")
def test_cuda_messages_cross_hosts_onto_each_readers_device(host: LocalHost, gpu: str = "cuda") -> None:
    """> A CUDA tensor crosses through host memory. The camera and the CUDA followers in two
    groups on another host, the CPU follower on the run's host: the same bits as in one
    process, each message on its reader's device."""
    net = CudaPipeline(gpu)
    placed = pipeline_run(
        net,
        processes={
            "camera": mujou.OnHost(net.camera, host.address, secret=SECRET),
            "gpu": mujou.OnHost([net.gpu, net.back], host.address, secret=SECRET),
        },
    )
    assert_on_their_devices(placed)
    assert_same_run(alone(gpu), placed)
    host.wait_no_group_process()


@pytest.mark.rule("record.channels", "record.encoding", "replay.replaced", "replay.identical")
def test_a_cuda_output_is_recorded_as_its_cpu_copy_and_replayed_onto_its_device(
    tmp_path: Path, gpu: str = "cuda"
) -> None:
    """A CUDA camera's frames are in the file as the host's CPU copies of them, on a channel
    that names the camera's device; a replay with the camera replaced sends them on that device
    again, and every other node's bits are the recorded run's."""
    path = tmp_path / "cuda.mcap"
    recorded = pipeline_run(CudaPipeline(gpu), record=mujou.Recorder(path))
    assert_on_their_devices(recorded)
    recording = mujou.Recording(path)
    try:
        port = recording.ports["camera.frame"]
        assert port.device == str(torch.device(gpu, 0) if gpu == "cuda" else torch.device(gpu))
        assert port.messages == FRAMES
        frames = [message.value for message in recording.messages("camera.frame")]
        assert all(frame.device.type == "cpu" for frame in frames)
        assert_same(frames, recorded["frames"], "frames")
        net = CudaPipeline(gpu)
        replayed = pipeline_run(net, replay=mujou.Replay(recording, nodes=[net.camera]))
    finally:
        recording.close()
    assert_on_their_devices(replayed)
    assert replayed["tree"]["camera"] == {}  # a replaced node's hooks do not run
    assert net.camera.count == 0
    assert_same_run(recorded, replayed, skip=("camera",))
