"""Conformance tests for the page "Several machines" (spec/en/several-machines.md): ``hosts.*``.

The "hosts" are agents (``python -m mujou serve``) started on this machine and reached over
loopback TCP, through the same code as another machine. An agent imports torch and starts a
fork server once, so the module shares two agents among its tests and each test checks
several things in one run; a test that stops or kills a whole host starts one of its own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from _agents import SECRET, LocalHost, chain_run, two_local_hosts
from _process_nodes import Chain, Relay, Sender, Stalls, Wire, check_wire, count_of
from _support import (
    HANG_GUARD,
    Bag,
    Blocker,
    assert_same,
    checkout_environ,
    hang_guard,
    sigstopped,
    vt,
    wait_until,
)

import mujou


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalHost, LocalHost]]:
    yield from two_local_hosts(tmp_path_factory.mktemp("agents"))


@pytest.mark.rule("hosts.placement", "hosts.virtual", "hosts.host-api", "hosts.agent", "hosts.cleanup")
def test_two_hosts_give_the_bits_of_one_process(hosts: tuple[LocalHost, LocalHost]) -> None:
    first, second = hosts
    alone = chain_run(None, Chain())
    net = Chain()
    placed = chain_run(
        {
            "g1": mujou.OnHost(net.left, first.address, secret=SECRET),
            "g2": mujou.OnHost([net.right[0], net.right[1]], second.address),  # MUJOU_SECRET
        },
        net,
    )
    for key in ("time", "tree", "mid", "back", "reads", "stats", "source"):
        assert_same(alone[key], placed[key], key)
    assert placed["source"] is True
    tree = placed["tree"]
    assert len(tree["back"]["log"]) > 5 and tree["right"]["1"]["count"] > 3  # the chain ran
    assert net.left.relay1.acc.eq(0).all()  # the host's objects are untouched
    # A tree taken on two hosts resumes in one process, and the net runs there again.
    with mujou.run(net, timer=vt(), state=tree) as run:
        assert run.time == placed["time"]
        run.sleep(0.1)
    first.wait_no_group_process()
    second.wait_no_group_process()


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOU_SECRET", SECRET)


@pytest.mark.rule("hosts.lost", "hosts.cleanup")
def test_a_killed_process_on_a_host_stops_the_run_naming_the_host(hosts: tuple[LocalHost, LocalHost]) -> None:
    first, _ = hosts
    net = Chain()
    run = mujou.run(net, timer=vt(), processes={"g1": mujou.OnHost(net.left, first.address)})
    with pytest.raises(mujou.ProcessError) as info, run:
        run.sleep(0.2)
        (pid,) = first.group_processes()
        os.kill(pid, signal.SIGKILL)
        for _ in range(10_000):
            run.sleep(0.1)
    error = info.value
    message = str(error)
    assert error.process == "g1" and error.exitcode == -signal.SIGKILL, message
    assert first.address in message and "'left.relay1'" in message and "SIGKILL" in message, message
    assert error.nodes == ("left.src_b", "left.relay1", "left.sink") and not run.running
    first.wait_no_group_process()


@pytest.mark.rule("hosts.lost", "hosts.cleanup")
def test_a_stopped_host_is_lost_after_its_timeout(tmp_path: Path) -> None:
    host = LocalHost(tmp_path / "stopped.log")
    try:
        net = Chain()
        run = mujou.run(net, timer=vt(), processes={"g1": mujou.OnHost(net.left, host.address, timeout=2.0)})
        with pytest.raises(mujou.ProcessError) as info, run:
            run.sleep(0.2)
            host.signal(signal.SIGSTOP)
            for _ in range(10_000):
                run.sleep(0.1)
        message = str(info.value)
        assert info.value.process == "g1" and info.value.exitcode is None, message
        assert f"on host {host.address!r} was lost: its host did not answer for 2 s" in message, message
        assert "'left.relay1'" in message and not run.running, message
        # Once the host runs again, its agent finds the run's host silent, and ends the process.
        host.signal(signal.SIGCONT)
        host.wait_no_group_process()
    finally:
        host.close()


@pytest.mark.rule("hosts.refused", "hosts.secret")
def test_hosts_that_cannot_take_the_group_are_refused_at_start(
    hosts: tuple[LocalHost, LocalHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = hosts
    net = Chain()
    # The wrong secret: the agent takes nothing from this run (and goes on serving).
    with pytest.raises(mujou.HostError, match=r"^host '127\.0\.0\.1:\d+' of process 'g1': .*secret") as info:
        mujou.run(net, timer=vt(), processes={"g1": mujou.OnHost(net.left, first.address, secret="w" * 32)})
    assert info.value.host == first.address and info.value.process == "g1"
    wait_until(lambda: "refused a connection" in first.log.read_text(), "the agent's log of the refusal")
    # No agent there.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        with pytest.raises(mujou.HostError, match=r"cannot be reached .*python -m mujou serve"):
            mujou.run(net, timer=vt(), processes={"g1": mujou.OnHost(net.left, address)})
        # A port that takes the connection and never answers: refused within the timeout.
        unused.listen()
        with pytest.raises(mujou.HostError, match=r"did not finish the handshake within 1 s"):
            mujou.run(net, timer=vt(), processes={"g1": mujou.OnHost(net.left, address, timeout=1.0)})
    # A node whose class the host cannot import (here: a module the run's host imported, then
    # removed from its disk) is refused as it is rebuilt there, naming it.
    (tmp_path / "gone_nodes.py").write_text(GONE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import gone_nodes  # type: ignore[import-not-found]  # written just above

    (tmp_path / "gone_nodes.py").unlink()
    local = gone_nodes.Lonely()
    with pytest.raises(TypeError, match=r"^node 'node' cannot be rebuilt in its process: .*gone_nodes"):
        mujou.run(local, timer=vt(), processes={"g1": mujou.OnHost(local.node, first.address)})
    first.wait_no_group_process()
    assert not [t for t in threading.enumerate() if t.name.startswith("mujou-life")]


GONE = """
import mujou


class Lonely(mujou.Net):
    def __init__(self) -> None:
        super().__init__()
        self.node = Quiet()


class Quiet(mujou.Node):
    def __init__(self) -> None:
        super().__init__(period=0.1)
"""


@pytest.mark.rule("hosts.arguments", "hosts.real-time")
def test_bad_on_host_arguments_are_refused() -> None:
    net = Chain()
    with pytest.raises(ValueError, match=r"^a host's address must be 'HOST:PORT'"):
        mujou.OnHost(net.left, "localhost")
    with pytest.raises(TypeError, match=r"^a host's address must be a str"):
        mujou.OnHost(net.left, 29400)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^timeout must be at least 0.5"):
        mujou.OnHost(net.left, "127.0.0.1:1", timeout=0.1)
    with pytest.raises(ValueError, match=r"^the run's secret must be at least 16 bytes"):
        mujou.OnHost(net.left, "127.0.0.1:1", secret="short")
    with pytest.raises(TypeError, match=r"^processes\['g'\] holds 'x'"):
        mujou.run(net, timer=vt(), processes={"g": mujou.OnHost("x", "127.0.0.1:1")})
    # Under the real-time timer, a port may not go between another host and a process of this
    # machine's own (hosts.real-time).
    mixed = {"g1": mujou.OnHost(net.left, "127.0.0.1:1"), "g2": net.right}
    with pytest.raises(
        ValueError,
        match=r"^output 'left.relay1.out' goes from process 'g1' to process 'g2', one on another host",
    ):
        mujou.run(net, processes=mixed)


@pytest.mark.rule("hosts.data-plane", "hosts.host-api")
def test_messages_cross_hosts_whole_in_order_and_latest_under_the_real_time_timer(
    hosts: tuple[LocalHost, LocalHost],
) -> None:
    first, _ = hosts
    net = Wire()
    # Each hop of the ping-pong is a message over the data plane.
    check_wire(net, {"rx": mujou.OnHost([net.checker, net.ponger], first.address)}, 200)
    # A reader on another host that stops reading (its process stopped) holds up no sender:
    # the sender sends all its messages, and once the reader goes on, it has the last one.
    limit = 3000
    stalls = Stalls(limit, "nest")
    with mujou.run(stalls, processes={"reader": mujou.OnHost(stalls.reader, first.address)}) as run:
        wait_until(lambda: run.read(stalls.reader.x) is not None, "the reader's first message")
        (pid,) = first.group_processes()
        with sigstopped(pid):
            wait_until(
                lambda: count_of(run.read(stalls.sender.out), "nest") == limit, "the sender's last message"
            )
        wait_until(lambda: count_of(run.read(stalls.reader.x), "nest") == limit, "the reader's last message")
    first.wait_no_group_process()


class ThreadLog(mujou.Node):
    """Triggered by ``a``: notes the thread each update runs on, and calls ``action``."""

    a = mujou.Input()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("a"), seed=0)
        self.threads: list[str] = []
        self.action: Any = None

    def on_update(self, dt: float) -> None:
        assert self.a.read() is not None
        self.threads.append(threading.current_thread().name)
        if self.action is not None:
            self.action()


@pytest.mark.rule("hosts.receiver-runs-updates")
def test_the_thread_that_receives_from_another_host_runs_the_update_the_message_makes_due(
    hosts: tuple[LocalHost, LocalHost],
) -> None:
    """The run's one worker is held by a ``Blocker`` and the host's thread waits in no call of
    the run: the reader's updates can then only run on the thread that received ``a``, where
    the run's calls that wait refuse it as from any hook."""
    first, _ = hosts
    sender, log, blocker = Sender(), ThreadLog(), Blocker()
    net = Bag(sender=sender, log=log, blocker=blocker)
    net.connect(sender.a, log.a)
    refused: list[str] = []
    processes = {"far": mujou.OnHost(sender, first.address)}
    with hang_guard(HANG_GUARD), mujou.run(net, workers=1, processes=processes) as run:

        def sleep_in_the_hook() -> None:
            try:
                run.sleep(0.0)
            except RuntimeError as exc:
                refused.append(str(exc))

        log.action = sleep_in_the_hook
        run.write(blocker.go, torch.zeros(1))
        try:
            assert blocker.inside.wait(HANG_GUARD), "the blocker never started"
            held = len(log.threads)
            wait_until(lambda: len(log.threads) >= held + 5, "the reader's updates while the worker is held")
        finally:
            blocker.release.set()
    assert set(log.threads[held : held + 5]) == {"mujou-plane-receive-sender.a"}
    assert refused and refused[0].startswith("run.sleep() cannot be called from a hook of node 'log'")
    first.wait_no_group_process()


class Kick(mujou.Node):
    """Triggered by the host's ``go``: sends a message."""

    go = mujou.Input(optional=True)
    out = mujou.Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("go"), seed=0)

    def on_update(self, dt: float) -> None:
        self.out.send(torch.zeros(3))


@pytest.mark.rule("hosts.receiver-runs-updates")
def test_an_update_the_receiving_thread_does_not_run_wakes_a_worker(
    hosts: tuple[LocalHost, LocalHost],
) -> None:
    """One message from another host makes two readers due: the thread that received it runs
    one, and a worker woken for it the other, at the same time (each waits in its update for
    the other to start); the host's thread waits in no call of the run."""
    first, _ = hosts
    kick, relay, one, two = Kick(), Relay(seed=1), ThreadLog(), ThreadLog()
    net = Bag(kick=kick, relay=relay, one=one, two=two)
    net.connect(kick.out, relay.x)
    net.connect(relay.out, one.a)
    net.connect(relay.out, two.a)
    both = threading.Barrier(2)
    one.action = two.action = partial(both.wait, HANG_GUARD / 2)
    processes = {"far": mujou.OnHost(relay, first.address)}
    with hang_guard(HANG_GUARD), mujou.run(net, workers=1, processes=processes) as run:
        run.write(kick.go, torch.zeros(1))
        wait_until(lambda: bool(one.threads and two.threads), "both readers' updates")
    assert sorted([*one.threads, *two.threads]) == ["mujou-plane-receive-relay.out", "mujou-worker-0"]
    first.wait_no_group_process()


@pytest.mark.rule("hosts.stats")
def test_stats_give_each_hosts_nodes_clock_offset_and_lateness(hosts: tuple[LocalHost, LocalHost]) -> None:
    first, second = hosts
    net = Chain()
    right = [net.right[0], net.right[1]]
    processes = {
        "g1": mujou.OnHost(net.left, first.address),
        "g2": mujou.OnHost(right[0], second.address),
        "g3": mujou.OnHost(right[1], second.address),  # the same agent: the same host
    }
    with mujou.run(net, processes=processes) as run:
        run.sleep(0.3)
        stats = run.stats()
    nodes = list(stats.nodes)
    assert list(stats.hosts) == ["", first.address, second.address]
    placed = {
        "": [name for name in nodes if not name.startswith(("left", "right"))],
        first.address: [name for name in nodes if name.startswith("left")],
        second.address: [name for name in nodes if name.startswith("right")],
    }
    for address, host in stats.hosts.items():
        assert (host.address, list(host.nodes)) == (address, placed[address])
        own = [stats.nodes[name] for name in host.nodes]
        assert host.lateness_p50 == max(node.lateness_p50 for node in own)
        assert host.lateness_p99 == max(node.lateness_p99 for node in own)
        assert host.lateness_max == max(node.lateness_max for node in own) >= 0.0
    # One machine's monotonic clock: the offset measured is within the round trips' noise.
    assert stats.hosts[""].clock_offset == 0.0
    assert all(abs(stats.hosts[a].clock_offset) < 0.5 for a in (first.address, second.address))
    # Under the virtual timer every lateness is 0.0; a run without other hosts has no hosts.
    with mujou.run(net, timer=vt(), processes={"g1": mujou.OnHost(net.left, first.address)}) as run:
        run.sleep(0.1)
        virtual = run.stats().hosts
    assert list(virtual) == ["", first.address]
    assert all(h.lateness_max == h.lateness_p99 == 0.0 for h in virtual.values())
    with mujou.run(Chain(), timer=vt()) as run:
        assert run.stats().hosts == {}
    first.wait_no_group_process()
    second.wait_no_group_process()


@pytest.mark.rule("hosts.torchrun")
def test_under_torchrun_rank_0_runs_the_program_and_rank_1_serves(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parent / "_torchrun_script.py"
    environ = checkout_environ(quiet=True)
    environ["PYTHONPATH"] = os.pathsep.join([environ["PYTHONPATH"], str(script.parent)])
    environ["MUJOU_SECRET"] = SECRET
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, "--log-dir", str(tmp_path), str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD + 20,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "rank 0: identical: True", done.stdout + done.stderr
    assert "rank 1" not in done.stdout  # rank 1 served, then ended before the program's end
    # Outside torchrun, serve_ranks does nothing, and a group placed on a rank cannot start.
    mujou.serve_ranks()
    net = Chain()
    with pytest.raises(
        RuntimeError, match=r"^mujou.OnHost\(rank=1\) needs the program to run under torchrun"
    ):
        mujou.run(net, timer=vt(), processes={"g1": mujou.OnHost(net.left, rank=1)})
