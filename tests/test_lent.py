"""A lent worker (NOTE [ a lent worker ] in ``_engine._threads``): the thread that waits for the
engine is worker 0 while it waits, as a process of a run does under the virtual timer.

The conformance suite runs it through the processes (proc.virtual, proc.same-rules); these
drive an ``Engine`` built with ``lent=True`` directly, on a ``HookThread`` of their own, and
each wait of the scenario is bounded: a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import mujou
from mujou import Net, Node
from mujou._engine import Engine, HookThread, _update

from ._compiled import skip_if_compiled
from .test_engine import fail_on

HANG = 30.0


@pytest.fixture(autouse=True)
def torch_one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Recording(Node):
    """Records the thread of each hook; ``start_seconds``: how long on_start takes."""

    def __init__(self, dedicated: bool = False, start_seconds: float = 0.0) -> None:
        super().__init__(period=0.125, seed=0, dedicated_thread=dedicated)  # exact in binary
        self.start_seconds = start_seconds
        self.threads: dict[str, set[int]] = {}
        self.updates = 0
        self.stops = 0

    def _saw(self, hook: str) -> None:
        self.threads.setdefault(hook, set()).add(threading.get_ident())

    def on_start(self) -> None:
        self._saw("on_start")
        time.sleep(self.start_seconds)  # the others' on_start end first

    def on_update(self, dt: float) -> None:
        self._saw("on_update")
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        self._saw("state_dict")
        return {"updates": torch.tensor(self.updates)}

    def on_stop(self) -> None:
        self._saw("on_stop")
        self.stops += 1


class Mixed(Net):
    def __init__(self, slow_dedicated: float = 0.0) -> None:
        super().__init__()
        self.a = Recording()
        self.b = Recording()
        self.d = Recording(dedicated=True, start_seconds=slow_dedicated)


def on_lent_thread(scenario: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``scenario`` on a HookThread named as worker 0, as a process's command thread is:
    its result and the thread's ident."""
    results: list[Any] = []

    def body() -> None:
        results.append(scenario())

    thread = HookThread(target=body, name="mujou-worker-0", daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), "the lent worker hung"
    assert thread.ident is not None
    return results[0] if results else None, thread.ident


def lent_engine(net: Net, workers: int = 1) -> Engine:
    """An engine for ``net`` whose calling thread is worker 0: built on the lent thread."""
    return Engine(list(net.nodes()), workers, mujou.VirtualTimer(), None, lent=True)


def run_lent(
    net: Net,
    until: float,
    *,
    workers: int = 1,
    state: bool = True,
    after_go: Callable[[Engine], None] | None = None,
) -> tuple[Engine, dict[str, Any] | None]:
    """On the lent thread: start, ``after_go``, advance to ``until``, take the state (when
    ``state``) and stop. The engine and the tree."""
    engines: list[Engine] = []

    def scenario() -> dict[str, Any] | None:
        engine = lent_engine(net, workers)
        engines.append(engine)
        engine.claim()
        engine.start(None)
        engine.go()
        if after_go is not None:
            after_go(engine)
        engine.advance(until, None)
        tree = engine.state_tree() if state else None
        engine.stop()
        return tree

    tree, _ = on_lent_thread(scenario)
    return engines[0], tree


@pytest.mark.parametrize("workers", [1, 2])
def test_the_lent_thread_runs_worker_zeros_hooks(workers: int) -> None:
    net = Mixed()
    others: list[str] = []
    idents: list[int] = []

    def look(engine: Engine) -> None:
        others.extend(t.name for t in threading.enumerate() if t.name.startswith("mujou-worker"))
        idents.append(threading.get_ident())

    engine, tree = run_lent(net, 0.5, workers=workers, after_go=look)
    assert tree is not None
    ident = idents[0]
    assert engine.ended and engine.error is None
    # Worker 0 is the lent thread itself: only the others have threads of their own.
    assert sorted(others) == [f"mujou-worker-{i}" for i in range(workers)]
    updates = (tree["a"]["updates"].item(), tree["b"]["updates"].item())
    assert updates == (4, 4)  # t = 0.125, ... 0.5 (sched.first-due)
    assert net.a.stops == net.b.stops == net.d.stops == 1
    # state_dict runs on the state thread (state.consistent-snapshot), the rest on workers.
    pooled = {
        t
        for node in (net.a, net.b)
        for hook, seen in node.threads.items()
        if hook != "state_dict"
        for t in seen
    }
    if workers == 1:  # every other hook of the pooled nodes on the lent thread
        assert pooled == {ident}
    assert ident in pooled
    dedicated = set().union(*net.d.threads.values())
    assert len(dedicated) == 1 and dedicated.isdisjoint(pooled)  # the dedicated node keeps its thread


def test_the_same_state_as_with_a_thread_of_its_own() -> None:
    _, lent = run_lent(Mixed(), 1.0)
    assert lent is not None
    net = Mixed()
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as run:
        run.sleep(1.0)
        own = run.state_dict()
    assert {name: node["updates"].item() for name, node in lent.items() if name in "abd"} == {
        name: node["updates"].item() for name, node in own.items() if name in "abd"
    }


def test_a_parked_lent_worker_wakes_when_a_dedicated_thread_ends_its_job() -> None:
    """The lent thread runs the pooled on_starts, then parks as worker 0 while the dedicated
    node's on_start still runs: the end of that job wakes it (Engine._notify_host)."""
    net = Mixed(slow_dedicated=0.3)
    engine, tree = run_lent(net, 0.25)
    assert tree is not None and engine.ended and engine.error is None
    assert tree["d"]["updates"].item() == 2  # t = 0.125, 0.25


def test_a_fault_on_the_lent_worker_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception in Mujou's code on the lent worker: MujouInternalError, the other nodes
    still get on_stop, and the waits return (run.internal-error)."""
    skip_if_compiled(_update)
    planted = fail_on(monkeypatch, "a")  # its third update
    net = Mixed()
    engine, _ = run_lent(net, 1.0, state=False)
    assert engine.ended
    assert isinstance(engine.error, mujou.MujouInternalError)
    assert engine.error.__cause__ is planted
    assert net.a.stops == 0  # held when it failed: its state is unknown
    assert net.b.stops == 1 and net.d.stops == 1


def test_a_second_fault_ends_worker_zero_and_the_run_still_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    planted = RuntimeError("planted")

    def next_for_worker(self: Any, w: int, now: float, real: float) -> tuple[int, Any]:
        raise planted

    def plant(engine: Engine) -> None:
        monkeypatch.setattr(type(engine.policy), "next_for_worker", next_for_worker)

    engine, _ = run_lent(Mixed(), 1.0, state=False, after_go=plant)
    assert engine.ended
    assert isinstance(engine.error, mujou.MujouInternalError)
    assert engine.lent is not None and engine.lent.exited
