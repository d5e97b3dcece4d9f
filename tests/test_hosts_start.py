"""The start of a run whose groups are all on other hosts (mujou._hosts, _processes._spawn): the
agent's fork server is started as the agent begins to serve, and the run's host starts none of
its own (each would import torch: seconds at the first run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _agents import SECRET, LocalHost, _children
from _support import wait_until

import mujou
from mujou._processes import _spawn


class Ping(mujou.Node):
    y = mujou.Output()

    def __init__(self) -> None:
        super().__init__(period=0.1, seed=0)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.y.send(torch.tensor(self.count))


class Pair(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.there = Ping()
        self.here = Ping()


def test_an_agent_starts_its_fork_server_at_once_and_an_all_remote_run_starts_none_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: the agent's warm-up removed (no child before the first run), and the run's host
    calling start_context for a run with only remote groups (the patched one raises)."""
    host = LocalHost(tmp_path / "agent.log")
    try:
        # Before any run: the agent's fork server runs (a child of the agent's).
        wait_until(lambda: bool(_children(host.process.pid)), "the agent's fork server")

        def no_server() -> object:
            raise AssertionError("the run's host started a fork server for a run with no local group")

        monkeypatch.setattr(_spawn, "start_context", no_server)
        monkeypatch.setenv("MUJOU_SECRET", SECRET)
        with mujou.run(Pair(), timer=mujou.VirtualTimer()) as run:
            run.sleep(0.35)
            alone = run.state_dict()
        net = Pair()
        with mujou.run(
            net, timer=mujou.VirtualTimer(), processes={"g": mujou.OnHost(net.there, host.address)}
        ) as run:
            run.sleep(0.35)
            assert run.state_dict()["there"]["count"] == alone["there"]["count"] > 0
        host.wait_no_group_process()
    finally:
        host.close()
