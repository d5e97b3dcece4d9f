"""Conformance tests for the spec page "Threads and devices" (spec/en/threads-and-devices.md).

No test asserts on wall-clock timing: the virtual timer, events and counters order things, and
real time is only ever a hang guard or a causal bound measured with ``run.time``.
"""

from __future__ import annotations

import contextvars
import decimal
import fractions
import inspect
import math
import os
import random
import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from _support import HANG_GUARD, Bag, DtRecorder, Plain, checkout_environ, vt, wait_until

import mujou
from mujou import Input, Net, Node, Output


def mujou_threads(prefix: str = "mujou-") -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(prefix))


# --------------------------------------------------------------------------------------------
# What the process may use: computed here, independently of Mujou.


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(cgroup_path: str) -> Iterator[str]:
    """The cgroup path and each of its ancestors up to the root ("" for the root)."""
    parts = [p for p in cgroup_path.strip("/").split("/") if p]
    for end in range(len(parts), -1, -1):
        yield "/".join(parts[:end])


def cgroup_quota_cpus() -> int | None:
    """The CPUs a cgroup CPU quota (v2 cpu.max or v1 cfs quota) allows, rounded up, or None."""
    text = _read(Path("/proc/self/cgroup"))
    if text is None:
        return None
    limits: list[float] = []
    for line in text.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                for sub in _ancestors(path):
                    value = _read(base / sub / "cpu.max")
                    if value is not None and not value.startswith("max"):
                        quota, period = value.split()
                        limits.append(int(quota) / int(period))
        elif "cpu" in controllers.split(","):
            for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                for sub in _ancestors(path):
                    quota_s = _read(Path("/sys/fs/cgroup") / name / sub / "cpu.cfs_quota_us")
                    period_s = _read(Path("/sys/fs/cgroup") / name / sub / "cpu.cfs_period_us")
                    if quota_s is not None and period_s is not None and int(quota_s) > 0:
                        limits.append(int(quota_s) / int(period_s))
    return max(1, math.ceil(min(limits))) if limits else None


def affinity() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    count = len(affinity())
    quota = cgroup_quota_cpus()
    return count if quota is None else min(count, quota)


def physical_cores() -> int | None:
    """Physical cores among the CPUs of the affinity (limited by the quota), None if unknown."""
    cores: set[tuple[str, str]] = set()
    for cpu in affinity():
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        package, core = _read(topology / "physical_package_id"), _read(topology / "core_id")
        if package is None or core is None:
            return None
        cores.add((package, core))
    quota = cgroup_quota_cpus()
    return len(cores) if quota is None else min(len(cores), quota)


def cuda_initialized() -> bool:
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]  # untyped in torch


def gil_enabled() -> bool:
    is_enabled: Callable[[], bool] | None = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else is_enabled()


def expected_default_workers(nodes_on_workers: int) -> int:
    cpus = usable_cpus()
    count = max(1, cpus // 2) if gil_enabled() else cpus
    return min(count, nodes_on_workers)


# --------------------------------------------------------------------------------------------
# threads.node-arguments / threads.node-properties / threads.argument-errors


@pytest.mark.rule("threads.node-arguments")
def test_node_arguments_are_keyword_only_with_defaults() -> None:
    """> `super().__init__` takes these keyword arguments, all optional. They are keyword-only.
    > (period: `0.01`; trigger: `None`; min_interval, delay: `0.0`; seed: `None`; device:
    > `"cpu"`; dedicated_thread: `False`)"""
    params = inspect.signature(Node.__init__).parameters
    assert list(params) == [
        "self",
        "period",
        "rate",
        "trigger",
        "min_interval",
        "delay",
        "seed",
        "device",
        "dedicated_thread",
    ]
    defaults = {
        "period": 0.01,
        "rate": None,
        "trigger": None,
        "min_interval": 0.0,
        "delay": 0.0,
        "seed": None,
        "device": "cpu",
        "dedicated_thread": False,
    }
    for name, default in defaults.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, (name, params[name].default)
    node = Plain()
    assert node.period == 0.01
    assert node.device == torch.device("cpu")
    assert node.dedicated_thread is False
    with pytest.raises(TypeError):
        Plain(0.1)  # type: ignore[call-arg]  # positional on purpose


@pytest.mark.rule("threads.node-properties")
def test_node_properties_read_back() -> None:
    """> The node reads them back as the read-only properties `period`, `generator`, `device` and
    > `dedicated_thread`: `device` is a `torch.device`, and assigning any of them raises
    > `AttributeError`."""
    node = Plain(period=0.5, seed=3, device="cpu", dedicated_thread=True)
    assert node.period == 0.5
    assert isinstance(node.period, float)
    assert node.device == torch.device("cpu")
    assert isinstance(node.device, torch.device)
    assert node.dedicated_thread is True
    assert isinstance(node.generator, torch.Generator)
    assert node.generator is node.generator
    assert node.seed == 3
    assert Plain(device=torch.device("cpu")).device == torch.device("cpu")
    quarter = Plain(period=fractions.Fraction(1, 4))  # type: ignore[arg-type]  # a numbers.Real
    assert quarter.period == 0.25
    assert isinstance(quarter.period, float)
    one = Plain(period=1)
    assert one.period == 1.0
    assert isinstance(one.period, float)


@pytest.mark.rule("threads.node-properties")
@pytest.mark.parametrize("prop", ["period", "generator", "device", "dedicated_thread", "seed"])
def test_node_properties_are_read_only(prop: str) -> None:
    """> The node reads them back as the read-only properties `period`, `generator`, `device` and
    > `dedicated_thread`: `device` is a `torch.device`, and assigning any of them raises
    > `AttributeError`."""
    node = Plain(period=0.5, seed=3)
    before = getattr(node, prop)
    values: dict[str, object] = {
        "period": 0.1,
        "generator": torch.Generator(),
        "device": torch.device("cpu"),
        "dedicated_thread": True,
        "seed": 4,
    }
    with pytest.raises(AttributeError):
        setattr(node, prop, values[prop])
    with pytest.raises(AttributeError):
        delattr(node, prop)
    assert getattr(node, prop) is before or getattr(node, prop) == before


ARGUMENT_ERRORS: list[tuple[str, object, type[Exception], str]] = [
    ("period", 0, ValueError, "finite"),
    ("period", 0.0, ValueError, "finite"),
    ("period", -0.5, ValueError, "finite"),
    ("period", math.nan, ValueError, "finite"),
    ("period", math.inf, ValueError, "finite"),
    ("period", -math.inf, ValueError, "finite"),
    ("period", "0.1", TypeError, "real number"),
    ("period", None, ValueError, "a trigger"),
    ("period", True, TypeError, "real number"),
    ("period", 1j, TypeError, "real number"),
    ("period", decimal.Decimal("0.1"), TypeError, "real number"),
    ("period", torch.tensor(0.1), TypeError, "real number"),
    ("seed", -1, ValueError, r"in \[0, 2\*\*64\)"),
    ("seed", 2**64, ValueError, r"in \[0, 2\*\*64\)"),
    ("seed", 1.0, TypeError, "None or an int"),
    ("seed", "1", TypeError, "None or an int"),
    ("seed", True, TypeError, "None or an int"),
    ("seed", False, TypeError, "None or an int"),
    ("dedicated_thread", 1, TypeError, "a bool"),
    ("dedicated_thread", 0, TypeError, "a bool"),
    ("dedicated_thread", None, TypeError, "a bool"),
    ("dedicated_thread", "yes", TypeError, "a bool"),
]


@pytest.mark.rule("threads.argument-errors")
@pytest.mark.parametrize(
    ("arg", "value", "error", "allowed"),
    ARGUMENT_ERRORS,
    ids=[f"{a}={v!r}" for a, v, _, _ in ARGUMENT_ERRORS],
)
def test_node_argument_errors(arg: str, value: object, error: type[Exception], allowed: str) -> None:
    """> period must be a finite real number > 0 (ValueError; TypeError if not a real number or a
    > bool); seed None or an int in [0, 2**64) (TypeError for a non-int or bool, ValueError out of
    > range); dedicated_thread a bool (TypeError); each message names the argument, the value and
    > what is allowed."""
    kwargs: dict[str, Any] = {arg: value}
    with pytest.raises(error, match=rf"^{arg} must be (\S+ )*?{allowed}(?!\w)") as info:
        Plain(**kwargs)
    assert type(info.value) is error
    assert repr(value) in str(info.value), str(info.value)


@pytest.mark.rule("threads.argument-errors")
def test_node_argument_limits_that_are_allowed() -> None:
    """> seed None or an int in [0, 2**64)."""
    assert Plain(seed=0).seed == 0
    assert Plain(seed=2**64 - 1).seed == 2**64 - 1
    assert Plain(period=1e-9).period == 1e-9
    assert Plain(period=1e9).period == 1e9


# --------------------------------------------------------------------------------------------
# threads.worker-pool / threads.workers-argument / threads.default-workers


class ThreadRecorder(Node):
    """Records the name and ident of the thread of each of its hooks."""

    def __init__(self, period: float = 0.25, *, dedicated_thread: bool = False) -> None:
        super().__init__(period=period, seed=0, dedicated_thread=dedicated_thread)
        self.threads: list[tuple[str, str, int]] = []  # (hook, thread name, ident)

    def _record(self, hook: str) -> None:
        thread = threading.current_thread()
        self.threads.append((hook, thread.name, threading.get_ident()))

    def on_start(self) -> None:
        self._record("on_start")

    def on_update(self, dt: float) -> None:
        self._record("on_update")

    def on_stop(self) -> None:
        self._record("on_stop")


@pytest.mark.rule("threads.worker-pool")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_nodes_share_a_pool_of_workers(timer: str) -> None:
    """> A run does not start a thread per node. It starts a pool of worker threads, which share the
    > nodes: the hooks of the nodes without a dedicated thread run on the workers, named
    > `mujou-worker-N`, as many as the run's workers."""
    nodes = {f"n{i}": ThreadRecorder(0.25 if timer == "virtual" else 0.002) for i in range(12)}
    pool = {"mujou-worker-0", "mujou-worker-1"}
    the_timer = vt() if timer == "virtual" else mujou.RealTimeTimer()
    with mujou.run(Bag(**nodes), timer=the_timer, workers=2) as run:
        assert set(mujou_threads()) == pool, mujou_threads()
        run.sleep(1.0 if timer == "virtual" else 0.05)
        assert set(mujou_threads()) == pool, mujou_threads()
        assert run.workers == 2
    assert mujou_threads() == [], "the run's threads outlived stop()"
    host = threading.get_ident()
    # The host's thread may run an update in run.sleep (threads.host-runs-updates).
    lent = {"on_update"}
    for node in nodes.values():
        names = {name for hook, name, _ in node.threads if hook not in lent}
        assert names <= pool, (node.name, names)
        assert host not in {ident for hook, _, ident in node.threads if hook not in lent}
        assert {name for _, name, ident in node.threads if ident != host} <= pool
    used = {name for node in nodes.values() for _, name, ident in node.threads if ident != host}
    assert used <= pool


@pytest.mark.rule("threads.workers-argument")
@pytest.mark.parametrize("workers", [1, 3, 6])
def test_workers_argument_starts_exactly_n(workers: int) -> None:
    """> `mujou.run(net, workers=n)` sets the number of workers: it starts exactly `n` worker
    > threads."""
    nodes = {f"n{i}": ThreadRecorder() for i in range(4)}  # fewer nodes than workers is fine
    expected = [f"mujou-worker-{i}" for i in range(workers)]
    with mujou.run(Bag(**nodes), timer=vt(), workers=workers) as run:
        assert run.workers == workers
        assert run.stats().workers == workers
        run.sleep(1.0)
        assert mujou_threads("mujou-worker-") == sorted(expected)
    assert mujou_threads() == []


@pytest.mark.rule("threads.default-workers")
def test_default_workers_from_cpus() -> None:
    """> The default is the number of CPUs the process may use (the logical cores, or fewer when the
    > CPU affinity or a cgroup CPU quota limits them), or half of it (at least 1) while the GIL is
    > enabled, and never more than the nodes on the workers."""
    many = 2 * (os.cpu_count() or 1) + 2
    nodes = {f"n{i}": Plain(period=1.0) for i in range(many)}
    with mujou.run(Bag(**nodes), timer=vt()) as run:
        assert run.workers == expected_default_workers(many), (
            f"affinity={sorted(affinity())}, quota={cgroup_quota_cpus()}, gil={gil_enabled()}"
        )
        assert len(mujou_threads("mujou-worker-")) == run.workers


@pytest.mark.rule("threads.default-workers")
@pytest.mark.parametrize(("on_workers", "dedicated"), [(1, 0), (1, 3), (2, 2), (0, 2)], ids=str)
def test_default_workers_never_exceed_nodes_on_workers(on_workers: int, dedicated: int) -> None:
    """> The default is the number of CPUs the process may use (the logical cores, or fewer when the
    > CPU affinity or a cgroup CPU quota limits them), or half of it (at least 1) while the GIL is
    > enabled, and never more than the nodes on the workers."""
    members: dict[str, Node | Net] = {f"w{i}": Plain(period=1.0) for i in range(on_workers)}
    members.update({f"d{i}": Plain(period=1.0, dedicated_thread=True) for i in range(dedicated)})
    with mujou.run(Bag(**members), timer=vt()) as run:
        run.sleep(2.0)
        assert run.workers == expected_default_workers(on_workers)
        assert run.workers <= on_workers
        assert len(mujou_threads("mujou-worker-")) == run.workers


_SUBPROCESS = """
import os, sys, warnings
os.sched_setaffinity(0, {CPUS})
import torch
torch.set_num_threads(1)
warnings.simplefilter("ignore")
import mujou

class N(mujou.Node):
    pass

class Many(mujou.Net):
    def __init__(self):
        super().__init__()
        for i in range(8):
            setattr(self, f"n{{i}}", N(period=1.0))

with mujou.run(Many(), timer=mujou.VirtualTimer()) as run:
    run.sleep(1.0)
    print(run.workers)
"""


def _workers_in_subprocess(cpus: set[int], env: dict[str, str] | None = None) -> int:
    code = _SUBPROCESS.format(CPUS=sorted(cpus))
    environ = checkout_environ()
    environ.update(env or {})
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip().splitlines()[-1])


@pytest.mark.rule("threads.default-workers")
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity")
def test_default_workers_follow_the_affinity() -> None:
    """> The default is the number of CPUs the process may use (the logical cores, or fewer when the
    > CPU affinity or a cgroup CPU quota limits them), or half of it (at least 1) while the GIL is
    > enabled, and never more than the nodes on the workers."""
    assert _workers_in_subprocess({min(affinity())}) == 1


@pytest.mark.rule("threads.default-workers")
@pytest.mark.skipif(gil_enabled(), reason="needs a free-threaded build with the GIL disabled")
def test_default_workers_halved_when_the_gil_is_forced_on() -> None:
    """> The default is the number of CPUs the process may use (the logical cores, or fewer when the
    > CPU affinity or a cgroup CPU quota limits them), or half of it (at least 1) while the GIL is
    > enabled, and never more than the nodes on the workers."""
    cpus = affinity()
    assert _workers_in_subprocess(cpus, {"PYTHON_GIL": "0"}) == min(8, usable_cpus())
    assert _workers_in_subprocess(cpus, {"PYTHON_GIL": "1"}) == min(8, max(1, usable_cpus() // 2))


# --------------------------------------------------------------------------------------------
# threads.earliest-due-first


class OrderLog(Node):
    def __init__(self, log: list[tuple[float, str]], period: float) -> None:
        super().__init__(period=period, seed=0)
        self.log = log
        self.elapsed = 0.0

    def on_update(self, dt: float) -> None:
        self.elapsed += dt
        self.log.append((self.elapsed, self.name))


@pytest.mark.rule("threads.earliest-due-first")
def test_earliest_due_first_then_registration_order() -> None:
    """> A worker runs one hook of one node, then takes the next work, the updates due earliest
    > first; equal due times go in registration order."""
    log: list[tuple[float, str]] = []
    periods = {"a": 0.375, "b": 0.25, "c": 0.5, "d": 0.25, "e": 0.125, "f": 0.75}
    inner = Bag(c=OrderLog(log, periods["c"]), d=OrderLog(log, periods["d"]))
    net = Bag(
        a=OrderLog(log, periods["a"]),
        b=OrderLog(log, periods["b"]),
        inner=inner,
        e=OrderLog(log, periods["e"]),
        f=OrderLog(log, periods["f"]),
    )
    names = [n.name for n in net.nodes()]
    assert names == ["a", "b", "inner.c", "inner.d", "e", "f"]
    horizon = 3.0
    with mujou.run(net, timer=vt(), workers=1) as run:
        run.sleep(horizon)
    expected = sorted(
        (k * periods[name.split(".")[-1]], index, name)
        for index, name in enumerate(names)
        for k in range(1, int(horizon / periods[name.split(".")[-1]]) + 1)
    )
    assert [name for _, name in log] == [name for _, _, name in expected]
    assert [t for t, _ in log] == [t for t, _, _ in expected]


class BlockOnce(Node):
    """Blocks in its first update until released."""

    def __init__(self, period: float) -> None:
        super().__init__(period=period, seed=0)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 1:
            self.entered.set()
            assert self.release.wait(HANG_GUARD)


class StartLog(Node):
    def __init__(self, log: list[str], period: float) -> None:
        super().__init__(period=period, seed=0)
        self.log = log

    def on_update(self, dt: float) -> None:
        self.log.append(self.name)


@pytest.mark.rule("threads.earliest-due-first")
def test_earliest_due_first_after_a_backlog() -> None:
    """> A worker runs one hook of one node, then takes the next work, the updates due earliest
    > first; equal due times go in registration order."""
    log: list[str] = []
    blocker = BlockOnce(period=0.01)
    # All due during the block: slow (due 0.05) before fast (0.06) before later (0.07).
    net = Bag(
        blocker=blocker,
        later=StartLog(log, 0.07),
        fast=StartLog(log, 0.06),
        slow=StartLog(log, 0.05),
    )
    with mujou.run(net, workers=1) as run:
        assert blocker.entered.wait(HANG_GUARD)
        wait_until(lambda: run.time > 0.2, "run.time > 0.2")
        assert log == []
        blocker.release.set()
        wait_until(lambda: len(log) >= 3, "three updates after the block")
    assert log[:3] == ["slow", "fast", "later"]


@pytest.mark.rule("threads.earliest-due-first")
def test_earliest_due_first_between_sleeps_of_one_worker() -> None:
    """> A worker runs one hook of one node, then takes the next work, the updates due earliest
    > first; equal due times go in registration order.

    Under the real-time timer, one worker sleeping for a node that falls due again keeps it
    (the scheduling page) only when nothing else falls due first: here b's updates come
    between a's."""
    log: list[str] = []
    net = Bag(a=StartLog(log, 0.02), b=StartLog(log, 0.03))
    # A timer at half speed: 40 and 60 ms apart in real time, so no update is skipped on a
    # busy machine (if one is, the order below does not apply, and the test says so).
    with mujou.run(net, workers=1, timer=mujou.RealTimeTimer(scale=0.5)) as run:
        wait_until(lambda: len(log) >= 10, "ten updates")
        skipped = sum(node.skipped for node in run.stats().nodes.values())
    if skipped:
        pytest.skip(f"the machine was too slow to keep the schedule ({skipped} updates skipped)")
    # Due at 0.02 0.03 0.04 0.06 0.06 0.08 0.09 0.10 0.12 0.12: a before b at equal times.
    assert log[:10] == ["a", "b", "a", "a", "b", "a", "b", "a", "a", "b"]


# --------------------------------------------------------------------------------------------
# threads.hooks-exclusive


class Exclusive(Node):
    """Checks in every hook that no other hook of it runs, and that it sees the last write."""

    def __init__(self, period: float, *, block: float = 0.0, dedicated_thread: bool = False):
        super().__init__(period=period, seed=0, dedicated_thread=dedicated_thread)
        self.inside = threading.Lock()
        self.block = block
        self.count = 0
        self.total = torch.zeros(())
        self.problems: list[str] = []
        self.updates = 0

    def _hook(self, hook: str) -> None:
        if not self.inside.acquire(blocking=False):
            self.problems.append(f"{hook} started while another hook of the node ran")
            self.inside.acquire()
        try:
            if float(self.total) != self.count:
                self.problems.append(f"{hook} saw total={float(self.total)} count={self.count}")
            count = self.count
            if self.block:
                threading.Event().wait(self.block)
            self.count = count + 1
            self.total += 1
            if hook == "on_update":
                self.updates += 1
        finally:
            self.inside.release()

    def on_start(self) -> None:
        self._hook("on_start")

    def on_update(self, dt: float) -> None:
        self._hook("on_update")

    def on_stop(self) -> None:
        self._hook("on_stop")


@pytest.mark.rule("threads.hooks-exclusive")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_hooks_of_a_node_never_overlap(timer: str) -> None:
    """> The hooks of a node never run at the same time, and each sees what the previous one wrote.
    > Which worker runs a node may change from one hook to the next."""
    virtual = timer == "virtual"
    nodes = {f"n{i}": Exclusive(0.01 if virtual else 0.001, block=0.0002 * (i % 3)) for i in range(6)}
    the_timer = vt() if virtual else mujou.RealTimeTimer()
    with mujou.run(Bag(**nodes), timer=the_timer, workers=4) as run:
        if virtual:
            run.sleep(1.0)
        else:
            wait_until(lambda: all(n.updates >= 20 for n in nodes.values()), "20 updates each")
        stats = run.stats()
    for name, node in nodes.items():
        assert node.problems == [], (name, node.problems)
        assert node.updates > 0, name
        assert node.count == node.updates + 2, (name, node.count, node.updates)
        assert float(node.total) == node.count
        if virtual:
            assert stats.nodes[name].updates == node.updates == 100


# --------------------------------------------------------------------------------------------
# threads.blocking-holds-worker


@pytest.mark.rule("threads.blocking-holds-worker")
def test_blocking_hook_holds_its_worker() -> None:
    """> A hook that blocks holds its worker meanwhile, and the other nodes' updates wait: their `dt`
    > grows."""
    blocker = BlockOnce(period=0.02)
    other = DtRecorder(period=0.002)
    with mujou.run(Bag(blocker=blocker, other=other), workers=1) as run:
        assert blocker.entered.wait(HANG_GUARD)
        blocked_at = run.time
        count = len(other.dts)
        # Let time pass: the other node is due again and again, but no worker is free.
        wait_until(lambda: run.time > blocked_at + 0.05, "0.05 timer seconds")
        assert len(other.dts) == count
        released_at = run.time
        blocker.release.set()
        wait_until(lambda: len(other.dts) > count, "the other node's next update")
    # Its previous update ended before the block, its next starts after the release.
    assert other.dts[count] >= released_at - blocked_at, (other.dts[count], blocked_at, released_at)


@pytest.mark.rule("threads.blocking-holds-worker", "threads.earliest-due-first")
@pytest.mark.parametrize("other_first", [False, True], ids=["blocker-first", "other-first"])
def test_a_blocking_hook_holds_only_its_worker(other_first: bool) -> None:
    """> A hook that blocks holds its worker meanwhile, and the other nodes' updates wait: their `dt`
    > grows.
    > Worker nodes that are due when a worker takes work are taken together ... and a worker
    > held up in one of those hooks leaves the rest to the other workers, and those it ran once
    > they fall due again.

    Its worker only: with two workers, the other one takes the due updates meanwhile (while
    the GIL is enabled, once the hook has run for a millisecond or more). With the other node
    first in registration order, it runs first in the batch they share, then the blocker
    blocks its worker, and the other worker takes the other node each time it falls due (it
    used to stay with the blocked worker's batch until the hook returned)."""
    blocker = BlockOnce(period=0.02)
    other = DtRecorder(period=0.002)
    nodes = {"other": other, "blocker": blocker} if other_first else {"blocker": blocker, "other": other}
    with mujou.run(Bag(**nodes), workers=2):
        assert blocker.entered.wait(HANG_GUARD)
        count = len(other.dts)
        wait_until(lambda: len(other.dts) >= count + 5, "five updates of the other node")
        assert not blocker.release.is_set()  # the blocker still blocks
        blocker.release.set()


@pytest.mark.rule("threads.blocking-holds-worker", "threads.earliest-due-first")
def test_nodes_due_with_a_blocking_hook_go_on_on_the_other_worker() -> None:
    """> A hook that blocks holds its worker meanwhile ...

    Nodes falling due together are taken together (the scheduling page): the blocker, first
    in registration order, blocks with the others taken beside it, and the other worker runs
    them meanwhile, again and again."""
    blocker = BlockOnce(period=0.02)
    others = {f"n{i}": DtRecorder(period=0.02) for i in range(3)}
    with mujou.run(Bag(blocker=blocker, **others), workers=2):
        assert blocker.entered.wait(HANG_GUARD)
        counts = {name: len(node.dts) for name, node in others.items()}
        wait_until(
            lambda: all(len(node.dts) >= counts[name] + 3 for name, node in others.items()),
            "three more updates of each other node",
        )
        assert not blocker.release.is_set()  # the blocker still blocks
        blocker.release.set()


# --------------------------------------------------------------------------------------------
# threads.dedicated / threads.dedicated-blocking


@pytest.mark.rule("threads.dedicated")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_dedicated_node_runs_on_its_own_thread(timer: str) -> None:
    """> A node with `dedicated_thread=True` runs all its hooks, `on_start` included, on one thread
    > of its own, named `mujou-node-NAME` after the node's name, never on a worker."""
    cam, mic = ThreadRecorder(0.01, dedicated_thread=True), ThreadRecorder(0.01, dedicated_thread=True)
    worker_node = ThreadRecorder(0.01)
    net = Bag(sensors=Bag(cam=cam, mic=mic), worker_node=worker_node)
    the_timer = vt() if timer == "virtual" else mujou.RealTimeTimer()
    with mujou.run(net, timer=the_timer, workers=1) as run:
        threads = mujou_threads()
        assert "mujou-node-sensors.cam" in threads, threads
        assert "mujou-node-sensors.mic" in threads, threads
        run.sleep(0.1)
    for node, name in ((cam, "mujou-node-sensors.cam"), (mic, "mujou-node-sensors.mic")):
        hooks = [hook for hook, _, _ in node.threads]
        assert hooks[0] == "on_start" and hooks[-1] == "on_stop", hooks
        assert {thread for _, thread, _ in node.threads} == {name}
        assert len({ident for _, _, ident in node.threads}) == 1
    # The host's thread may run an update in run.sleep (threads.host-runs-updates).
    host = threading.current_thread().name
    assert {t for h, t, _ in worker_node.threads if h != "on_update"} == {"mujou-worker-0"}
    assert {t for h, t, _ in worker_node.threads if h == "on_update"} <= {"mujou-worker-0", host}
    assert {i for _, _, i in cam.threads}.isdisjoint({i for _, _, i in mic.threads})
    assert {i for _, _, i in cam.threads}.isdisjoint({i for _, _, i in worker_node.threads})
    assert threading.get_ident() not in {i for _, _, i in cam.threads}
    assert mujou_threads() == []


class BlockOnceDedicated(BlockOnce):
    def __init__(self, period: float) -> None:
        Node.__init__(self, period=period, seed=0, dedicated_thread=True)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.n = 0


@pytest.mark.rule("threads.dedicated-blocking")
def test_blocking_dedicated_node_holds_no_worker() -> None:
    """> A blocking hook of a dedicated node holds no worker: the other nodes keep updating."""
    blocker = BlockOnceDedicated(period=0.01)
    other = DtRecorder(period=0.002)
    with mujou.run(Bag(blocker=blocker, other=other), workers=1) as run:
        assert blocker.entered.wait(HANG_GUARD)
        count = len(other.dts)
        wait_until(lambda: len(other.dts) >= count + 5, "five updates of the other node")
        assert not blocker.release.is_set()  # the blocker still blocks
        blocker.release.set()
        run.sleep(0.0)


# --------------------------------------------------------------------------------------------
# threads.per-thread-settings / threads.mujou-sets-only-cuda


_LOCAL = threading.local()


class LeavesSettings(Node):
    """Sets per-thread state in each update and leaves it (autocast, a threading.local)."""

    def __init__(self, *, dedicated_thread: bool = False) -> None:
        super().__init__(period=0.25, seed=0, dedicated_thread=dedicated_thread)
        self.n = 0
        self.seen: list[tuple[object, bool]] = []

    def on_update(self, dt: float) -> None:
        self.seen.append((getattr(_LOCAL, "value", None), torch.is_autocast_enabled("cpu")))
        self.n += 1
        _LOCAL.value = (self.name, self.n)
        torch.set_autocast_enabled("cpu", True)


class SeesSettings(Node):
    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.seen: list[tuple[object, bool, bool]] = []

    def on_update(self, dt: float) -> None:
        self.seen.append(
            (getattr(_LOCAL, "value", None), torch.is_autocast_enabled("cpu"), torch.is_grad_enabled())
        )


@pytest.mark.rule("threads.per-thread-settings", "threads.mujou-sets-only-cuda")
def test_per_thread_settings_are_not_reset_between_nodes() -> None:
    """> Mujou does not set or restore per-thread settings around the hooks of a CPU node
    > (`threading.local`, grad mode, autocast are whatever the thread has): a setting a hook
    > leaves behind is seen by the next hook on that thread. Mujou itself sets only the current
    > CUDA device and stream, before each hook of a CUDA node, and nothing before the hooks of a
    > CPU node."""
    leaver, seer = LeavesSettings(), SeesSettings()
    with mujou.run(Bag(leaver=leaver, seer=seer), timer=vt(), workers=1) as run, torch.no_grad():
        run.sleep(1.0)  # in no_grad the host runs no update: the worker runs them all
    # One worker: seer runs right after leaver at each due time, on the same thread.
    assert seer.seen == [(("leaver", k), True, True) for k in range(1, 5)]
    assert leaver.seen == [(None, False)] + [(("leaver", k), True) for k in range(1, 4)]


class LeavesGrad(Node):
    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)

    def on_update(self, dt: float) -> None:
        torch.set_grad_enabled(False)


@pytest.mark.rule("threads.per-thread-settings")
def test_grad_mode_left_behind_is_seen_by_the_next_node() -> None:
    """> Mujou does not set or restore per-thread settings around the hooks of a CPU node
    > (`threading.local`, grad mode, autocast are whatever the thread has): a setting a hook
    > leaves behind is seen by the next hook on that thread."""
    seer = SeesSettings()
    with (
        pytest.warns(mujou.LeakedSettingWarning, match=r"^node 'leaver' "),
        mujou.run(Bag(leaver=LeavesGrad(), seer=seer), timer=vt(), workers=1) as run,
    ):
        run.sleep(1.0)
    assert [grad for _, _, grad in seer.seen] == [False] * 4


@pytest.mark.rule("threads.per-thread-settings")
def test_dedicated_thread_keeps_per_thread_settings() -> None:
    """> Mujou does not set or restore per-thread settings around the hooks of a CPU node
    > (`threading.local`, grad mode, autocast are whatever the thread has): a setting a hook
    > leaves behind is seen by the next hook on that thread."""
    node = LeavesSettings(dedicated_thread=True)
    with mujou.run(Bag(own=node), timer=vt(), workers=1) as run:
        run.sleep(1.0)
    assert node.seen == [(None, False)] + [(("own", k), True) for k in range(1, 4)]


# What of torch.cuda sets or queries CUDA state (and initializes it): a CPU net calls none of it.
_CUDA_CALLS = (
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "Stream",
    "Event",
    "current_device",
    "set_device",
    "device",
    "synchronize",
    "init",
    "_lazy_init",
)


@pytest.mark.rule("threads.mujou-sets-only-cuda", "cuda.cpu-node-no-cuda")
def test_cpu_nodes_do_not_touch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """> Mujou itself sets only the current CUDA device and stream, before each hook of a CUDA node,
    > and nothing before the hooks of a CPU node. A node on the CPU that reads no CUDA node does
    > not touch CUDA.

    The functions of torch.cuda that set, query or initialize CUDA are replaced for the run
    (on a CPU build of torch too) by ones that record the call and raise."""
    initialized = cuda_initialized()
    src, sink = Source(), Sink()
    net = Bag(src=src, sink=sink)
    net.connect(src.y, sink.x)
    calls: list[str] = []

    def refuse(name: str) -> Callable[..., Any]:
        def called(*args: object, **kwargs: object) -> Any:
            calls.append(name)
            raise RuntimeError(f"a CPU net called torch.cuda.{name}")

        return called

    for name in _CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, refuse(name))
    with mujou.run(net, timer=vt(), workers=2) as run:
        run.sleep(1.0)
        run.state_dict()
        assert run.read(sink.x) is not None
    monkeypatch.undo()
    assert calls == [], f"the run of a CPU net called torch.cuda: {calls}"
    assert sink.values == [1.0, 2.0, 3.0]
    if not initialized:
        assert not cuda_initialized()


class CudaProbe(Node):
    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0, device="cuda")
        self.seen: list[tuple[int, int, int]] = []

    def _probe(self) -> None:
        stream = torch.cuda.current_stream()
        default = torch.cuda.default_stream()
        self.seen.append((torch.cuda.current_device(), stream.stream_id, default.stream_id))

    def on_start(self) -> None:
        self._probe()

    def on_update(self, dt: float) -> None:
        self._probe()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.rule("threads.mujou-sets-only-cuda")
def test_cuda_node_gets_its_device_and_stream() -> None:
    """> Mujou itself sets only the current CUDA device and stream, before each hook of a CUDA node,
    > and nothing before the hooks of a CPU node."""
    node = CudaProbe()
    with mujou.run(Bag(gpu=node), timer=vt(), workers=1) as run:
        run.sleep(1.0)
    assert node.device.index is not None
    assert len(node.seen) == 5
    assert {device for device, _, _ in node.seen} == {node.device.index}
    assert len({stream for _, stream, _ in node.seen}) == 1
    assert all(stream != default for _, stream, default in node.seen)


# --------------------------------------------------------------------------------------------
# threads.context

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("mujou_conformance_var")


class ContextUser(Node):
    """Sets a context variable in on_start and checks it in its later hooks."""

    def __init__(self, *, dedicated_thread: bool = False) -> None:
        super().__init__(period=0.25, seed=0, dedicated_thread=dedicated_thread)
        self.at_start: list[tuple[str, int]] = []
        self.seen: list[str] = []

    def on_start(self) -> None:
        context = contextvars.copy_context()
        self.at_start.append((_VAR.get("<unset>"), len(context)))
        _VAR.set(f"set by {self.name}")

    def on_update(self, dt: float) -> None:
        self.seen.append(_VAR.get("<unset>"))
        _VAR.set(f"set by {self.name}")

    def on_stop(self) -> None:
        self.seen.append(_VAR.get("<unset>"))


@pytest.mark.rule("threads.context")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_each_node_has_its_own_context(timer: str) -> None:
    """> `contextvars` do carry over: each node runs every hook in a `contextvars.Context` of its
    > own, which starts empty (it does not inherit the host's), carries over from hook to hook,
    > and is not seen by other nodes or the host."""
    token = _VAR.set("host")
    try:
        nodes = {
            "a": ContextUser(),
            "b": ContextUser(),
            "c": ContextUser(dedicated_thread=True),
        }
        the_timer = vt() if timer == "virtual" else mujou.RealTimeTimer()
        with mujou.run(Bag(**nodes), timer=the_timer, workers=1) as run:
            run.sleep(1.0 if timer == "virtual" else 0.05)
            assert _VAR.get() == "host"
        assert _VAR.get() == "host"
    finally:
        _VAR.reset(token)
    for name, node in nodes.items():
        assert node.at_start == [("<unset>", 0)], (name, node.at_start)
        assert node.seen, name
        assert set(node.seen) == {f"set by {name}"}, (name, node.seen)


# --------------------------------------------------------------------------------------------
# threads.generator / threads.generator-in-state


class Drawer(Node):
    """Draws from its generator in __init__ and in each update."""

    def __init__(self, seed: int | None, period: float = 0.25) -> None:
        super().__init__(period=period, seed=seed)
        self.in_init = torch.randn(3, generator=self.generator)
        self.draws: list[list[float]] = []

    def on_update(self, dt: float) -> None:
        self.draws.append(torch.rand(2, generator=self.generator, device=self.device).tolist())


@pytest.mark.rule("threads.generator")
def test_generator_from_seed() -> None:
    """> `self.generator` is made from `seed` on the node's device: a `torch.Generator` seeded from
    > `seed`, or from a nondeterministic seed when `seed` is `None`. It can be used right after
    > `super().__init__()`, in `__init__` too. The same seed gives the same sequence."""
    global_state = torch.random.get_rng_state()
    a, b, c = Drawer(seed=42), Drawer(seed=42), Drawer(seed=43)
    assert isinstance(a.generator, torch.Generator)
    assert a.generator.device == a.device == torch.device("cpu")
    assert a.generator is not b.generator
    assert torch.equal(a.in_init, b.in_init)
    assert not torch.equal(a.in_init, c.in_init)
    x, y = Drawer(seed=None), Drawer(seed=None)
    assert x.seed != y.seed
    assert not torch.equal(x.in_init, y.in_init)
    # A node's seed reproduces the node, including a node made with seed=None.
    again = Drawer(seed=x.seed)
    assert torch.equal(again.in_init, x.in_init)
    # Making nodes did not touch the global generator.
    assert torch.equal(torch.random.get_rng_state(), global_state)


@pytest.mark.rule("threads.generator")
def test_same_seed_same_sequence_in_a_run() -> None:
    """> `self.generator` is made from `seed` on the node's device: a `torch.Generator` seeded from
    > `seed`, or from a nondeterministic seed when `seed` is `None`. It can be used right after
    > `super().__init__()`, in `__init__` too. The same seed gives the same sequence."""
    runs: list[list[list[float]]] = []
    for workers in (1, 2):
        a, b = Drawer(seed=7), Drawer(seed=7)
        with mujou.run(Bag(a=a, b=b), timer=vt(), workers=workers) as run:
            run.sleep(1.0)
        assert a.draws == b.draws
        runs.append(a.draws)
    assert runs[0] == runs[1]
    assert len(runs[0]) == 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.rule("threads.generator")
def test_generator_on_cuda_device() -> None:
    """> `self.generator` is made from `seed` on the node's device: a `torch.Generator` seeded from
    > `seed`, or from a nondeterministic seed when `seed` is `None`. It can be used right after
    > `super().__init__()`, in `__init__` too. The same seed gives the same sequence."""
    node = Plain(seed=1, device="cuda")
    assert node.generator.device == node.device
    assert node.generator.device.type == "cuda"
    sample = torch.randn(2, generator=node.generator, device=node.device)
    assert sample.device == node.device


@pytest.mark.rule("threads.generator-in-state")
def test_resumed_run_continues_the_sequence() -> None:
    """> The state of `self.generator` is in the node's state, so a resumed run goes on with the same
    > random sequence."""
    whole = Drawer(seed=11)
    with mujou.run(Bag(node=whole), timer=vt()) as run:
        run.sleep(2.0)
    first = Drawer(seed=11)
    with mujou.run(Bag(node=first), timer=vt()) as run:
        run.sleep(1.0)
        tree = run.state_dict()
    assert "generator" in tree["node"]
    second = Drawer(seed=999)  # another seed: the state decides
    with mujou.run(Bag(node=second), timer=vt(), state=tree) as run:
        run.sleep(1.0)
    assert len(whole.draws) == 8
    # The record of draws is a plain list of the node's state: resumed, it goes on from the first.
    assert len(first.draws) == 4 and second.draws == whole.draws


@pytest.mark.rule("threads.generator-in-state")
def test_node_state_dict_holds_the_generator() -> None:
    """> The state of `self.generator` is in the node's state, so a resumed run goes on with the same
    > random sequence."""
    node = Drawer(seed=5)
    state = node.state_dict()
    expected = torch.rand(4, generator=node.generator)
    node.load_state_dict(state)
    assert torch.equal(torch.rand(4, generator=node.generator), expected)


# --------------------------------------------------------------------------------------------
# devices.valid / devices.messages-on-node-device


@pytest.mark.rule("devices.valid")
@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")], ids=str)
def test_cpu_device(device: str | torch.device) -> None:
    """> `device` is the CPU (`"cpu"`) or a CUDA device, given as a `str` or a `torch.device`; any
    > other, such as `"mps"`, `"meta"`, `"cuda:x"` or a string that names no device, raises
    > `ValueError` (a value that is neither a `str` nor a `torch.device` raises `TypeError`), and
    > so does CUDA when it is not available."""
    node = Plain(device=device)
    assert node.device == torch.device("cpu")
    assert isinstance(node.device, torch.device)


INVALID_DEVICES: list[tuple[object, type[Exception]]] = [
    ("mps", ValueError),
    ("meta", ValueError),
    ("cuda:x", ValueError),
    ("gpu", ValueError),
    ("", ValueError),
    (torch.device("meta"), ValueError),
    (torch.device("mps"), ValueError),
    (0, TypeError),
    (None, TypeError),
    (1.5, TypeError),
    (b"cpu", TypeError),
]


@pytest.mark.rule("devices.valid")
@pytest.mark.parametrize(("device", "error"), INVALID_DEVICES, ids=[repr(d) for d, _ in INVALID_DEVICES])
def test_invalid_devices(device: object, error: type[Exception]) -> None:
    """> `device` is the CPU (`"cpu"`) or a CUDA device, given as a `str` or a `torch.device`; any
    > other, such as `"mps"`, `"meta"`, `"cuda:x"` or a string that names no device, raises
    > `ValueError` (a value that is neither a `str` nor a `torch.device` raises `TypeError`), and
    > so does CUDA when it is not available."""
    with pytest.raises(error, match=r"^device must be ") as info:
        Plain(device=device)  # type: ignore[arg-type]  # the wrong value on purpose
    assert type(info.value) is error
    assert repr(device) in str(info.value), str(info.value)
    assert "'cpu', 'cuda' or 'cuda:N'" in str(info.value), str(info.value)


@pytest.mark.rule("devices.valid")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda:1")])
def test_cuda_unavailable_raises(device: str | torch.device) -> None:
    """> `device` is the CPU (`"cpu"`) or a CUDA device, given as a `str` or a `torch.device`; any
    > other, such as `"mps"`, `"meta"`, `"cuda:x"` or a string that names no device, raises
    > `ValueError` (a value that is neither a `str` nor a `torch.device` raises `TypeError`), and
    > so does CUDA when it is not available."""
    with pytest.raises(ValueError, match=r"^device .*CUDA is not available") as info:
        Plain(device=device)
    assert repr(device) in str(info.value), str(info.value)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.rule("devices.valid")
def test_cuda_devices() -> None:
    """> `device` is the CPU (`"cpu"`) or a CUDA device, given as a `str` or a `torch.device`; any
    > other, such as `"mps"`, `"meta"`, `"cuda:x"` or a string that names no device, raises
    > `ValueError` (a value that is neither a `str` nor a `torch.device` raises `TypeError`), and
    > so does CUDA when it is not available."""
    count = torch.cuda.device_count()
    assert Plain(device="cuda:0").device == torch.device("cuda", 0)
    assert Plain(device=torch.device("cuda", count - 1)).device == torch.device("cuda", count - 1)
    assert Plain(device="cuda").device.index is not None
    with pytest.raises(ValueError, match=r"^device "):
        Plain(device=f"cuda:{count}")


class Source(Node):
    y = Output()

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(period=0.25, seed=0, device=device)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.y.send(torch.full((2,), float(self.n), device=self.device))


class Sink(Node):
    x = Input()

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(period=0.25, seed=0, device=device)
        self.devices: list[torch.device] = []
        self.values: list[float] = []

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.devices.append(x.device)
            self.values.append(float(x[0]))


@pytest.mark.rule("devices.messages-on-node-device")
def test_messages_arrive_on_the_cpu_node() -> None:
    """> Received messages arrive on the node's device."""
    src, sink = Source(), Sink()
    net = Bag(src=src, sink=sink)
    net.connect(src.y, sink.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
    assert sink.values == [1.0, 2.0, 3.0]
    assert set(sink.devices) == {torch.device("cpu")}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.rule("devices.messages-on-node-device")
def test_messages_arrive_on_the_node_device_with_cuda() -> None:
    """> Received messages arrive on the node's device."""
    cpu_src, gpu_src = Source(), Source("cuda")
    readers = {
        "cpu_from_gpu": (Sink(), gpu_src),
        "gpu_from_cpu": (Sink("cuda"), cpu_src),
        "gpu_from_gpu": (Sink("cuda"), gpu_src),
    }
    net = Bag(cpu_src=cpu_src, gpu_src=gpu_src, **{k: v for k, (v, _) in readers.items()})
    for sink, src in readers.values():
        net.connect(src.y, sink.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(1.0)
    for name, (sink, _) in readers.items():
        assert sink.values == [1.0, 2.0, 3.0], name
        assert set(sink.devices) == {sink.device}, name


# --------------------------------------------------------------------------------------------
# settings.process-wide-untouched


def _process_settings() -> dict[str, object]:
    return {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "initial_seed": torch.initial_seed(),
        "rng_state": torch.random.get_rng_state().tolist(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "grad_enabled": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_enabled": torch.backends.cudnn.enabled,
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
    }


class Busy(Node):
    """Computes with its own generator, sends, reads; touches no process-wide setting."""

    x = Input(optional=True)
    y = Output()

    def __init__(self, seed: int | None, *, dedicated_thread: bool = False) -> None:
        super().__init__(period=0.25, seed=seed, dedicated_thread=dedicated_thread)
        self.weight = torch.randn(4, 4, generator=self.generator)

    def on_start(self) -> None:
        self.bias = torch.zeros(4)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        v = torch.randn(4, generator=self.generator) if x is None else x
        self.y.send(torch.tanh(self.weight @ v + self.bias))


@pytest.mark.rule("settings.process-wide-untouched")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_process_wide_settings_are_untouched(timer: str) -> None:
    """> Mujou never changes process-wide settings: torch.get_num_threads(), the default
    > generator and its seed, torch.are_deterministic_algorithms_enabled() are the same after a
    > run as before."""
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(False)
    before = _process_settings()
    a, b, c = Busy(seed=1), Busy(seed=None), Busy(seed=3, dedicated_thread=True)
    net = Bag(a=a, b=b, c=c)
    net.connect(a.y, b.x)
    net.connect(b.y, c.x)
    the_timer = vt() if timer == "virtual" else mujou.RealTimeTimer()
    with mujou.run(net, timer=the_timer, workers=2) as run:
        run.sleep(1.0 if timer == "virtual" else 0.05)
        assert _process_settings() == before
        tree = run.state_dict()
        run.read(c.y)
    assert _process_settings() == before
    with mujou.run(
        Bag(a=Busy(1), b=Busy(2), c=Busy(3, dedicated_thread=True)), timer=vt(), state=tree
    ) as run:
        run.sleep(0.5)
    assert _process_settings() == before


# --------------------------------------------------------------------------------------------
# settings.oversubscription-warning


def _oversubscription(workers: int, dedicated: int, threads: int) -> list[warnings.WarningMessage]:
    """Start and stop a run; return the OversubscriptionWarnings it issued."""
    torch.set_num_threads(threads)
    members: dict[str, Node | Net] = {f"w{i}": Plain(period=1.0) for i in range(2)}
    members.update({f"d{i}": Plain(period=1.0, dedicated_thread=True) for i in range(dedicated)})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with mujou.run(Bag(**members), timer=vt(), workers=workers) as run:
            run.sleep(1.0)
    return [w for w in record if issubclass(w.category, mujou.OversubscriptionWarning)]


def oversubscribed(workers: int, dedicated: int, threads: int, fix: str) -> str:
    """The anchored pattern of an OversubscriptionWarning."""
    known = physical_cores()
    cores = r"\d+" if known is None else str(known)
    return (
        rf"^this run computes on {workers + dedicated} thread\(s\) \({workers} worker\(s\) and "
        rf"{dedicated} dedicated\), and torch uses {threads} thread\(s\) for each: more than the "
        rf"{cores} physical core\(s\) this process may use; {fix}$"
    )


@pytest.mark.rule("settings.oversubscription-warning")
def test_oversubscription_warns_once_with_the_fix() -> None:
    """> mujou.run issues one OversubscriptionWarning, with the fixes that would help
    > (torch.set_num_threads(1) before mujou.run when torch uses more than one thread, fewer
    > workers when there are more than one, fewer dedicated threads when there are any)."""
    too_many = len(affinity()) + 1
    torch.set_num_threads(1)
    with (
        pytest.warns(mujou.OversubscriptionWarning) as record,
        mujou.run(Bag(a=Plain(), b=Plain()), timer=vt(), workers=too_many) as run,
    ):
        run.sleep(1.0)
    shown = [str(w.message) for w in record if w.category is mujou.OversubscriptionWarning]
    assert len(shown) == 1, shown
    # torch already uses one thread, and no node has a thread of its own: fewer workers only.
    fix = r"run fewer workers \(mujou\.run\(net, workers=n\)\)"
    assert re.search(oversubscribed(too_many, 0, 1, fix), shown[0]), shown[0]
    # torch uses more, and a node has a thread of its own: each of the three fixes.
    found = _oversubscription(too_many, 1, 2)
    assert len(found) == 1, found
    fix = (
        r"call torch\.set_num_threads\(1\) before mujou\.run, or run fewer workers "
        r"\(mujou\.run\(net, workers=n\)\), or give fewer nodes dedicated_thread=True"
    )
    assert re.search(oversubscribed(too_many, 1, 2, fix), str(found[0].message)), found[0]
    assert len(_oversubscription(too_many, 0, 1)) == 1
    assert len(_oversubscription(1, 0, 1)) == 0  # 1 x 1 never exceeds the cores


@pytest.mark.rule("settings.oversubscription-warning")
def test_oversubscription_boundary() -> None:
    """> when (workers + dedicated-thread nodes) × torch.get_num_threads() exceeds the physical
    > cores the process may use."""
    cores = physical_cores()
    if cores is None or cores > 32:
        pytest.skip(f"physical cores unknown or too many to test the boundary: {cores}")
    assert len(_oversubscription(cores, 0, 1)) == 0
    assert len(_oversubscription(cores + 1, 0, 1)) == 1
    assert len(_oversubscription(cores, 1, 1)) == 1  # a dedicated thread counts
    if cores >= 2:
        assert len(_oversubscription(cores - 1, 1, 1)) == 0
        assert len(_oversubscription(cores // 2, 0, 2)) == 0
        assert len(_oversubscription(cores // 2 + 1, 0, 2)) == 1


def _process_oversubscription(threads: int) -> list[str]:
    """A run of one node in the host's process and one in a process of its own, each on one
    worker, with torch on ``threads`` threads; the OversubscriptionWarnings it issued."""
    torch.set_num_threads(threads)
    there = Plain(period=1.0)
    net = Bag(here=Plain(period=1.0), there=there)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with mujou.run(net, timer=vt(), workers=1, processes={"p": there}) as run:
            run.sleep(1.0)
    return [str(w.message) for w in record if issubclass(w.category, mujou.OversubscriptionWarning)]


@pytest.mark.rule("settings.oversubscription-processes")
def test_oversubscription_counts_each_process_and_advises_what_can_be_done() -> None:
    """> With processes=, each process is counted on its own: its workers and its
    > dedicated-thread nodes, times torch.get_num_threads(), against the physical cores the
    > process may use. The warning names the processes over the count, and its fix lists only
    > what would lower it: torch.set_num_threads(1) when torch uses more than one thread, fewer
    > workers when such a process has more than one, fewer dedicated threads when it has any."""
    cores = physical_cores()
    if cores is None or cores > 32:
        pytest.skip(f"physical cores unknown or too many for this test: {cores}")
    # Each process fits (1 worker x cores threads); together they would not: no warning.
    assert _process_oversubscription(cores) == []
    # Each process is over, on one worker and no dedicated thread: torch's threads are the fix.
    shown = _process_oversubscription(cores + 1)
    assert shown == [
        "the host's process computes on 1 thread(s) (1 worker(s) and 0 dedicated), process 'p' "
        f"computes on 1 thread(s) (1 worker(s) and 0 dedicated), and torch uses {cores + 1} "
        f"thread(s) for each: more than the {cores} physical core(s) each process may use; "
        "call torch.set_num_threads(1) before mujou.run"
    ], shown
    assert len(_oversubscription(cores, 0, 2)) == 1


# --------------------------------------------------------------------------------------------
# Property tests: random nets, random blocking, under both timers.


@dataclass(frozen=True)
class NodeSpec:
    period: float
    dedicated: bool
    block: str  # "none", "event" or "torch"
    sources: tuple[int | None, int | None]  # which node's output feeds inputs a and b


def random_net_spec(rng: random.Random, virtual: bool) -> list[NodeSpec]:
    count = rng.randint(1, 7)
    periods = [0.01, 0.02, 0.03, 0.05, 0.1, 0.125] if virtual else [0.001, 0.002, 0.005, 0.01, 0.02]
    specs = []
    for _ in range(count):
        sources = tuple(rng.randrange(count) if rng.random() < 0.6 else None for _ in range(2))
        specs.append(
            NodeSpec(
                period=rng.choice(periods),
                dedicated=rng.random() < 0.2,
                block=rng.choice(["none", "none", "event", "torch"]),
                sources=(sources[0], sources[1]),
            )
        )
    return specs


class PropNode(Node):
    """Checks exclusivity, visibility and hook order from the inside."""

    a = Input(optional=True)
    b = Input(optional=True)
    y = Output()

    def __init__(self, spec: NodeSpec, seed: int) -> None:
        super().__init__(period=spec.period, seed=seed, dedicated_thread=spec.dedicated)
        self.spec = spec
        self.rng = random.Random(seed)  # only ever used inside this node's hooks
        self.inside = threading.Lock()
        self.count = 0
        self.total = torch.zeros(())
        self.hooks: list[str] = []
        self.problems: list[str] = []
        self.seen: dict[str, list[int]] = {"a": [], "b": []}
        self.threads: set[tuple[int, str]] = set()

    def _enter(self, hook: str) -> None:
        if not self.inside.acquire(blocking=False):
            self.problems.append(f"{hook} overlapped another hook")
            self.inside.acquire()
        if self.hooks and self.hooks[-1] == "on_stop":
            self.problems.append(f"{hook} after on_stop")
        if hook == "on_start" and self.hooks:
            self.problems.append("on_start after other hooks")
        if hook != "on_start" and not self.hooks:
            self.problems.append(f"{hook} before on_start")
        if self.count != len(self.hooks) or float(self.total) != len(self.hooks):
            self.problems.append(
                f"{hook} saw count={self.count} total={float(self.total)} after {len(self.hooks)} hooks"
            )
        self.hooks.append(hook)
        self.threads.add((threading.get_ident(), threading.current_thread().name))

    def _exit(self) -> None:
        self.count += 1
        self.total += 1
        self.inside.release()

    def _block(self) -> None:
        if self.spec.block == "event":
            threading.Event().wait(self.rng.uniform(0.0, 0.001))
        elif self.spec.block == "torch":
            m = torch.rand(24, 24, generator=self.generator)
            for _ in range(self.rng.randint(1, 4)):
                m = torch.tanh(m @ m)

    def on_start(self) -> None:
        self._enter("on_start")
        self._block()
        self._exit()

    def on_update(self, dt: float) -> None:
        self._enter("on_update")
        if not dt > 0:
            self.problems.append(f"dt={dt}")
        for attr, port in (("a", self.a), ("b", self.b)):
            message = port.read()
            if message is not None:
                value = int(message)
                seen = self.seen[attr]
                if seen and value < seen[-1]:
                    self.problems.append(f"{attr} went back from {seen[-1]} to {value}")
                seen.append(value)
        self._block()
        self.y.send(torch.tensor(self.hooks.count("on_update")))
        self._exit()

    def on_stop(self) -> None:
        self._enter("on_stop")
        self._block()
        self._exit()


def build(specs: list[NodeSpec], seed: int) -> tuple[Net, list[PropNode]]:
    nodes = [PropNode(spec, seed * 100 + i) for i, spec in enumerate(specs)]
    half = len(nodes) // 2
    inner = Bag(**{f"m{i}": n for i, n in enumerate(nodes[:half])})
    net = Bag(inner=inner, **{f"n{i}": n for i, n in enumerate(nodes[half:], start=half)})
    for node, spec in zip(nodes, specs, strict=True):
        for port, source in ((node.a, spec.sources[0]), (node.b, spec.sources[1])):
            if source is not None:
                net.connect(nodes[source].y, port)
    return net, nodes


def guarded(fn: Callable[[], None]) -> None:
    """Run ``fn`` on a thread of its own; fail if it does not end in HANG_GUARD (a deadlock)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="conformance-host")
    thread.start()
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), f"deadlock: the run did not end; threads: {mujou_threads()}"
    if errors:
        raise errors[0]


def run_random_net(seed: int, virtual: bool, workers: int) -> list[PropNode]:
    rng = random.Random(seed)
    specs = random_net_spec(rng, virtual)
    net, nodes = build(specs, seed)
    seconds = rng.choice([0.5, 1.0]) if virtual else rng.choice([0.03, 0.06])
    host_sleeps = rng.randint(1, 3)
    host: list[str] = []  # the host thread's name: it may run updates in run.sleep in real time

    def scenario() -> None:
        host.append(threading.current_thread().name)
        the_timer = vt() if virtual else mujou.RealTimeTimer()
        with mujou.run(net, timer=the_timer, workers=workers) as run:
            for _ in range(host_sleeps):
                run.sleep(seconds / host_sleeps)
        hooks_after_stop = [len(n.hooks) for n in nodes]
        threading.Event().wait(0.005)
        if [len(n.hooks) for n in nodes] != hooks_after_stop:
            raise AssertionError("a hook ran after stop() returned")
        if mujou_threads():
            raise AssertionError(f"threads outlived stop(): {mujou_threads()}")

    guarded(scenario)
    repro = f"run_random_net(seed={seed}, virtual={virtual}, workers={workers}); specs={specs}"
    for i, node in enumerate(nodes):
        assert node.problems == [], (i, node.problems, repro)
        assert node.hooks[0] == "on_start", (i, node.hooks[:3], repro)
        assert node.hooks.count("on_start") == 1, repro
        assert node.hooks.count("on_stop") == 1, (i, repro)
        assert node.hooks[-1] == "on_stop", (i, node.hooks[-3:], repro)
        assert node.count == len(node.hooks), repro
        names = {name for _, name in node.threads}
        if node.dedicated_thread:
            assert names == {f"mujou-node-{node.name}"}, (i, names, repro)
            assert len(node.threads) == 1, (i, node.threads, repro)
        else:  # threads.worker-pool, threads.host-runs-updates
            lent = set(host)
            assert all(n.startswith("mujou-worker-") or n in lent for n in names), (i, names, repro)
    return nodes


@pytest.mark.rule(
    "threads.hooks-exclusive", "nodes.hook-order", "threads.dedicated", "threads.host-runs-updates"
)
@pytest.mark.parametrize("seed", range(12))
def test_random_nets_realtime(seed: int) -> None:
    """> The hooks of one node never run at the same time, and each sees what the previous one
    > wrote. (Random nets, random blocking, real time: also clean shutdown and no deadlock.)"""
    run_random_net(seed, virtual=False, workers=random.Random(-seed).randint(1, 4))


@pytest.mark.rule("threads.hooks-exclusive", "nodes.hook-order", "sched.virtual-deterministic")
@pytest.mark.parametrize("seed", range(12))
def test_random_nets_virtual(seed: int) -> None:
    """> The hooks of one node never run at the same time, and each sees what the previous one
    > wrote. (Random nets, random blocking, virtual time; the same net gives the same reads
    > whatever the number of workers.)"""
    one = run_random_net(seed, virtual=True, workers=1)
    many = run_random_net(seed, virtual=True, workers=random.Random(-seed).randint(2, 4))
    for i, (x, y) in enumerate(zip(one, many, strict=True)):
        assert x.hooks == y.hooks, (seed, i)
        assert x.seen == y.seen, (seed, i)


# --------------------------------------------------------------------------------------------
# Gaps found by mutation testing


@pytest.mark.rule("threads.context")
@pytest.mark.parametrize("dedicated", [False, True], ids=["worker", "dedicated"])
def test_context_starts_empty_at_each_run_of_a_net(dedicated: bool) -> None:
    """> each node runs its hooks in a `contextvars.Context` of its own, which starts empty at
    > the start of each run: what a hook set in the first run of a net is gone in the second."""
    node = ContextUser(dedicated_thread=dedicated)
    net = Bag(user=node)
    for _ in range(2):
        with mujou.run(net, timer=vt(), workers=1) as run:
            run.sleep(0.5)
    assert node.at_start == [("<unset>", 0), ("<unset>", 0)], node.at_start
    assert set(node.seen) == {"set by user"}, node.seen


def fake_cpu_probe(monkeypatch: pytest.MonkeyPatch, *, logical: int, affinity: int, gil: bool) -> None:
    """Make Mujou's CPU probe see ``logical`` CPUs, ``affinity`` of them allowed, no cgroup
    quota, and the GIL ``gil``.

    The default number of workers depends on the machine, so this one helper patches Mujou's
    private probe (mujou._cpus, and the modules that imported its gil_enabled by name): the
    only departure from the public API in this suite."""
    from mujou import _cpus  # private: imported only where it is patched

    original_gil = _cpus.gil_enabled
    monkeypatch.setattr(os, "cpu_count", lambda: logical)
    monkeypatch.setattr(_cpus, "affinity_cpus", lambda: set(range(affinity)))
    monkeypatch.setattr(_cpus, "quota_cpus", lambda: None)
    for name, module in list(sys.modules.items()):
        ours = name == "mujou" or name.startswith("mujou.")
        if ours and getattr(module, "gil_enabled", None) is original_gil:
            monkeypatch.setattr(module, "gil_enabled", lambda: gil)


@pytest.mark.rule("threads.default-workers")
@pytest.mark.parametrize(
    ("affinity", "gil", "nodes", "expected"),
    [
        (8, False, (10, 0), 8),  # the logical CPUs
        (8, True, (10, 0), 4),  # half of them under the GIL
        (3, False, (10, 0), 3),  # fewer: the affinity limits them
        (3, True, (10, 0), 1),  # half of 3, rounded down
        (1, True, (10, 0), 1),  # at least 1
        (8, False, (2, 3), 2),  # never more than the nodes on the workers
        (8, True, (3, 1), 3),
        (8, False, (0, 2), 0),  # none when every node has a thread of its own
    ],
    ids=str,
)
def test_default_workers_on_a_faked_machine(
    monkeypatch: pytest.MonkeyPatch, affinity: int, gil: bool, nodes: tuple[int, int], expected: int
) -> None:
    """> The default number of workers is the number of CPUs the process may use (the logical
    > cores, or fewer when the CPU affinity or a cgroup CPU quota limits them), or half of it (at
    > least 1) while the GIL is enabled, and never more than the nodes on the workers (none when
    > every node has a thread of its own). On a machine of 8 CPUs, faked (see fake_cpu_probe)."""
    fake_cpu_probe(monkeypatch, logical=8, affinity=affinity, gil=gil)
    on_workers, dedicated = nodes
    members: dict[str, Node | Net] = {f"w{i}": Plain(period=1.0) for i in range(on_workers)}
    members.update({f"d{i}": Plain(period=1.0, dedicated_thread=True) for i in range(dedicated)})
    with mujou.run(Bag(**members), timer=vt()) as run:
        run.sleep(2.0)
        assert run.workers == expected
        assert len(mujou_threads("mujou-worker-")) == expected
