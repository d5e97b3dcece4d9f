"""Internal errors of the engine: a fault planted in Mujou's own code stops the run, nothing hangs.

Conformance tests cannot reach Mujou's own code through the public API; these plant the fault
(run.internal-error) on each kind of thread: a worker, a dedicated thread, the state thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import mujou
from mujou import Net, Node
from mujou._engine import _policy, _update
from mujou._engine._slot import Slot

from ._compiled import skip_if_compiled

HANG = 30.0


class Counting(Node):
    def __init__(self, dedicated: bool = False) -> None:
        super().__init__(period=0.1, seed=0, dedicated_thread=dedicated)
        self.stops = 0

    def on_start(self) -> None:
        self.count = torch.zeros(())

    def on_update(self, dt: float) -> None:
        self.count += 1

    def on_stop(self) -> None:
        self.stops += 1


class Three(Net):
    def __init__(self) -> None:
        super().__init__()
        self.a = Counting()
        self.b = Counting()
        self.d = Counting(dedicated=True)


@pytest.fixture
def torch_one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def fail_on(
    monkeypatch: pytest.MonkeyPatch, node: str, *, update: int | None = 3, thread: int | None = None
) -> RuntimeError:
    """Make the start of ``node``'s update number ``update`` (None: any) raise, a bug in Mujou,
    on any thread (``thread``: only on the thread of that ident): a worker's, worker 0 lent to
    a process's command thread and a host thread all begin an update in ``_update``'s runner,
    in place; a dedicated thread in ``_update.begin_update``. Planted in the node's
    ``Slot.dt_min``, which each of them reads once an update, after counting it (the
    statistics, which no test here reads otherwise); the exception that is raised."""
    planted = RuntimeError("planted")
    member = Slot.__dict__["dt_min"]

    def get(slot: Slot) -> float:
        if (
            slot.name == node
            and (update is None or slot.updates == update)
            and (thread is None or threading.get_ident() == thread)
        ):
            raise planted
        value: float = member.__get__(slot, Slot)
        return value

    monkeypatch.setattr(Slot, "dt_min", property(get, member.__set__))
    return planted


def in_thread(call: Any) -> BaseException | None:
    """Run ``call`` on a thread; its exception, or None; fails if it hangs."""
    raised: list[BaseException] = []

    def main() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), "the host call hung"
    return raised[0] if raised else None


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.filterwarnings("ignore::mujou.OversubscriptionWarning")
@pytest.mark.parametrize(("node", "workers"), [("a", 1), ("a", 2), ("d", 1)])
def test_a_fault_on_a_hook_thread_stops_the_run(
    monkeypatch: pytest.MonkeyPatch, node: str, workers: int
) -> None:
    skip_if_compiled(_update)  # compiled, a Slot's fields are not descriptors to plant in
    planted = fail_on(monkeypatch, node)
    net = Three()
    run = mujou.run(net, workers=workers, timer=mujou.VirtualTimer())
    error = in_thread(lambda: run.sleep(10.0))
    assert isinstance(error, mujou.MujouInternalError) and error.__cause__ is planted
    assert in_thread(run.stop) is not None  # stop() raises it again, and returns
    assert not run.running
    survivors = [n for n in (net.a, net.b, net.d) if n.name != node]
    assert all(n.stops == 1 for n in survivors), [n.stops for n in survivors]
    assert getattr(net, node).stops == 0  # the node its thread held gets no more hooks
    monkeypatch.undo()
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer()) as again:  # the net may run again
        again.sleep(0.1)


@pytest.mark.usefixtures("torch_one_thread")
def test_a_fault_on_the_state_thread_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    skip_if_compiled(_policy)
    net = Three()
    run = mujou.run(net, workers=1, timer=mujou.VirtualTimer())
    run.sleep(0.5)
    planted = RuntimeError("planted")

    def begin_state_job(*args: Any) -> None:
        raise planted

    monkeypatch.setattr(run._engine.policy, "begin_state_job", begin_state_job)
    error = in_thread(run.state_dict)
    assert isinstance(error, mujou.MujouInternalError) and error.__cause__ is planted
    in_thread(run.stop)
    assert not run.running
    assert net.d.stops == 1  # the dedicated node's state job ran on its own thread
