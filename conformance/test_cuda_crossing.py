"""Conformance tests for CUDA messages that leave their process: to another process
(spec/en/processes.md, ``proc.transport``), to another host (spec/en/several-machines.md,
``hosts.data-plane``; by NCCL from device to device under the real-time timer,
``hosts.nccl-lane``), and into a recording and back out of it (spec/en/record-and-replay.md).

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
from _agents import SECRET, LocalHost, one_local_host, two_local_hosts
from _cuda_nodes import CudaPipeline, LanePair
from _support import HANG_GUARD, assert_same, hang_guard, vt, wait_until

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
    yield from one_local_host(tmp_path_factory.mktemp("agents"))


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


@pytest.fixture(scope="module")
def gpu_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalHost, LocalHost]]:
    """Two local "hosts" that NCCL takes for two machines though they share this one's GPUs:
    each agent, and every process it starts, has an ``NCCL_HOSTID`` of its own (without it NCCL
    refuses two processes on one GPU: "Duplicate GPU detected"). Mujou sets no such variable."""
    yield from two_local_hosts(
        tmp_path_factory.mktemp("nccl-agents"),
        ({"NCCL_HOSTID": "mujou-test-host-a"}, {"NCCL_HOSTID": "mujou-test-host-b"}),
    )


LANE_FRAMES = 20  # numbered frames the reader on the other host reads, at least


@pytest.mark.rule("hosts.nccl-lane", "hosts.nccl-streams", "hosts.stats", "devices.messages-on-node-device")
def test_cuda_messages_cross_hosts_by_nccl_onto_the_readers_device(
    gpu_hosts: tuple[LocalHost, LocalHost], gpu: str = "cuda"
) -> None:
    """> [...] a message on an output whose node is on a CUDA device, read on another host only
    by nodes on CUDA devices there, goes from device to device over NCCL [...]. A CUDA camera on
    one host and a CUDA reader of its bare and numbered frames on another, under the real-time
    timer: every frame the reader read is, bit for bit, the frame of that number in one
    process, on the reader's device, never an older one; and the reader's host counts the
    messages it received by NCCL."""
    if gpu == "cuda" and not torch.distributed.is_nccl_available():
        pytest.skip("needs NCCL; this torch is built without it")
    first, second = gpu_hosts
    net = LanePair(gpu)
    processes = {
        "camera": mujou.OnHost(net.camera, first.address, secret=SECRET),
        "reader": mujou.OnHost(net.reader, second.address, secret=SECRET),
    }
    with hang_guard(HANG_GUARD), mujou.run(net, workers=2, processes=processes) as run:
        run.wait_for(net.reader.seen_count, lambda count: int(count) >= LANE_FRAMES, timeout=HANG_GUARD)
        tree = run.state_dict()["reader"]
        seen, bare = tree["seen"], tree["bare"]
        if gpu == "cuda":  # counted once each is published: at least the numbered ones it read
            wait_until(
                lambda: run.stats().hosts[second.address].nccl_messages >= len(seen),
                "the reader's host to count its NCCL messages",
            )
        hosts = run.stats().hosts
    assert tree["off_device"] == 0, tree["off_device"]
    numbers = [n for n, _ in seen]
    assert numbers == sorted(set(numbers)), numbers  # never an older message
    assert hosts[first.address].nccl_messages == hosts[""].nccl_messages == 0, hosts
    with hang_guard(HANG_GUARD), mujou.run(alone := LanePair(gpu), timer=vt(), workers=2) as run:
        run.wait_for(alone.reader.seen_count, lambda count: int(count) >= max(numbers))
        reference = run.state_dict()["reader"]
    numbered = {n: bits for n, bits in reference["seen"]}
    for n, bits in seen:
        assert_same(bits, numbered[n], f"frame {n}")
    frames = [tuple(bits) for bits in reference["bare"]]
    assert all(tuple(bits) in frames for bits in bare), (bare, frames)
    first.wait_no_group_process()
    second.wait_no_group_process()


@pytest.mark.rule("hosts.nccl-fallback", "devices.messages-on-node-device", "cuda.cpu-readers-get-cpu-copy")
def test_a_cuda_output_with_a_cpu_reader_on_the_other_host_crosses_through_host_memory(
    gpu_hosts: tuple[LocalHost, LocalHost], gpu: str = "cuda"
) -> None:
    """> [...] and for an output that a node on the CPU reads on the reader's host, the message
    goes through host memory [...], and its reader finds it on its own device. The CUDA camera
    on one host, read there by a CUDA and a CPU follower on another, under the real-time timer:
    each follower finds every frame on its own device, and no message went by NCCL."""
    first, second = gpu_hosts
    net = CudaPipeline(gpu)
    processes = {
        "camera": mujou.OnHost(net.camera, first.address, secret=SECRET),
        "followers": mujou.OnHost([net.gpu, net.cpu, net.back], second.address, secret=SECRET),
    }
    with hang_guard(HANG_GUARD), mujou.run(net, workers=2, processes=processes) as run:
        for follower in (net.gpu, net.cpu, net.back):
            run.wait_for(follower.out, timeout=HANG_GUARD)
        tree = run.state_dict()
        hosts = run.stats().hosts
    for name in ("gpu", "cpu", "back"):
        assert tree[name]["off_device"] == 0, (name, tree[name]["off_device"])
        assert tree[name]["stamps"], name
    assert [host.nccl_messages for host in hosts.values()] == [0, 0, 0], hosts
    first.wait_no_group_process()
    second.wait_no_group_process()


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
