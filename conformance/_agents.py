"""Local "hosts" for the tests of several machines (conformance/test_hosts*.py): agents
(``python -m mujou serve``) started as processes of this machine, reached over loopback TCP
through the same code as another machine; and ``chain_run``, what the host sees of the Chain
net under the virtual timer, wherever its groups are placed.

Each agent is a process group of its own, so a test can stop or kill a whole "host".
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from _process_nodes import Chain
from _support import HANG_GUARD, checkout_environ, is_dead, vt, wait_until

import mujou

SECRET = "conformance-secret-" + "0123456789abcdef" * 2
AGENT_START = 120.0  # real seconds an agent has to import torch and listen, on a busy machine


class LocalHost:
    """One agent on loopback: its address, its process, the processes it started."""

    def __init__(self, log: Path, *, secret: str = SECRET, environ: Mapping[str, str] | None = None) -> None:
        """``environ``: variables added to the agent's environment, which the processes it
        starts inherit (such as a ``NCCL_HOSTID`` of the "host"'s own)."""
        given = environ
        environ = checkout_environ(quiet=True)
        environ.update(given or {})
        here = str(Path(__file__).resolve().parent)
        environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], here])
        environ["MUJOU_SECRET"] = secret
        self.log = log
        self._log_file = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mujou", "serve", "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=environ,
            text=True,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], AGENT_START)
        line = self.process.stdout.readline() if ready else ""
        if not line.startswith("mujou agent listening on "):
            self.close()
            raise RuntimeError(f"the agent did not start: {line!r}; its log: {log.read_text()}")
        self.address = line.split()[-1]

    def group_processes(self) -> list[int]:
        """The live processes the agent started for runs: the children of its fork server
        (the agent's own children are the fork server and the resource tracker)."""
        own = set(_children(self.process.pid))
        return [pid for pid in _descendants(self.process.pid) if pid not in own and not is_dead(pid)]

    def wait_no_group_process(self) -> None:
        wait_until(lambda: not self.group_processes(), f"the processes of agent {self.address} to end")

    def signal(self, number: int) -> None:
        """Send ``number`` to the whole "host": the agent and every process it started."""
        os.killpg(self.process.pid, number)

    def close(self) -> None:
        """End the agent and everything it started (bounded)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGCONT)
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(HANG_GUARD)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(HANG_GUARD)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # its fork server and tracker
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log_file.close()


def _children(root: int) -> list[int]:
    return _parents().get(root, [])


def _descendants(root: int) -> list[int]:
    parents = _parents()
    found, todo = [], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _parents() -> dict[int, list[int]]:
    """Each live process's children, by the parent's id."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(parent, []).append(int(entry))
    return parents


def one_local_host(logs: Path) -> Iterator[LocalHost]:
    """One agent on loopback for a module's tests (a fixture's body), closed after them."""
    agent = LocalHost(logs / "a.log")
    try:
        yield agent
    finally:
        agent.close()


def two_local_hosts(
    logs: Path, environs: tuple[Mapping[str, str] | None, Mapping[str, str] | None] = (None, None)
) -> Iterator[tuple[LocalHost, LocalHost]]:
    """Two agents on loopback for a module's tests (a fixture's body), closed after them;
    ``environs``: variables added to each one's environment (``LocalHost``'s ``environ``)."""
    first = LocalHost(logs / "a.log", environ=environs[0])
    try:
        second = LocalHost(logs / "b.log", environ=environs[1])
    except BaseException:
        first.close()
        raise
    yield first, second
    first.close()
    second.close()


def stats_but_busy(run: mujou.Run) -> list[tuple[str, tuple[Any, ...]]]:
    """Every node's statistics but ``busy`` (real time), in the run's order."""
    return [
        (name, (s.updates, s.skipped, s.dt_min, s.dt_mean, s.dt_max, s.lateness_max, dict(s.coalesced)))
        for name, s in run.stats().nodes.items()
    ]


def chain_run(placing: dict[str, object] | None, net: Chain) -> dict[str, Any]:
    """Run :class:`Chain` under the virtual timer; everything the host sees of it."""
    with mujou.run(net, timer=vt(), workers=1, processes=placing) as run:
        back = run.subscribe(net.back.out)
        run.sleep(0.75)
        mid = run.state_dict()
        run.sleep(0.75)
        return {
            "time": run.time,
            "tree": run.state_dict(),
            "mid": mid,
            "back": back.drain(),
            "reads": [run.read(port) for port in (net.src_a.out, net.left.relay1.out, net.right[1].out)],
            "stats": stats_but_busy(run),
            "source": net.left.relay1.x.source is net.src_a.out,
        }
