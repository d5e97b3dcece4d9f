"""Conformance tests for the page "Several machines" (spec/en/several-machines.md): the thread that
receives from another host runs an update only while its per-thread torch settings are a new
thread's (hosts.receiver-runs-updates, threads.host-thread-settings), read again after each
update it ran."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _agents import SECRET, LocalHost, one_local_host
from _process_nodes import Sender
from _support import HANG_GUARD, Bag, hang_guard, wait_until
from torch.overrides import TorchFunctionMode

import mujou


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHost]:
    yield from one_local_host(tmp_path_factory.mktemp("agent"))


class Passing(TorchFunctionMode):
    """A torch function mode that changes nothing."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class Leaker(mujou.Node):
    """Triggered by ``a``: notes the thread of each update; the first leaves a torch function
    mode pushed on its thread (it never exits it)."""

    a = mujou.Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("a"), seed=0)
        self.threads: list[str] = []

    def on_update(self, dt: float) -> None:
        assert self.a.read() is not None
        self.threads.append(threading.current_thread().name)
        if len(self.threads) == 1:
            mode: Any = Passing()
            mode.__enter__()


@pytest.mark.rule("hosts.receiver-runs-updates", "threads.host-thread-settings")
def test_a_receiving_thread_a_hook_left_a_torch_mode_on_runs_no_more_updates(
    host: LocalHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)
    sender, leaker = Sender(), Leaker()
    net = Bag(sender=sender, leaker=leaker)
    net.connect(sender.a, leaker.a)
    with (
        hang_guard(HANG_GUARD),
        mujou.run(net, workers=1, processes={"far": mujou.OnHost(sender, host.address)}),
    ):
        wait_until(lambda: len(leaker.threads) >= 4, "the reader's updates")
    assert leaker.threads[0] == "mujou-plane-receive-sender.a"
    assert set(leaker.threads[1:]) == {"mujou-worker-0"}
    assert torch._C._len_torch_function_stack() == 0  # the host's thread never had it
    host.wait_no_group_process()
