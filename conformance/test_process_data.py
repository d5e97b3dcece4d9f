"""Conformance tests for the page "Processes" (spec/en/processes.md): the data path between
the processes of a run and the host.

The host's calls on ports of other processes, what a run leaves behind once it ended
(descriptors, shared memory), the counting of messages a reader's process skipped, and a
helper thread's error. The nodes that run in processes of their own are in
``_data_nodes.py`` (spawned processes import them by name). Starting a process costs
seconds here, so each test checks several things in one run.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import threading
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from _data_nodes import BurstNet, EchoNet, FedNet, Pair, ShapeNet
from _support import HANG_GUARD, sigstopped, vt, wait_until

import mujou

HERE = Path(__file__).parent
RELEASE_LOOKS = 500  # looks for an ended run's descriptors to go: 5 s, far beyond any need
SUBPROCESS_LIMIT = 50.0  # seconds: a run with a process, in a new interpreter, under the hang guard


# --- helpers ------------------------------------------------------------------------------------


def descriptors() -> list[str]:
    """What this process's open descriptors are (their /proc/self/fd links), sorted."""
    found = []
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found.append(os.readlink(f"/proc/self/fd/{entry}"))
    return sorted(found)


def new_descriptors(before: list[str], *, collect: bool = True) -> list[str]:
    """The descriptors this process holds that it did not hold ``before`` (after a
    collection, which the run's own teardown does not need: it takes what a cycle might hold).
    Each pipe, socket and segment has a name of its own; one gone since is no concern here."""
    if collect:
        gc.collect()
    return sorted((Counter(descriptors()) - Counter(before)).elements())


def new_shared_memory(before: list[str]) -> list[str]:
    """The descriptors of torch's shared-memory segments among ``new_descriptors``."""
    return [link for link in new_descriptors(before) if "torch_" in link]


def child_pid(name: str) -> int:
    found = [p.pid for p in multiprocessing.active_children() if p.name == f"mujou-{name}"]
    assert len(found) == 1 and found[0] is not None, f"no single process mujou-{name}"
    return found[0]


def stopped(name: str) -> contextlib.AbstractContextManager[None]:
    """Process ``name`` of the run stopped (SIGSTOP), every thread of it, inside the block."""
    return sigstopped(child_pid(name))


def assert_left_as(before: list[str], what: str) -> None:
    """This process holds no descriptor it did not hold ``before``: nothing of an ended run.

    Looks again for up to ``RELEASE_LOOKS`` times 10 ms (a thread of the run may still be
    ending on a busy machine, holding its process's handle); what an ended run keeps stays."""
    pause = threading.Event()
    new = new_descriptors(before)
    for _ in range(RELEASE_LOOKS):
        if not new:
            return
        pause.wait(0.01)
        new = new_descriptors(before, collect=False)
    assert not new, f"{what}: {len(new)} descriptors this process did not hold before: {new}"


def has_message(run: mujou.Run, port: mujou.Input[Any]) -> bool:
    return run.read(port) is not None


skip_no_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")


# --- the host's calls on ports of other processes -----------------------------------------------


@skip_no_proc
@pytest.mark.rule("proc.host-api", "proc.cleanup")
def test_host_calls_on_ports_fed_by_another_process_and_what_an_ended_run_keeps() -> None:
    """Issue 23 #13, #15, #19, #8. A host node's input fed by another process:
    ``run.wait_for`` and ``run.subscribe`` work on it, and its ``source`` stays the net's
    output during the run (planted: the stand-in in Input.source: "is the class attribute"
    TypeError). A NamedTuple message read, waited for and subscribed to from the host keeps
    its class (planted: the state tree's copy in Member.read and the watch's forward: a
    plain tuple). Once the run ended, while its Run lives, the host holds none of its shared
    memory (planted: no teardown of the host's member in Processes.close: the rings the
    host read and wrote stay); and once the Run is gone, though the net lives, none of its
    descriptors, run after run (same plant: the forwarder on ``ticks.y`` keeps its ring and
    wake pipe)."""
    net = FedNet()
    start = descriptors()
    before: list[str] = []
    for attempt in range(2):
        run = mujou.run(net, processes={"counter": [net.counter, net.far]})
        with run:
            assert net.sink.x.source is net.counter.y
            assert run.wait_for(net.sink.x, lambda m: m.item() >= 2, timeout=HANG_GUARD).item() >= 2
            subscription = run.subscribe(net.sink.x)
            assert subscription.get(timeout=HANG_GUARD).item() >= 2
            subscription.close()
            pair = run.wait_for(net.counter.pair, lambda m: m.number >= 3, timeout=HANG_GUARD)
            assert type(pair) is Pair and pair.number >= 3
            assert type(run.read(net.counter.pair)) is Pair
            wait_until(partial(has_message, run, net.pairs.pair), "a message on the host's pairs.pair")
            assert type(run.read(net.pairs.pair)) is Pair  # the host's own reader
            with run.subscribe(net.counter.pair) as pairs:
                assert type(pairs.get(timeout=HANG_GUARD)) is Pair
            run.wait_for(net.far.x, lambda m: m.item() >= 2, timeout=HANG_GUARD)  # the host's ring
        assert net.sink.x.source is net.counter.y
        kept = new_shared_memory(start)
        assert not kept, f"shared memory kept by an ended run: {kept}"
        del run, subscription, pairs  # a subscription, closed or not, holds its run
        if attempt == 0:  # the first run starts what lives on (multiprocessing's helpers)
            gc.collect()
            before = descriptors()
        else:
            assert_left_as(before, "after a second run")


@pytest.mark.rule("proc.host-api", "proc.latest-value")
def test_wait_for_sees_every_reply_of_another_process() -> None:
    """Issue 23 #18 (S1): the host writes ``echo.x`` 1500 times and waits for each echo from
    another process with a generous timeout: every wait succeeds. The watch's reply (an older
    message) could overwrite on the host's mirror a newer message its events had brought, so
    the wait missed the echo (about 1 in 100-600 here). Planted: the reply always applied,
    with a 1 ms sleep before applying it (to widen the race): the test fails at once."""
    net = EchoNet()
    with mujou.run(net, processes={"echo": net.echo}) as run:
        for i in range(1, 1501):
            run.write(net.echo.x, torch.tensor([float(i)]))
            got = run.wait_for(net.echo.y, lambda m, i=i: m.item() == i, timeout=10.0)  # type: ignore[misc]
            assert got.item() == i


@pytest.mark.rule("proc.host-api")
def test_two_host_watches_of_one_port() -> None:
    """Issue 28 R07: two subscriptions of a port in another process; closing the first
    leaves the second getting every message (planted: a second watch does not count itself,
    so the first close removes the mirror under the second: it gets nothing more)."""
    net = FedNet()
    with mujou.run(net, timer=vt(), processes={"counter": net.counter}) as run:
        first = run.subscribe(net.counter.y)
        second = run.subscribe(net.counter.y)
        run.sleep(0.05)
        seen = [m.item() for m in first.drain()]
        assert seen == [m.item() for m in second.drain()] != []
        first.close()
        run.sleep(0.05)
        got = [m.item() for m in second.drain()]
        assert got == [seen[-1] + k for k in range(1, 6)], got  # five more updates, 10 ms apart
        second.close()


# --- latest value across processes ---------------------------------------------------------------


@pytest.mark.rule("proc.latest-value", "trigger.coalesced-stats", "trigger.coalesce")
def test_messages_a_reader_process_skipped_count_as_coalesced() -> None:
    """Issue 28 R08, R09. The reader's process is stopped while the host's node sends 50
    messages; once it runs again it publishes only the newest (the ring skips the others),
    and ``coalesced`` counts the 49 it never saw, as in one process (planted R08: a
    stand-in's number steps by 1: 0 coalesced). One message makes one arrival: a later
    message then makes exactly one more update (planted R09: the receiver republishes a
    slot it published (< for <=): each of the 49 later records of the burst makes an
    arrival, more updates)."""
    net = BurstNet()
    with mujou.run(net, processes={"reader": net.latest}) as run:

        def last() -> float:
            state = run.state_dict()["latest"]["last"]
            return float(state.item()) if state.numel() else 0.0

        run.write(net.burst.go, torch.tensor(1.0))
        wait_until(lambda: last() == 1, "the reader's update for message 1")
        with stopped("reader"):
            run.write(net.burst.go, torch.tensor(50.0))
            run.wait_for(net.burst.y, lambda m: m.item() == 51, timeout=HANG_GUARD)
            # Message 51 is visible here as its send begins writing it for the reader's
            # process: go on once the burst's update has returned.
            wait_until(lambda: net.burst.ended == 2, "the end of the burst's update")
        wait_until(lambda: last() == 51, "the reader's update after the burst")
        run.write(net.burst.go, torch.tensor(1.0))  # after every record of the burst (one pipe)
        wait_until(lambda: last() == 52, "the reader's update for message 52")
        stats = run.stats().nodes["latest"]
        assert (stats.updates, stats.coalesced) == (3, {"x": 49})


# --- what crosses: the codec, helper threads, a dead reader ---------------------------------------


@pytest.mark.rule("proc.state")
def test_a_quantized_tensor_in_a_state_tree_crosses_whole() -> None:
    """Issue 23 #9: a node's state holds a quantized tensor; the host's tree from its
    process dequantizes as in one process. In a subprocess, so that a crash fails the test
    (planted: the codec's fast path without its dtype check: the quantizer stays behind,
    and dequantize() crashes the host's process or gives wrong values)."""
    script = (
        "import torch, mujou\n"
        "from _data_nodes import QuantizedNet\n"
        "if __name__ == '__main__':\n"
        "    net = QuantizedNet()\n"
        "    with mujou.run(net, timer=mujou.VirtualTimer(), processes={'q': net.quantized}) as run:\n"
        "        weights = run.state_dict()['quantized']['weights']\n"
        "    print(weights.is_quantized, weights.dequantize().tolist())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_LIMIT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    assert done.stdout.split() == ["True", "[1.0,", "2.0,", "3.0]"], done.stdout


@pytest.mark.rule("run.internal-error", "proc.wake")
def test_an_error_of_the_receiver_thread_stops_the_run() -> None:
    """Issue 23 #10: the host runs out of descriptors while another process's node changes
    its layout at each update (each new ring's descriptor is fetched by the host's receiver
    thread): the run stops with MujouInternalError, which the host's next call raises
    (planted: the receiver returns on any OSError: the input freezes, nothing is raised)."""
    net = ShapeNet()
    run = mujou.run(net, processes={"shaper": net.shaper})
    try:
        run.wait_for(net.latest.x, timeout=HANG_GUARD)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest = os.dup(0)
        os.close(lowest)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))  # no new descriptor
        try:
            wait_until(lambda: not run.running, "the run to stop")
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        with pytest.raises(mujou.MujouInternalError) as raised:
            run.stop()
        # Out of descriptors: an OSError (EMFILE), or multiprocessing's RuntimeError for a
        # descriptor the kernel could not pass (no room for it here).
        assert isinstance(raised.value.__cause__, OSError | RuntimeError), raised.value.__cause__
    finally:
        with contextlib.suppress(mujou.MujouInternalError):
            run.stop()


@skip_no_proc
@pytest.mark.rule("proc.cleanup", "proc.latest-value")
def test_a_dead_reader_leaves_no_descriptor_in_the_sender() -> None:
    """Issue 23 #11: the reader's process is stopped while the host's node sends a new
    layout every 5 ms (each new ring announced on the wake pipe, whose descriptor the reader
    never fetches), then killed: once the run ended, the host holds what it held before
    (planted: the announcements' descriptors not taken back: about a hundred descriptors
    and segments left in the host)."""
    net = ShapeNet()
    with mujou.run(net, processes={"reader": net.latest}) as first:  # starts the helpers that live on
        first.wait_for(net.latest.x, lambda m: m.numel() > 3, timeout=HANG_GUARD)
    del first
    gc.collect()
    before = descriptors()
    run = mujou.run(net, processes={"reader": net.latest})
    with pytest.raises(mujou.ProcessError), run:
        run.wait_for(net.latest.x, lambda m: m.numel() > 3, timeout=HANG_GUARD)
        pid = child_pid("reader")
        os.kill(pid, signal.SIGSTOP)
        shaper = net.shaper
        wait_until(lambda: shaper.i > 200, "200 updates of the sender")  # plain reads of a counter
        os.kill(pid, signal.SIGKILL)
        run.join(timeout=HANG_GUARD)
    del run
    # Each announcement left unread held a descriptor of a segment: those are the point here
    # (a dead process's own handle, the Group's, may take a moment longer to go).
    kept = new_shared_memory(before)
    assert not kept, f"after a reader process died: {len(kept)} segments kept: {kept}"
