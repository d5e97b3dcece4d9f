"""Conformance tests for the page "Processes" (spec/en/processes.md): rules ``proc.*``.

The nodes that run in processes of their own are in ``_process_nodes.py``: the processes are
spawned, so their classes must be importable by name. Starting a process costs seconds here,
so a test often checks several rules in one run. Results under the virtual timer are compared
bit for bit with the same net run in one process.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from _order_nodes import ThreeFailures, raises_earlys_failure
from _process_nodes import (
    Chain,
    Contextual,
    DiesInATag,
    Failing,
    Hogged,
    HostCalls,
    Inside,
    Leaker,
    Locked,
    ManyReaders,
    Marker,
    SendsThenFails,
    Source,
    Stalls,
    TwoStalls,
    Unstartable,
    Wire,
    check_wire,
    count_of,
)
from _support import HANG_GUARD, Bag, Plain, is_dead, sigstopped, vt, wait_until

import mujou
from mujou import Node, NodeList

SHM = Path("/dev/shm")


# --- helpers ------------------------------------------------------------------------------------


def children() -> list[str]:
    """The names of this process's live child processes that a run started."""
    return sorted(p.name for p in multiprocessing.active_children() if p.name.startswith("mujou-"))


def shm_names() -> set[str]:
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


@pytest.fixture
def clean() -> Iterator[Callable[[], None]]:
    """A check that no process of a run is left and /dev/shm has no entry the test left.

    Another pytest worker may make short-lived entries meanwhile: a new name fails the check
    only if it is still there after the hang guard.
    """
    assert not children(), f"processes left by an earlier test: {children()}"
    before = shm_names()

    def check() -> None:
        assert not children(), f"processes of the run still alive: {children()}"
        wait_until(lambda: not (shm_names() - before), f"/dev/shm entries to go: {shm_names() - before}")

    yield check


def assert_same(a: object, b: object, path: str = "tree") -> None:
    """Identical trees: the same keys in the same order, types, and tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: tensor vs {type(b).__name__}"
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), f"{path}: {a!r} vs {b!r}"
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), (
            f"{path}: tensors differ:\n{a}\n{b}"
        )
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping), f"{path}: mapping vs {type(b).__name__}"
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert isinstance(b, list | tuple)
        assert len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def stats_but_busy(run: mujou.Run) -> list[tuple[str, tuple[Any, ...], tuple[Any, ...]]]:
    """Every node's statistics but ``busy`` (real time), in the run's order."""
    return [
        (
            name,
            (*(s.updates, s.skipped, s.dt_min, s.dt_mean, s.dt_max), *(s.lateness_p50, s.lateness_p99)),
            (s.lateness_max, dict(s.coalesced)),
        )
        for name, s in run.stats().nodes.items()
    ]


def child_named(name: str) -> multiprocessing.process.BaseProcess:
    found = [p for p in multiprocessing.active_children() if p.name == f"mujou-{name}"]
    assert len(found) == 1, f"no single process mujou-{name}: {children()}"
    return found[0]


def stopped(name: str) -> contextlib.AbstractContextManager[None]:
    """Process ``name`` of the run stopped (SIGSTOP), every thread of it, inside the block."""
    pid = child_named(name).pid
    assert pid is not None
    return sigstopped(pid)


# --- placement and arguments (no process starts) --------------------------------------------------


def small_net() -> Any:
    return Bag(a=Plain(period=0.1), b=Plain(period=0.1), inner=Bag(c=Plain(period=0.1)))


@pytest.mark.rule("proc.arguments")
@pytest.mark.parametrize(
    ("processes", "error", "shown"),
    [
        (lambda net: [net.a], TypeError, "[<Plain 'a'"),
        (lambda net: "a", TypeError, "'a'"),
        (lambda net: {1: net.a}, TypeError, "1"),
        (lambda net: {"g": "a"}, TypeError, "'a'"),
        (lambda net: {"g": [net.a, 3]}, TypeError, "3"),
        (lambda net: {"g": {"x": net.a}}, TypeError, "{'x'"),
        (lambda net: {"": net.a}, ValueError, "empty"),
        (lambda net: {"g": Plain()}, ValueError, "'g'"),
        (lambda net: {"g": Bag(x=Plain())}, ValueError, "'x'"),
        (lambda net: {"g": []}, ValueError, "'g'"),
        (lambda net: {"g": NodeList()}, ValueError, "'g'"),
        (lambda net: {"g": ()}, ValueError, "'g'"),
    ],
    ids=[
        "not-a-mapping-list",
        "not-a-mapping-str",
        "name-not-str",
        "member-str",
        "member-int-in-list",
        "member-dict",
        "empty-name",
        "node-not-in-net",
        "net-not-in-net",
        "empty-list",
        "empty-nodelist",
        "empty-tuple",
    ],
)
def test_bad_processes_are_refused_before_anything_starts(
    processes: Callable[[Any], object], error: type[Exception], shown: str
) -> None:
    log: list[str] = []

    class Starter(Node):
        def on_start(self) -> None:
            log.append("started")

    net = small_net()
    net.starter = Starter(period=0.1)
    with pytest.raises(error) as info:
        mujou.run(net, timer=vt(), processes=processes(net))  # type: ignore[arg-type]
    message = str(info.value)
    assert "process" in message, message
    assert shown in message, message
    assert log == [] and not children()
    with mujou.run(net, timer=vt()) as run:  # nothing of the refused run is left
        run.sleep(0.1)
    assert log == ["started"]


@pytest.mark.rule("proc.arguments")
def test_a_node_in_two_groups_is_named_with_both() -> None:
    net = small_net()
    for processes in ({"one": net.a, "two": [net.b, net.a]}, {"one": net.inner, "two": net.inner.c}):
        with pytest.raises(ValueError) as info:
            mujou.run(net, timer=vt(), processes=processes)
        message = str(info.value)
        assert "'one'" in message and "'two'" in message, message
        assert ("'a'" in message) or ("'inner.c'" in message), message
    assert not children()


@pytest.mark.rule("proc.arguments")
def test_what_a_group_is_is_said() -> None:
    net = small_net()
    with pytest.raises(TypeError) as info:
        mujou.run(net, timer=vt(), processes={"vision": [net.a, "detector"]})
    message = str(info.value)
    assert "'vision'" in message and "'detector'" in message, message
    for allowed in ("node", "NodeList", "NodeDict", "list", "tuple"):
        assert allowed in message, message
    assert "net" in message.lower(), message


@pytest.mark.rule("proc.placement")
def test_no_processes_and_an_empty_mapping_run_in_one_process() -> None:
    processes: dict[str, object] | None
    for processes in (None, {}):
        net: Any = Bag(inner=Bag(x=Contextual("x", seed=1)))
        with mujou.run(net, timer=vt(), workers=1, processes=processes) as run:
            assert not children()
            run.sleep(0.2)
            assert run.state_dict()["inner"]["x"]["pid"] == os.getpid()
            assert run.workers == 1
        # The node ran on the host's own object.
        assert net.inner.x.pid == os.getpid() and net.inner.x.tags == ["x"] * 4


# --- copies of the nodes ----------------------------------------------------------------------------


@pytest.mark.rule("proc.copied")
def test_an_unpicklable_attribute_is_named_before_anything_starts(
    tmp_path: Path, clean: Callable[[], None]
) -> None:
    net: Any = Bag(home=Marker(str(tmp_path / "home")), locked=Locked())
    with pytest.raises(TypeError) as info:
        mujou.run(net, timer=vt(), processes={"g": net.locked})
    message = str(info.value)
    assert "'locked'" in message and "'lock'" in message and "on_start" in message, message
    assert not net.home.stopped  # no node started
    clean()
    with mujou.run(net, timer=vt()) as run:  # the net is free to run again
        run.sleep(0.1)


@pytest.mark.rule("proc.copied")
def test_a_class_the_process_cannot_import_is_named(clean: Callable[[], None]) -> None:
    class Local(Node):
        pass

    net: Any = Bag(local=Local(period=0.1), other=Plain(period=0.1))
    with pytest.raises(TypeError) as info:
        mujou.run(net, timer=vt(), processes={"g": net.local})
    message = str(info.value)
    assert "Local" in message and "'local'" in message and "top level" in message, message
    clean()
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.1)


# --- under the virtual timer ------------------------------------------------------------------------


def three_processes(net: Chain) -> dict[str, object]:
    return {"g1": net.left, "g2": [net.right[0], net.right[1]]}


def other_processes(net: Chain) -> dict[str, object]:
    return {"solo": net.left.relay1, "rest": (net.src_a, net.right[1], net.back)}


Placing = Callable[[Chain], dict[str, object]] | None


def chain_run(placing: Placing, workers: int, trace: Path | None = None) -> dict[str, Any]:
    """Run :class:`Chain` under the virtual timer for 1.5 s; everything the host sees of it."""
    net = Chain()
    processes = None if placing is None else placing(net)
    seconds = 1.5
    with mujou.run(net, timer=vt(), workers=workers, processes=processes, trace=trace) as run:
        back = run.subscribe(net.back.out)
        joined = run.subscribe(net.right[1].out)
        run.sleep(seconds / 2)
        mid = run.state_dict()
        run.sleep(seconds / 2)
        seen = {
            "time": run.time,
            "tree": run.state_dict(),
            "mid": mid,
            "back": back.drain(),
            "joined": joined.drain(),
            "reads": [
                run.read(port)
                for port in (
                    net.src_a.out,
                    net.left.relay1.out,
                    net.right[0].out,
                    net.right[1].out,
                    net.back.out,
                )
            ],
            "stats": stats_but_busy(run),
            "children": children(),
        }
    return seen


@pytest.fixture(scope="module")
def one_process() -> dict[str, Any]:
    return chain_run(None, workers=1)


@pytest.mark.rule("proc.virtual", "proc.state", "proc.placement", "proc.trace")
@pytest.mark.parametrize("workers", [1, 2])
def test_placement_changes_no_bit_under_the_virtual_timer(
    workers: int, one_process: dict[str, Any], tmp_path: Path, clean: Callable[[], None]
) -> None:
    alone = chain_run(None, workers=workers)
    placed = chain_run(three_processes, workers=workers, trace=tmp_path / "trace.json")
    assert placed["children"] == ["mujou-g1", "mujou-g2"]
    assert alone["children"] == []
    for seen in (alone, placed):
        for key in ("time", "tree", "mid", "back", "joined", "reads", "stats"):
            assert_same(one_process[key], seen[key], key)
        assert_same(one_process["tree"]["@mujou"], seen["tree"]["@mujou"], "@mujou")
    # The run did something worth comparing: the triggered chain ran through every hop.
    tree = placed["tree"]
    assert len(tree["back"]["log"]) > 5 and tree["right"]["1"]["count"] > 3
    assert len(placed["back"]) == len(tree["back"]["log"])
    check_trace(tmp_path / "trace.json", placed["stats"])
    clean()


def check_trace(path: Path, stats: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]]) -> None:
    """The trace of a :class:`Chain` run placed by ``three_processes`` (proc.trace)."""
    events = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(names) == 3 and {"g1", "g2"} < set(names.values()), names
    pid_of = {name: pid for pid, name in names.items()}
    host = next(pid for pid, name in names.items() if name not in {"g1", "g2"})
    updates = [e for e in events if e["ph"] == "X" and e["cat"] == "on_update"]
    for node, (count, *_), _ in stats:
        mine = [e for e in updates if e["name"] == node]
        assert len(mine) == count, (node, len(mine), count)
        expected = (
            pid_of["g1"] if node.startswith("left.") else pid_of["g2"] if node.startswith("right.") else host
        )
        assert {e["pid"] for e in mine} == {expected}, (node, names)
    # One time axis: the tags run one after another, in every process, so every update of a
    # tag ends before any update of a later tag starts, whichever process ran them.
    tags: dict[float, list[dict[str, Any]]] = {}
    for event in updates:
        tags.setdefault(event["args"]["t"], []).append(event)
    order = sorted(tags)
    assert len({e["pid"] for e in updates}) == 3
    for earlier, later in itertools.pairwise(order):
        end = max(e["ts"] + e["dur"] for e in tags[earlier])
        start = min(e["ts"] for e in tags[later])
        assert end <= start + 1.0, (earlier, later, end, start)  # 1 us: the rounding of ts


@pytest.mark.rule("proc.state")
def test_a_tree_resumes_under_any_placement(one_process: dict[str, Any], clean: Callable[[], None]) -> None:
    mid, final = one_process["mid"], one_process["tree"]

    def resume(tree: dict[str, Any], placing: Placing) -> dict[str, Any]:
        """Resume ``tree`` under ``placing`` up to 1.5 s, taking a tree at 1.125 s on the way."""
        net = Chain()
        processes = None if placing is None else placing(net)
        with mujou.run(net, timer=vt(), workers=1, processes=processes, state=tree) as run:
            assert run.time == tree["@mujou"]["time"]
            if run.time < 1.125:
                run.sleep(1.125 - run.time)
            halfway = run.state_dict()
            run.sleep(1.5 - run.time)
            return {"halfway": halfway, "tree": run.state_dict()}

    # A tree taken without processes, resumed under a placement.
    first = resume(mid, three_processes)
    assert_same(final, first["tree"])
    # A tree taken under that placement, resumed under another one, and under none.
    second = resume(first["halfway"], other_processes)
    assert_same(final, second["tree"])
    third = resume(first["halfway"], None)
    assert_same(final, third["tree"])
    assert_same(first["halfway"], third["halfway"])
    clean()


# --- the host's calls ------------------------------------------------------------------------------


def host_calls(placed: bool) -> tuple[list[Any], HostCalls]:
    net = HostCalls()
    processes = {"child": [net.counter, net.echo]} if placed else None
    seen: list[Any] = []
    with mujou.run(
        net, timer=vt(), workers=1, processes=processes, inputs={net.counter.cmd: torch.tensor(2.0)}
    ) as run:
        if placed:
            seen.append(children())
        run.sleep(0.35)
        seen += [run.time, run.read(net.counter.out), run.read(net.counter.cmd), run.read(net.echo.out)]
        subscription = run.subscribe(net.counter.out)
        commands = run.subscribe(net.counter.cmd)
        echoes = run.subscribe(net.echo.x)
        run.write(net.counter.cmd, torch.tensor(3.0))
        if placed:  # the host's tensor and the copy's change independently
            net.counter.buf.fill_(100.0)
        run.sleep(0.3)
        seen += [subscription.drain(), commands.drain(), echoes.drain()]
        seen.append(run.wait_for(net.counter.out, lambda m: float(m[0]) > 40.0, timeout=5.0))
        seen.append(run.wait_for(net.echo.out, lambda m: float(m) >= 12.0, timeout=5.0))
        seen.append(run.time)
        with pytest.raises(TimeoutError):
            run.join(timeout=0.2)
        seen.append(run.time)
        stats = run.stats()
        seen.append([(name, s.updates) for name, s in stats.nodes.items()])
        seen.append(run.state_dict())
        run.stop()
        seen.append(run.time)
    # After the end, the host still reads what each process left (run.state-after-error).
    seen += [run.read(net.counter.out), run.read(net.echo.out), run.state_dict(), stats_but_busy(run)]
    return seen, net


@pytest.mark.rule("proc.host-api", "proc.host-objects", "proc.copied", "proc.cleanup")
def test_the_host_calls_work_on_the_nodes_of_a_process(clean: Callable[[], None]) -> None:
    alone, _ = host_calls(placed=False)
    placed, net = host_calls(placed=True)
    assert placed.pop(0) == ["mujou-child"]
    assert_same(alone, placed)
    assert [name for name, _ in placed[-7]] == ["ticker", "counter", "echo"]
    tree = placed[-6]
    assert_same(tree, placed[-2])
    assert tree["counter"]["count"] > 10 and tree["echo"]["seen"][:3] == [1.0, 2.0, 3.0]
    # The host's objects of the placed nodes: no hook ran on them; only the host's own
    # change of its tensor is there (proc.host-objects, proc.copied).
    assert (net.counter.count, net.counter.started, net.echo.seen) == (0, False, [])
    assert torch.equal(net.counter.buf, torch.full((2,), 100.0))
    assert net.ticker.count > 0  # the host's own node is the user's object
    clean()  # after a normal stop (proc.cleanup)


@pytest.mark.rule("proc.host-api")
def test_join_returns_after_the_run_ended(clean: Callable[[], None]) -> None:
    net = HostCalls()
    inputs = {net.counter.cmd: torch.tensor(2.0)}
    with mujou.run(net, timer=vt(), processes={"child": net.counter}, inputs=inputs) as run:
        run.sleep(0.2)
    try:
        run.join()
    finally:
        clean()


# --- messages between processes (real-time timer) ---------------------------------------------------


@pytest.mark.rule("proc.latest-value", "proc.transport", "proc.wake")
def test_messages_cross_whole_and_in_order_under_the_real_time_timer(clean: Callable[[], None]) -> None:
    net = Wire()
    processes = {"tx": [net.sender, net.stamp_log, net.pinger], "rx": [net.checker, net.ponger]}
    # Each hop of the ping-pong is a wake-up of the other process (proc.wake). 500 round trips
    # take well under a second here; a timed poll of 50 ms on the path of each round trip
    # would take longer than the timeout.
    check_wire(net, processes, 500)
    clean()


@pytest.mark.rule("proc.wake", "proc.wake-worker")
def test_messages_reach_a_process_whose_every_worker_is_busy(clean: Callable[[], None]) -> None:
    """The one worker of the reader's process runs a long update; the messages another
    process sends meanwhile are still received there at once: a node on a thread of its own
    that they trigger reads them while the update runs, which ends the update (planted: only
    an idle worker takes the records, no thread of Mujou's does: nothing is received until
    the update ends, which then waits its whole bound and sends False)."""
    net = Hogged()
    with mujou.run(net, workers=1, processes={"rx": [net.hog, net.watcher]}) as run:
        held = run.wait_for(net.hog.held, timeout=HANG_GUARD)
    assert bool(held), "the messages sent during the long update did not reach its process"
    clean()


# --- failures ---------------------------------------------------------------------------------------


def failing_run(directory: Path, placed: bool) -> tuple[mujou.HookError, Failing]:
    net = Failing(directory)
    processes = {"bad": [net.failer, net.bad_marker], "ok": net.ok_marker} if placed else None
    with pytest.raises(mujou.HookError) as info, mujou.run(net, timer=vt(), processes=processes) as run:
        run.sleep(1.0)
    return info.value, net


@pytest.mark.rule("proc.hook-error", "proc.cleanup", "proc.virtual")
def test_a_hook_error_in_a_process_stops_the_run(tmp_path: Path, clean: Callable[[], None]) -> None:
    (tmp_path / "alone").mkdir()
    (tmp_path / "placed").mkdir()
    alone, _ = failing_run(tmp_path / "alone", placed=False)
    error, net = failing_run(tmp_path / "placed", placed=True)
    assert (error.node, error.hook) == ("failer", "on_update")
    assert (error.node, error.hook, error.time) == (alone.node, alone.hook, alone.time)
    assert str(error).startswith(str(alone)), (str(error), str(alone))
    assert str(alone) == "node 'failer' raised ValueError in on_update at t=0.300: count reached 3"
    cause = error.__cause__
    assert type(cause) is ValueError and cause.args == ("count reached 3",)
    # The traceback of the hook in its process comes along, with the function that raised.
    text = "".join(traceback.format_exception(error))
    assert "explode_in_child" in text and "'bad'" in text, text
    # Every process's nodes got on_stop: the host's, and those of both other processes.
    assert net.host_marker.stopped
    for name in ("host", "bad", "ok"):
        assert (tmp_path / "placed" / name).read_text() == (tmp_path / "alone" / name).read_text()
    clean()


@pytest.mark.rule("proc.exchange", "sched.virtual-failure", "proc.hook-error")
@pytest.mark.parametrize("placed", ["early", "all"])
def test_a_failure_in_the_one_process_of_a_virtual_sleep_is_the_runs_error(
    placed: str, clean: Callable[[], None]
) -> None:
    """> ... a failure at a tag ends the span there, on both sides, and the run's error is
    the one of that tag's failures that one process would raise ...

    Three nodes fail at t=0.3 (``early`` registered first). With one process besides the host,
    holding ``early`` (the host fails at that tag too) or all three (the host has no node), the
    error is ``early``'s at t=0.3, as in one process. Planted: ``_lockstep._span`` not counting
    the process's failure (only the host's): with ``early``, the error was ``middle``'s; with
    all three, the host waited for an end that never came, and the hang guard failed it."""
    net = ThreeFailures()
    group = [net.early] if placed == "early" else [net.early, net.middle, net.late]
    run = mujou.run(net, timer=vt(), processes={"b": group})
    raises_earlys_failure(run)
    clean()


@pytest.mark.rule("proc.hook-error", "proc.cleanup")
def test_an_on_start_error_in_a_process_fails_mujou_run(tmp_path: Path, clean: Callable[[], None]) -> None:
    net = Unstartable(tmp_path)
    with pytest.raises(mujou.HookError) as info:
        mujou.run(net, timer=vt(), processes={"bad": net.start_failer, "ok": net.ok_marker})
    error = info.value
    assert (error.node, error.hook, error.time) == ("start_failer", "on_start", 0.0)
    assert (
        str(error)
        == "node 'start_failer' raised RefusalError in on_start at t=0.000: no device here (code 3)"
    )
    # RefusalError cannot be rebuilt from its args: the cause is a RuntimeError naming it.
    cause = error.__cause__
    assert (
        type(cause) is RuntimeError
        and "RefusalError" in str(cause)
        and "no device here (code 3)" in str(cause)
    )
    assert "on_start" in "".join(traceback.format_exception(error))
    # The nodes whose on_start returned got on_stop, in every process (run.start-undone).
    assert net.host_marker.stopped
    assert (tmp_path / "ok").read_text() == "stopped after 0 updates"
    clean()
    del net.start_failer
    with mujou.run(net, timer=vt()) as run:  # the other nodes may run again at once
        run.sleep(0.1)


def in_a_thread(call: Callable[[], object]) -> list[object]:
    """Run ``call`` in a thread; on a hang, end the run's processes and fail (the thread
    stays blocked: it is a daemon)."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, name="test-call", daemon=True)
    thread.start()
    thread.join(HANG_GUARD / 2)
    if thread.is_alive():
        for process in multiprocessing.active_children():
            if process.name.startswith("mujou-"):
                process.kill()
                process.join(HANG_GUARD)
        pytest.fail(f"hung for {HANG_GUARD / 2} s")
    return outcome


@pytest.mark.rule("proc.placement")
def test_every_node_may_be_in_a_process(clean: Callable[[], None]) -> None:
    net: Any = Bag(only=Source(0.1, seed=1))

    def whole_run() -> object:
        with mujou.run(net, timer=vt(), processes={"all": net.only}) as run:
            run.sleep(0.5)
            return run.state_dict()["only"]["count"]

    assert in_a_thread(whole_run) == [5]
    clean()


@pytest.mark.rule("proc.died", "proc.cleanup")
def test_a_process_that_dies_stops_the_run(tmp_path: Path, clean: Callable[[], None]) -> None:
    net: Any = Failing(tmp_path)
    del net.failer, net.bad_marker
    net.doomed = Source(0.1, seed=1)
    run = mujou.run(net, timer=vt(), processes={"doomed": net.doomed, "ok": net.ok_marker})
    try:
        run.sleep(0.3)
        doomed = child_named("doomed")
        assert doomed.pid is not None
        os.kill(doomed.pid, signal.SIGKILL)
        wait_until(lambda: is_dead(doomed.pid or 0), "the killed process to end")
        with pytest.raises(mujou.ProcessError) as info:
            run.sleep(0.5)
            run.join(timeout=0.5)
        error = info.value
        assert (error.process, error.nodes) == ("doomed", ("doomed",))
        message = str(error)
        assert "'doomed'" in message, message
        with pytest.raises(mujou.ProcessError):  # a later call that waits raises it too
            run.join()
        with pytest.raises(mujou.ProcessError):  # the dead process's state is lost
            run.state_dict()
    finally:
        with contextlib.suppress(mujou.ProcessError):
            run.stop()
    assert run.time <= 0.8
    # The other processes' nodes got on_stop: the host's, and those of process "ok".
    assert net.host_marker.stopped
    assert (tmp_path / "ok").read_text().startswith("stopped after ")
    clean()
    assert error.exitcode == -9 and "SIGKILL" in message, message


@pytest.mark.rule("proc.died", "proc.virtual")
def test_under_the_virtual_timer_the_others_finish_the_tag_a_process_died_in(
    clean: Callable[[], None],
) -> None:
    """The death is noticed while the host's first node of the tag is in its update; the
    host's second node of the tag still gets its update. Planted: the death stopping the
    host's engine at once, and this fails (2 updates for 3)."""
    net = DiesInATag()
    run = mujou.run(net, timer=vt(), workers=1, processes={"doomed": net.doomed})
    try:
        with pytest.raises(mujou.ProcessError) as info:
            run.sleep(1.0)
            run.join(timeout=1.0)
        assert info.value.exitcode == 7
    finally:
        with contextlib.suppress(mujou.ProcessError):
            run.stop()
    assert (net.lingering.count, net.counted.count) == (3, 3)
    clean()


@pytest.mark.rule("proc.virtual", "proc.hook-error")
@pytest.mark.parametrize("placed", [False, True])
def test_the_last_tags_messages_are_out_when_the_host_call_returns(
    placed: bool, clean: Callable[[], None]
) -> None:
    """The last tag's messages reach their readers in the other processes before the host's
    call returns, as they are visible in one process: ``run.read`` of the reader's input gives
    the source's last message after a ``wait_for`` and after the failing tag. Planted: the
    messages to a periodic reader kept back for the next tag's command, when the wait ends
    or the run stops, and this fails."""
    net = SendsThenFails()
    run = mujou.run(net, timer=vt(), processes={"far": net.sampler} if placed else None)
    try:
        first = run.wait_for(net.source.out, timeout=0.15)
        seen = run.read(net.sampler.x)
        assert seen is not None and torch.equal(seen, first)
        with pytest.raises(mujou.HookError):
            run.sleep(1.0)
        read, sent = run.read(net.sampler.x), run.read(net.source.out)
    finally:
        with contextlib.suppress(mujou.HookError):
            run.stop()
    assert read is not None and sent is not None and torch.equal(read, sent)
    assert net.source.count == 3  # the source sent at the failing tag
    clean()


@pytest.mark.rule("proc.latest-value", "proc.transport")
@pytest.mark.parametrize("kind", ["tensor", "nest", "grow"])
def test_a_process_that_stops_reading_does_not_hold_up_its_senders(
    kind: str, clean: Callable[[], None]
) -> None:
    """The reader's process is stopped (SIGSTOP) while the sender sends 3,000 messages, more
    than its wake pipe holds: the sender goes on, and once the reader's process goes on too,
    its input has the last message, a nest's structure with it, in its own shape. "grow"
    sends a new shape each time, so each message announces a new ring. Planted: every record
    waiting for the full pipe, and the sender stops at about 1,300 (a nest's record still
    carrying its structure, and so waiting: the same; the announcements waiting: about 120)."""
    limit = 3000
    net = Stalls(limit, kind)

    def last(port: mujou.Input[Any] | mujou.Output[Any]) -> int:
        return count_of(run.read(port), kind)

    with mujou.run(net, processes={"sender": net.sender, "reader": net.reader}) as run:
        wait_until(lambda: run.read(net.reader.x) is not None, "the reader's first message")
        with stopped("reader"):
            wait_until(lambda: last(net.sender.out) == limit, "the sender's last message")
        wait_until(lambda: last(net.reader.x) == limit, "the reader to have the last message")
    clean()


@pytest.mark.rule("proc.transport", "proc.latest-value")
def test_an_output_read_in_several_processes_reaches_each(clean: Callable[[], None]) -> None:
    """One output, read in two other processes and in the host's: each reader's process gets
    its own ring, and each reader the last message. Planted: one announcement pickled for
    every pipe, whose descriptor only the first reader's process can fetch, and the others
    never read a message."""
    limit = 50
    net = ManyReaders(limit)
    processes = {"sender": net.sender, "first": net.first, "second": net.second}
    with mujou.run(net, processes=processes) as run:
        for reader in (net.first, net.second, net.third):

            def has_last(port: mujou.Input[Any] = reader.x) -> bool:
                return count_of(run.read(port), "tensor") == limit

            wait_until(has_last, f"{reader.name}'s last message")
    clean()


@pytest.mark.rule("proc.latest-value")
def test_a_message_a_full_pipe_left_out_reaches_the_reader(clean: Callable[[], None]) -> None:
    """Two outputs share the wake pipe to the reader's process, stopped (SIGSTOP): one fills
    it, the other sends its second message meanwhile. Once the reader's process goes on, the
    left-out record of the second reaches it (written by the next send through the pipe, or
    by the pipe's flusher). Planted: the left-out record forgotten, and the reader never gets
    that second message."""
    mark = 3000
    net = TwoStalls(mark)

    def last(port: mujou.Input[torch.Tensor] | mujou.Output[torch.Tensor]) -> int:
        message = run.read(port)
        return -1 if message is None else int(message)

    with mujou.run(net, processes={"sender": net.sender, "reader": net.reader}) as run:
        wait_until(lambda: last(net.reader.once) == 1, "the reader's first message")
        with stopped("reader"):
            wait_until(lambda: last(net.sender.once) == mark, "the other output's second message")
        wait_until(lambda: last(net.reader.once) == mark, "the reader to have that second message")
    clean()


# --- inside a process -------------------------------------------------------------------------------


@pytest.mark.rule("proc.same-rules", "proc.workers", "proc.placement")
def test_inside_a_process_the_rules_of_one_process_hold(tmp_path: Path, clean: Callable[[], None]) -> None:
    dtype, deterministic = torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled()
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True)
    try:
        net = Inside(tmp_path)
        with mujou.run(net, timer=vt(), workers=2, processes={"solo": net.solo, "inner": net.inner}) as run:
            assert children() == ["mujou-inner", "mujou-solo"]
            # workers=2: two in each process, and the run counts them all (proc.workers).
            assert run.workers == 6 and run.stats().workers == 6 and len(run.stats().worker_busy) == 6
            run.sleep(0.5)
            tree = run.state_dict()
    finally:
        torch.set_default_dtype(dtype)
        torch.use_deterministic_algorithms(deterministic)
    home, solo, inner = tree["home"], tree["solo"]["0"], tree["inner"]
    # Placement: the NodeList's node in one process, the sub-net's nodes together in another.
    pids = {home["pid"], solo["pid"], inner["first"]["pid"]}
    assert home["pid"] == os.getpid() and len(pids) == 3
    assert inner["first"]["pid"] == inner["second"]["pid"] == inner["extra"]["third"]["pid"]
    # Each node has its own context (set in on_start, seen in every update) and generator.
    nodes = [
        ("home", home),
        ("first", inner["first"]),
        ("second", inner["second"]),
        ("third", inner["extra"]["third"]),
    ]
    for name, node in nodes:
        assert node["tags"] == [name] * 10, (name, node["tags"])
        assert node["overlaps"] == 0
    assert torch.equal(inner["first"]["last"], inner["second"]["last"])
    assert torch.equal(inner["first"]["last"], home["last"])
    assert not torch.equal(inner["first"]["last"], inner["extra"]["third"]["last"])
    # The host's torch settings that Mujou gives each process.
    settings = (torch.float64, torch.get_num_threads(), True)
    assert home["settings"] == inner["first"]["settings"] == inner["extra"]["third"]["settings"] == settings
    assert home["last"].dtype == inner["first"]["last"].dtype == torch.float64
    # workers=2: two workers in each process (proc.workers).
    assert home["workers"] == 2 and inner["first"]["workers"] == 2 and solo["workers"] == 2
    # The dedicated node ran every hook on one thread of its own, on_stop included.
    threads = solo["threads"]
    assert len(threads) == 6 and len(set(threads)) == 1
    stop_thread, start_thread = (tmp_path / "dedicated").read_text().split()
    assert int(stop_thread) == int(start_thread) == threads[0]
    clean()


@pytest.mark.rule("proc.workers", "proc.placement")
def test_workers_none_lets_each_process_choose_from_its_own_nodes(
    tmp_path: Path, clean: Callable[[], None]
) -> None:
    net = Inside(tmp_path)
    # Groups as a tuple of a node, and as a list of nodes and a NodeDict (proc.placement).
    processes = {"solo": (net.solo[0],), "inner": [net.inner.first, net.inner.second, net.inner.extra]}
    with mujou.run(net, timer=vt(), processes=processes) as run:
        assert children() == ["mujou-inner", "mujou-solo"]
        run.sleep(0.2)
        tree = run.state_dict()
        workers = (run.workers, run.stats().workers, len(run.stats().worker_busy))
    # Only a dedicated node in "solo": no worker there; at least one where nodes need one.
    assert tree["solo"]["0"]["workers"] == 0
    assert tree["home"]["workers"] >= 1 and tree["inner"]["first"]["workers"] >= 1
    with mujou.run(Inside(tmp_path), timer=vt()) as alone:
        one_process = alone.workers
    assert tree["home"]["workers"] == min(one_process, 1)  # one node on the host's workers
    total = tree["home"]["workers"] + tree["inner"]["first"]["workers"]
    assert workers == (total, total, total)
    inner = tree["inner"]
    assert inner["first"]["pid"] == inner["second"]["pid"] == inner["extra"]["third"]["pid"]
    assert len({tree["home"]["pid"], tree["solo"]["0"]["pid"], inner["first"]["pid"]}) == 3
    clean()


@pytest.mark.rule("proc.same-rules")
def test_warnings_about_hooks_in_a_process_reach_the_host(clean: Callable[[], None]) -> None:
    net: Any = Bag(leaker=Leaker(), home=Plain(period=0.1))
    try:
        run = mujou.run(net, timer=vt(), processes={"g": net.leaker})
        with run, pytest.warns(mujou.LeakedSettingWarning, match="leaker"):
            run.sleep(0.3)
    finally:
        clean()


ORPHANED = """
import multiprocessing, os, pathlib, sys
sys.path[:0] = {path!r}
import mujou
from _process_nodes import Failing
directory = pathlib.Path({directory!r})
net = Failing(directory)
del net.failer, net.bad_marker
run = mujou.run(net, timer=mujou.VirtualTimer(), processes={{"ok": net.ok_marker}})
run.sleep(0.3)
pids = [p.pid for p in multiprocessing.active_children() if p.name.startswith("mujou-")]
(directory / "pids").write_text(" ".join(map(str, [run.state_dict()["ok_marker"]["updates"], *pids])))
os._exit(0)
"""


@pytest.mark.rule("proc.cleanup")
def test_a_process_whose_host_ended_stops_its_nodes_and_exits(tmp_path: Path) -> None:
    script = ORPHANED.format(path=sys.path, directory=str(tmp_path))
    with (tmp_path / "stderr").open("w") as stderr:  # not a pipe: the orphan would hold it open
        result = subprocess.run(
            [sys.executable, "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=HANG_GUARD,
            check=False,
        )
    assert result.returncode == 0, (tmp_path / "stderr").read_text()
    updates, *pids = (int(word) for word in (tmp_path / "pids").read_text().split())
    assert len(pids) == 1 and updates > 0, pids
    try:
        wait_until(lambda: all(is_dead(pid) for pid in pids), "the orphaned process to exit")
    finally:
        for pid in pids:  # the run's process, if it is still there: end it
            if not is_dead(pid):
                os.kill(pid, signal.SIGKILL)
    assert (tmp_path / "ok").read_text() == f"stopped after {updates} updates"
    assert not (tmp_path / "host").exists()  # the host's node never stopped: its process ended
