"""Unit tests of the pure routing plan (``mujou._routing``), which need no GPU.

``torch.device("cuda", i)`` objects can be made without CUDA, so every net here, CUDA nodes
included, is planned on any machine. The plan decides which route each output takes
(cuda.send-stays-on-device, cuda.host-memory-route), which pool stream each CUDA node gets
(cuda.stream-current, cuda.stream-pool), which copy streams the readers of another device get
(cuda.copy-stream), and which nodes touch CUDA at all (cuda.cpu-node-no-cuda).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
import torch

import mujou
from mujou._ports import Output
from mujou._routing import STREAMS_PER_DEVICE, OutputSpec, Plan, Route, StreamId, plan_routes

CPU = torch.device("cpu")


def cuda(index: int = 0) -> torch.device:
    """A pinned CUDA device; making one needs no GPU."""
    return torch.device("cuda", index)


def plan_of(devices: Mapping[str, torch.device], ports: Mapping[str, tuple[str, Sequence[str]]]) -> Plan:
    """Plan ``devices`` (in registration order) with ``ports``: name -> (sender, readers)."""
    outputs = [OutputSpec(name, node, tuple(readers)) for name, (node, readers) in ports.items()]
    return plan_routes(devices, outputs)


def repro(devices: Mapping[str, torch.device], ports: Mapping[str, tuple[str, Sequence[str]]]) -> str:
    """A snippet that replans the net, for assertion messages."""
    outputs = [OutputSpec(name, node, tuple(readers)) for name, (node, readers) in ports.items()]
    return f"plan_routes({dict(devices)!r}, {outputs!r})"


# --------------------------------------------------------------------------------------------
# Nets by hand


def test_empty_net_plans_nothing() -> None:
    plan = plan_of({}, {})
    assert plan == Plan({}, {}, {}, frozenset())


def test_cpu_only_net_is_all_host_and_touches_no_cuda() -> None:
    devices = {"a": CPU, "b": CPU, "c": CPU}
    ports = {"a.y": ("a", ["b", "c"]), "b.y": ("b", ["c"]), "c.y": ("c", [])}
    plan = plan_of(devices, ports)
    assert plan.routes == {"a.y": Route.HOST, "b.y": Route.HOST, "c.y": Route.HOST}
    assert plan.streams == {}
    assert plan.copy_streams == {}
    assert plan.touches_cuda == frozenset()
    assert plan.stream_users(0) == {}


def test_cuda_sender_read_by_cuda_and_cpu_nodes_stays_on_device() -> None:
    devices = {"src": cuda(0), "gpu": cuda(0), "cpu": CPU}
    plan = plan_of(devices, {"src.y": ("src", ["gpu", "cpu"])})
    assert plan.routes == {"src.y": Route.DEVICE}
    assert plan.streams == {"src": StreamId(0, 0), "gpu": StreamId(0, 1)}
    # The CPU reader copies on a stream of its own on the sender's device, taken after the
    # nodes' streams; the CUDA reader on the same device needs none.
    assert plan.copy_streams == {("cpu", 0): StreamId(0, 2)}
    assert plan.touches_cuda == {"src", "gpu", "cpu"}


def test_cuda_sender_read_only_by_cpu_nodes_goes_through_host_memory() -> None:
    devices = {"src": cuda(0), "c1": CPU, "c2": CPU}
    plan = plan_of(devices, {"src.y": ("src", ["c1", "c2"])})
    assert plan.routes == {"src.y": Route.HOST}
    assert plan.streams == {"src": StreamId(0, 0)}
    assert plan.copy_streams == {}
    assert plan.touches_cuda == {"src"}  # the CPU readers touch no CUDA


def test_cuda_sender_read_only_by_the_host_goes_through_host_memory() -> None:
    plan = plan_of({"src": cuda(0)}, {"src.y": ("src", [])})
    assert plan.routes == {"src.y": Route.HOST}
    assert plan.touches_cuda == {"src"}


def test_cpu_sender_read_by_cuda_nodes_goes_through_host_memory() -> None:
    devices = {"src": CPU, "g0": cuda(0), "g1": cuda(1)}
    plan = plan_of(devices, {"src.y": ("src", ["g0", "g1"])})
    assert plan.routes == {"src.y": Route.HOST}
    assert plan.streams == {"g0": StreamId(0, 0), "g1": StreamId(1, 0)}
    assert plan.copy_streams == {}
    assert plan.touches_cuda == {"g0", "g1"}


def test_routes_are_per_output() -> None:
    # One sender, one output read by a CUDA node and one read only by a CPU node.
    devices = {"src": cuda(0), "gpu": cuda(0), "cpu": CPU}
    plan = plan_of(devices, {"src.a": ("src", ["gpu"]), "src.b": ("src", ["cpu"])})
    assert plan.routes == {"src.a": Route.DEVICE, "src.b": Route.HOST}
    assert plan.copy_streams == {}
    assert plan.touches_cuda == {"src", "gpu"}


def test_cpu_node_reading_device_and_host_routes_gets_a_copy_stream() -> None:
    devices = {"src": cuda(0), "gpu": cuda(0), "cpu": CPU}
    ports = {"src.a": ("src", ["gpu", "cpu"]), "src.b": ("src", ["cpu"])}
    plan = plan_of(devices, ports)
    assert plan.routes == {"src.a": Route.DEVICE, "src.b": Route.HOST}
    assert plan.copy_streams == {("cpu", 0): StreamId(0, 2)}
    assert "cpu" in plan.touches_cuda


def test_reader_on_another_gpu_copies_on_a_stream_of_the_senders_device() -> None:
    devices = {"src": cuda(0), "far": cuda(1), "near": cuda(0)}
    plan = plan_of(devices, {"src.y": ("src", ["far", "near"])})
    assert plan.routes == {"src.y": Route.DEVICE}
    assert plan.streams == {"src": StreamId(0, 0), "far": StreamId(1, 0), "near": StreamId(0, 1)}
    # cuda:1 reads cuda:0: its copy stream is on device 0, after device 0's node streams.
    assert plan.copy_streams == {("far", 0): StreamId(0, 2)}
    assert plan.touches_cuda == {"src", "far", "near"}


def test_only_reader_on_another_gpu_keeps_the_message_on_the_device() -> None:
    devices = {"src": cuda(0), "far": cuda(1)}
    plan = plan_of(devices, {"src.y": ("src", ["far"])})
    assert plan.routes == {"src.y": Route.DEVICE}
    assert plan.copy_streams == {("far", 0): StreamId(0, 1)}


def test_one_copy_stream_per_reader_and_source_device() -> None:
    devices = {"s0": cuda(0), "t0": cuda(0), "s1": cuda(1), "cpu": CPU}
    ports = {
        "s0.a": ("s0", ["cpu", "t0"]),
        "s0.b": ("s0", ["cpu", "t0", "cpu"]),  # the same reader twice (two of its inputs)
        "t0.y": ("t0", ["cpu", "s0"]),
        "s1.y": ("s1", ["cpu", "t0"]),
    }
    plan = plan_of(devices, ports)
    assert set(plan.routes.values()) == {Route.DEVICE}
    # cpu reads devices 0 and 1; t0 (on cuda:0) reads device 1; s0 reads its own device.
    # Copy streams go by reader registration: t0 before cpu on device 1.
    assert plan.copy_streams == {
        ("t0", 1): StreamId(1, 1),
        ("cpu", 0): StreamId(0, 2),
        ("cpu", 1): StreamId(1, 2),
    }


def test_forty_cuda_nodes_on_one_device_share_eight_streams() -> None:
    names = [f"n{i:02d}" for i in range(40)]
    devices = {name: cuda(0) for name in names}
    plan = plan_of(devices, {})
    assert [plan.streams[name].pool_index for name in names] == [i % 32 for i in range(40)]
    users = plan.stream_users(0)
    assert len(users) == STREAMS_PER_DEVICE == 32
    shared = {stream: who for stream, who in users.items() if len(who) > 1}
    assert len(shared) == 8, shared
    assert all(len(who) == 2 for who in shared.values()), shared
    assert shared == {StreamId(0, i): [names[i], names[i + 32]] for i in range(8)}
    assert plan.stream_users(1) == {}


def test_thirty_two_cuda_nodes_have_streams_of_their_own() -> None:
    devices = {f"n{i}": cuda(0) for i in range(32)}
    plan = plan_of(devices, {})
    assert len(set(plan.streams.values())) == 32
    assert all(len(who) == 1 for who in plan.stream_users(0).values())


def test_copy_streams_count_toward_the_pool() -> None:
    # 31 CUDA nodes and one CPU reader's copy stream: 32 streams, none shared.
    devices = {f"g{i:02d}": cuda(0) for i in range(31)} | {"cpu": CPU}
    ports = {"g00.y": ("g00", ["g01", "cpu"])}
    plan = plan_of(devices, ports)
    assert plan.copy_streams == {("cpu", 0): StreamId(0, 31)}
    assert all(len(who) == 1 for who in plan.stream_users(0).values())
    # One more CUDA node: the copy stream is the 33rd and wraps onto the first node's stream.
    devices = {f"g{i:02d}": cuda(0) for i in range(32)} | {"cpu": CPU}
    plan = plan_of(devices, ports)
    assert plan.copy_streams == {("cpu", 0): StreamId(0, 0)}
    assert plan.stream_users(0)[StreamId(0, 0)] == ["g00", "cpu<-copy"]
    assert len(plan.stream_users(0)) == 32


def test_pools_of_devices_are_independent() -> None:
    devices = {f"n{i}": cuda(i % 2) for i in range(70)}
    plan = plan_of(devices, {})
    for device in (0, 1):
        mine = [name for name, d in devices.items() if d.index == device]
        assert [plan.streams[name] for name in mine] == [StreamId(device, i % 32) for i in range(35)]
        assert len(plan.stream_users(device)) == 32


def test_registration_order_determines_the_stream_order() -> None:
    forward = {"a": cuda(0), "b": cuda(0), "c": cuda(0)}
    backward = {"c": cuda(0), "b": cuda(0), "a": cuda(0)}
    assert plan_of(forward, {}).streams == {"a": StreamId(0, 0), "b": StreamId(0, 1), "c": StreamId(0, 2)}
    assert plan_of(backward, {}).streams == {"c": StreamId(0, 0), "b": StreamId(0, 1), "a": StreamId(0, 2)}


def test_copy_streams_follow_reader_registration_not_output_order() -> None:
    devices = {"src": cuda(0), "gpu": cuda(0), "r1": CPU, "r2": CPU}
    one = plan_of(devices, {"src.a": ("src", ["gpu", "r2"]), "src.b": ("src", ["gpu", "r1"])})
    two = plan_of(devices, {"src.b": ("src", ["gpu", "r1"]), "src.a": ("src", ["gpu", "r2"])})
    expected = {("r1", 0): StreamId(0, 2), ("r2", 0): StreamId(0, 3)}
    assert one.copy_streams == expected
    assert two.copy_streams == expected
    # Within one reader, by source device.
    devices = {"s1": cuda(1), "s0": cuda(0), "g0": cuda(0), "g1": cuda(1), "cpu": CPU}
    plan = plan_of(devices, {"s1.y": ("s1", ["g1", "cpu"]), "s0.y": ("s0", ["g0", "cpu"])})
    assert list(plan.copy_streams) == [("cpu", 0), ("cpu", 1)]


def test_stream_users_names_nodes_then_copies() -> None:
    devices = {"src": cuda(0), "far": cuda(1), "cpu": CPU}
    plan = plan_of(devices, {"src.y": ("src", ["far", "cpu"])})
    assert plan.stream_users(0) == {
        StreamId(0, 0): ["src"],
        StreamId(0, 1): ["far<-copy"],
        StreamId(0, 2): ["cpu<-copy"],
    }
    assert plan.stream_users(1) == {StreamId(1, 0): ["far"]}
    assert plan.stream_users(2) == {}


def test_plan_is_deterministic() -> None:
    devices = {"src": cuda(0), "far": cuda(1), "cpu": CPU, "g": cuda(0)}
    ports = {"src.y": ("src", ["far", "cpu", "g"]), "g.y": ("g", ["cpu"])}
    assert plan_of(devices, ports) == plan_of(devices, ports)


def test_a_real_cpu_net_plans_host_routes_and_no_streams() -> None:
    """The engine plans a CPU net at start: every output HOST, no node with streams."""

    class Src(mujou.Node):
        y = mujou.Output()

        def on_update(self, dt: float) -> None:
            self.y.send(torch.ones(1))

    class Dst(mujou.Node):
        x = mujou.Input()

        def on_update(self, dt: float) -> None:
            self.x.read()

    class TwoNodes(mujou.Net):
        def __init__(self) -> None:
            super().__init__()
            self.src = Src()
            self.dst = Dst()
            self.connect(self.src.y, self.dst.x)

    net = TwoNodes()
    with mujou.run(net, timer=mujou.VirtualTimer(), workers=1) as run:
        run.sleep(0.05)
        output = net.src._mujou.ports["y"]
        assert isinstance(output, Output)
        assert output._route is Route.HOST
        assert net.src._mujou.streams is None
        assert net.dst._mujou.streams is None


# --------------------------------------------------------------------------------------------
# Random nets: the invariants of every plan

KINDS = [CPU, CPU, cuda(0), cuda(0), cuda(1), cuda(2)]


def random_net(
    rng: random.Random,
) -> tuple[dict[str, torch.device], dict[str, tuple[str, list[str]]]]:
    """A random net: devices by node (registration order) and outputs with their readers."""
    count = rng.choice([1, 2, 5, 12, 40, 75])
    # Mostly mixed nets, some all on cuda:0 (past the pool), some CPU only.
    weights = rng.choice([[2, 2, 2, 2, 1, 1], [0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 3, 3, 1, 0]])
    devices = {f"n{i}": device for i, device in enumerate(rng.choices(KINDS, weights=weights, k=count))}
    names = list(devices)
    ports: dict[str, tuple[str, list[str]]] = {}
    for name in names:
        for k in range(rng.choice([0, 1, 1, 2, 3])):
            readers = [rng.choice(names) for _ in range(rng.choice([0, 1, 1, 2, 4]))]
            ports[f"{name}.y{k}"] = (name, readers)
    order = list(ports.items())
    rng.shuffle(order)  # outputs in any order: the plan depends on node registration only
    return devices, dict(order)


@pytest.mark.parametrize("seed", range(200))
def test_random_net_invariants(seed: int) -> None:
    rng = random.Random(seed)
    devices, ports = random_net(rng)
    plan = plan_of(devices, ports)
    where = repro(devices, ports)
    cuda_nodes = {name for name, device in devices.items() if device.type == "cuda"}

    # Every output has a route: DEVICE iff a CUDA sender has a CUDA reader.
    assert set(plan.routes) == set(ports), where
    for name, (sender, readers) in ports.items():
        cuda_reader = any(devices[reader].type == "cuda" for reader in readers)
        expected = Route.DEVICE if devices[sender].type == "cuda" and cuda_reader else Route.HOST
        assert plan.routes[name] is expected, (name, where)

    # Every CUDA node, and only those, has a stream of the pool of its own device.
    assert set(plan.streams) == cuda_nodes, where
    for name, stream in plan.streams.items():
        assert stream.device == devices[name].index, (name, where)
    every = [*plan.streams.values(), *plan.copy_streams.values()]
    assert all(0 <= stream.pool_index < STREAMS_PER_DEVICE for stream in every), where

    # Copy streams: exactly one per (reader, source device) that reads a DEVICE output of
    # another device, on the source device.
    needed = {
        (reader, devices[sender].index)
        for name, (sender, readers) in ports.items()
        if plan.routes[name] is Route.DEVICE
        for reader in readers
        if devices[reader] != devices[sender]
    }
    assert set(plan.copy_streams) == needed, where
    for (reader, source), stream in plan.copy_streams.items():
        assert stream.device == source, where
        assert devices[reader] != cuda(source), where

    # Who touches CUDA: the CUDA nodes and the readers with a copy stream; a CPU node that
    # reads no DEVICE output touches nothing.
    assert plan.touches_cuda == cuda_nodes | {reader for reader, _ in plan.copy_streams}, where
    for name in set(devices) - plan.touches_cuda:
        assert devices[name] == CPU, where
        assert not any(
            name in readers and plan.routes[port] is Route.DEVICE for port, (_, readers) in ports.items()
        ), where

    # The pool: per device, nodes first in registration order, then copy streams ordered by
    # reader registration and source device; indices wrap at 32, so sharing is balanced.
    order = {name: i for i, name in enumerate(devices)}
    for device in {stream.device for stream in every}:
        node_streams = [plan.streams[name] for name in devices if name in plan.streams]
        node_streams = [stream for stream in node_streams if stream.device == device]
        copies = sorted(
            ((reader, source) for reader, source in plan.copy_streams if source == device),
            key=lambda need: (order[need[0]], need[1]),
        )
        handed = node_streams + [plan.copy_streams[need] for need in copies]
        assert [s.pool_index for s in handed] == [i % 32 for i in range(len(handed))], where
        uses = Counter(handed)
        assert len(uses) == min(len(handed), STREAMS_PER_DEVICE), where
        assert max(uses.values()) - min(uses.values()) <= 1, where
        users = plan.stream_users(device)
        assert {stream: len(who) for stream, who in users.items()} == dict(uses), where

    # Deterministic: the same net gives the same plan.
    assert plan_of(devices, ports) == plan, where


@pytest.mark.parametrize("seed", range(20))
def test_random_net_plan_ignores_output_order(seed: int) -> None:
    rng = random.Random(1000 + seed)
    devices, ports = random_net(rng)
    items = list(ports.items())
    rng.shuffle(items)
    assert plan_of(devices, dict(items)) == plan_of(devices, ports), repro(devices, ports)
