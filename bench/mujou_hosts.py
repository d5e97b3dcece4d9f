"""The workloads of several machines (``mujou.OnHost``), on loopback, and their references.

A "host" is an agent (``python -m mujou serve``) started here, reached over loopback TCP through
the same code as another machine; it is started once per measurement, before anything is timed.

- ``cross_host``: the hand-off of ``bench.mujou_processes`` (a sender every millisecond, a
  triggered reader), the sender on the other host: send to read over the Gloo data plane.
- ``gloo_handoff``: the reference: two processes and a bare ``torch.distributed`` Gloo group;
  every millisecond the sender stamps a float64 tensor of the same size and sends it, the
  receiver, blocked in its ``recv``, takes the time. No framework, no header, no thread
  hand-off.
- ``ray_actor_call``: issue 26's other reference, where Ray installs: a synchronous call of a
  Ray actor on a local Ray cluster (``ray.get(actor.take.remote(message))``) carrying a float64
  tensor of the same size, every millisecond; call to return, in µs. A hand-off across hosts
  should cost less than such a call.
- ``start_two_hosts``: the start of a run with one group on the other host (until
  ``mujou.run`` returned, the timers going) and its stop, the agent already running.
- ``tags_virtual_hosts``: the tags per second of ``bench.mujou_processes.tags_virtual`` with
  ``pong`` on the other host, beside the same net with ``pong`` in a process of this host.
- ``tcp_lockstep``: its reference: two processes in lockstep, as the floor's pipe lockstep of
  ``tags-virtual-2p`` (``bench.baselines.floor.tags_virtual``), one small message each way per
  tag over a loopback TCP connection (``TCP_NODELAY``), the other process a spawned one.

NOTE [ virtual tags across hosts: what the row compares ]
The row "virtual tags across two hosts ≥ 0.5× a bare two-process lockstep over TCP" compares
like with like: ``tcp_lockstep`` is two processes of this machine in lockstep over loopback
TCP, the transport the two "hosts" use. Its 0.10-0.12× (2026-12-04) is not a cost of the
hosts layer: the same Rally with ``pong`` in a process of this host runs as fast or slower
(``tags_virtual_hosts`` reports both: 2,987/s over two hosts, 2,702/s over two processes,
1.11×; another run 2,385/s and 3,030/s, 0.79×; ``tags-virtual-2p`` in the same minutes
2,309/s against its pipe floor's 41,066/s, 0.06×; load 3.6-3.9 on 2 cores). The earlier
0.64×/1.28× were that ratio, two hosts over two processes of one host. Counted (2026-12-04,
/proc's context switches and CPU time of every thread of the three processes, 2-3 s of
tags, load 2-3.5): 0.31-0.36 voluntary wake-ups a tag with the process layer's poll
(``_processes/_spin.py``), 1.94-1.97 with ``SPIN = 0`` at the same rate (2,558-2,689/s
against 2,713-3,007/s): the time is not in wake-ups but in CPU, 170-190 µs a tag in each
of the two processes' lockstep threads, spent one after the other (the wall time a tag is
their sum). Sampled (py-spy, ``SPIN = 0``), outside the blocking reads: the life line's
``Connection._send`` 13-17 % of each process's samples, the tag's command and reply
(``_processes._lockstep``, ``_group.Group.tag_reply``, ``_child._serve``, ``_codec``),
the update itself about 1 %. Cutting it is the process layer's per-tag protocol
(``mujou/_processes``), shared with ``tags-virtual-2p`` (target ≥ 20,000/s), not this layer.
"""

from __future__ import annotations

import datetime
import os
import secrets
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch._C._distributed_c10d import ProcessGroupGloo, TCPStore

import mujou

from ._common import CROSS_PERIOD, WARM_UP, Metrics, cross_metrics, micro, start_stop_metrics
from .baselines.floor import _VALUE, _volley, tag_rate
from .mujou_processes import Handoff, Rally, Ring, rally_tags

ROOT = Path(__file__).resolve().parent.parent


class Agent:
    """An agent on loopback, with a fresh secret (also in this process's MUJOU_SECRET)."""

    def __init__(self) -> None:
        os.environ["MUJOU_SECRET"] = secrets.token_hex(32)
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mujou", "serve", "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=environ,
            text=True,
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 120.0)
        line = self.process.stdout.readline() if ready else ""
        if not line.startswith("mujou agent listening on "):
            self.close()
            raise RuntimeError(f"the agent did not start: {line!r}")
        self.address = line.split()[-1]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cross_host(nbytes: int, seconds: float) -> Metrics:
    """The sender on the other host, the reader here: send to read, in µs."""
    with Agent() as agent:
        net = Handoff(nbytes)
        with mujou.run(net, workers=1, processes={"sender": mujou.OnHost(net.sender, agent.address)}) as run:
            run.sleep(WARM_UP + seconds)
        reader = net.reader
        return cross_metrics(reader.sent_at, reader.read_at, reader.keys, nbytes)


def _gloo_sender(port: int, nbytes: int, seconds: float) -> None:
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    group: Any = ProcessGroupGloo(store, 1, 2, datetime.timedelta(seconds=60))  # send: not in the stubs
    elements = max(2, nbytes // 8)
    count = 0
    end = time.monotonic() + WARM_UP + seconds
    while time.monotonic() < end:
        message = torch.empty(elements, dtype=torch.float64)
        message[1] = count
        count += 1
        message[0] = time.monotonic()
        group.send([message], 0, 0).wait()
        time.sleep(CROSS_PERIOD)
    message = torch.full((elements,), -1.0, dtype=torch.float64)
    group.send([message], 0, 0).wait()


def gloo_handoff(nbytes: int, seconds: float) -> Metrics:
    """A bare Gloo send/recv of a float64 tensor of ``nbytes``, every millisecond: send to
    receive, in µs."""
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=60))
    context = mp.get_context("spawn")
    sender = context.Process(target=_gloo_sender, args=(store.port, nbytes, seconds))
    sender.start()
    try:
        group: Any = ProcessGroupGloo(store, 0, 2, datetime.timedelta(seconds=60))  # recv: not in the stubs
        elements = max(2, nbytes // 8)
        message = torch.empty(elements, dtype=torch.float64)
        sent, read, keys = [], [], []
        while True:
            group.recv([message], 1, 0).wait()
            now = time.monotonic()
            if message[0] < 0:
                break
            read.append(now)
            sent.append(float(message[0]))
            keys.append(int(message[1]))
    finally:
        sender.join(60)
    return cross_metrics(sent, read, keys, nbytes)


def ray_actor_call(nbytes: int, seconds: float) -> Metrics:
    """A synchronous Ray actor call with a float64 tensor of ``nbytes``, every millisecond, on a
    local Ray cluster started here: call to return, in µs (the calls of the first
    ``WARM_UP`` seconds not counted)."""
    import ray  # the optional peer: imported only where this case runs

    class Taker:  # defined here, so that Ray's pickle takes it by value to the actor's process
        def take(self, message: torch.Tensor) -> float:
            return float(message[1])

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        actor: Any = ray.remote(num_cpus=0)(Taker).remote()  # its methods typed as plain ones
        elements = max(2, nbytes // 8)
        ray.get(actor.take.remote(torch.zeros(elements, dtype=torch.float64)), timeout=120)
        calls: list[float] = []
        count = 0
        began = time.monotonic()
        end = began + WARM_UP + seconds
        while (start := time.monotonic()) < end:
            message = torch.empty(elements, dtype=torch.float64)
            message[1] = count
            count += 1
            got: Any = ray.get(actor.take.remote(message), timeout=60)  # the actor's float
            if start >= began + WARM_UP:
                calls.append(time.monotonic() - start)
            if got != count - 1:
                raise RuntimeError(f"the actor answered {got}, not {count - 1}")
            time.sleep(CROSS_PERIOD)
    finally:
        ray.shutdown()
    return {"bytes": nbytes, "events": len(calls), "missed": 0, **micro(calls)}


def start_two_hosts(runs: int) -> Metrics:
    """``runs`` times: ``mujou.run`` with one group on the other host and one here (start: until
    it returns), 50 ms of running, then ``run.stop()`` (stop: until every process ended)."""
    starts: list[float] = []
    stops: list[float] = []
    with Agent() as agent:
        for _ in range(runs):
            net = Ring()
            nodes = list(net.nodes_)
            processes = {"there": mujou.OnHost(nodes[0], agent.address)}
            began = time.perf_counter()
            run = mujou.run(net, workers=1, timer=mujou.VirtualTimer(), processes=processes)
            starts.append(time.perf_counter() - began)
            run.sleep(0.05)
            began = time.perf_counter()
            run.stop()
            stops.append(time.perf_counter() - began)
    return start_stop_metrics(starts, stops)


def tags_virtual_hosts(seconds: float) -> Metrics:
    """Tags per second of wall time with ``pong`` on the other host, and in a process here."""
    with Agent() as agent:
        net = Rally()
        there, _ = rally_tags(seconds, net, {"pong": mujou.OnHost(net.pong, agent.address)})
    net = Rally()
    here, _ = rally_tags(seconds, net, {"pong": net.pong})
    return {"two_hosts_tags_per_second": there, "two_processes_tags_per_second": here, "ratio": there / here}


def _tcp_partner(port: int) -> None:
    """The other process of ``tcp_lockstep``: one update per value it gets, its value back."""
    torch.set_num_threads(1)
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        count = 0
        while data := connection.recv(_VALUE.size, socket.MSG_WAITALL):
            count += 1
            connection.sendall(_VALUE.pack(_volley(count, _VALUE.unpack(data)[0])))


def tcp_lockstep(seconds: float) -> Metrics:
    """Tags per second of two processes in lockstep, one TCP round trip on loopback per tag."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        partner = mp.get_context("spawn").Process(
            target=_tcp_partner, args=(server.getsockname()[1],), daemon=True
        )
        partner.start()
        server.settimeout(120.0)
        connection, _ = server.accept()
    connection.settimeout(None)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    count, theirs = 0, 0

    def tag() -> None:
        nonlocal count, theirs
        count += 1
        connection.sendall(_VALUE.pack(_volley(count, theirs)))
        theirs = _VALUE.unpack(connection.recv(_VALUE.size, socket.MSG_WAITALL))[0]

    with connection:
        rate = tag_rate(tag, seconds)
    partner.join(10.0)
    return {"two_hosts_tags_per_second": rate}


def describe() -> dict[str, Any]:
    return {"mujou": mujou.__version__}
