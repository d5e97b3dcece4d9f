"""Conformance test for the page "Several machines": a group's process ends with its agent
(``hosts.orphan``), even while the run's host still holds its connections open."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _agents import SECRET, LocalHost
from _support import HANG_GUARD, checkout_environ, is_dead, wait_until

# The run's host: a program of its own, so that the test can stop it with its connections open.
HOST_PROGRAM = """
import sys
import mujou
from _process_nodes import Chain

net = Chain()
placed = {"g1": mujou.OnHost(net.left, sys.argv[1], timeout=600.0)}
with mujou.run(net, timer=mujou.VirtualTimer(), processes=placed) as run:
    run.sleep(0.2)
    print("running", flush=True)
    while True:
        run.sleep(0.1)
"""


@pytest.mark.rule("hosts.orphan")
def test_a_group_process_ends_when_its_agent_is_killed_alone(tmp_path: Path) -> None:
    agent = LocalHost(tmp_path / "agent.log")
    environ = checkout_environ(quiet=True)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(Path(__file__).resolve().parent)])
    environ["MUJOU_SECRET"] = SECRET
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_PROGRAM, agent.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=environ,
        text=True,
    )
    try:
        assert host.stdout is not None
        ready, _, _ = select.select([host.stdout], [], [], HANG_GUARD)
        assert ready and host.stdout.readline() == "running\n", "the run did not start"
        (pid,) = agent.group_processes()
        # The run's host is stopped: it closes nothing, and its timeout is far. Only the
        # agent's death can end the process.
        host.send_signal(signal.SIGSTOP)
        os.kill(agent.process.pid, signal.SIGKILL)
        wait_until(lambda: is_dead(pid), "the group's process to end after its agent was killed")
    finally:
        host.kill()
        host.wait(HANG_GUARD)
        if host.stdout is not None:
            host.stdout.close()
        agent.close()
