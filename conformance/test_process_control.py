"""Conformance tests for the end of a run with processes: deaths, interrupts, stopped
processes, failed starts and unpicklable replies (spec/en/processes.md: proc.died,
proc.cleanup, proc.interrupt, proc.copied, proc.state).

The nodes that run in processes are in ``_control_nodes.py`` (imported by name there). What
a test observes of a process goes through files under ``tmp_path``. Every test checks that no
process of the run is left; each blocking call is under a hang guard.
"""

from __future__ import annotations

import _thread
import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _control_nodes import Carrier, ExitsNormally, Gate, LockedState, Logged, Unloadable, log_of
from _support import HANG_GUARD, TEST_HANG_GUARD, Bag, hang_guard, is_dead, vt, wait_until

import mujou

CONFORMANCE = str(Path(__file__).parent)


def children() -> list[str]:
    """The names of this process's live child processes that a run started."""
    return sorted(p.name for p in multiprocessing.active_children() if p.name.startswith("mujou-"))


def pid_of(name: str) -> int:
    found = [p.pid for p in multiprocessing.active_children() if p.name == f"mujou-{name}"]
    assert len(found) == 1 and found[0] is not None, children()
    return found[0]


def is_stopped(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] == "T"


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """No process of a run before the test, and none after it (they are killed then)."""
    assert not children(), f"processes left by an earlier test: {children()}"
    yield
    left = children()
    for process in multiprocessing.active_children():
        if process.name.startswith("mujou-"):
            process.kill()
            process.join(HANG_GUARD)
    assert not left, f"processes of the run still alive: {left}"


def in_background(action: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=action, name="test-background", daemon=True)
    thread.start()
    return thread


def when_file(path: Path, action: Callable[[], None]) -> Callable[[], None]:
    """A background action: ``action()`` once ``path`` exists (nothing after HANG_GUARD)."""

    def wait_then_act() -> None:
        event = threading.Event()
        for _ in range(int(HANG_GUARD / 0.005)):
            if path.exists():
                action()
                return
            event.wait(0.005)

    return wait_then_act


# --- deaths ------------------------------------------------------------------------------------


@pytest.mark.rule("proc.died", "proc.cleanup")
def test_a_death_ends_the_run_whole_before_its_error_is_raised(tmp_path: Path, no_leftovers: None) -> None:
    """#5, #17: the dying process is listed first; when ``run.sleep`` raises its
    ProcessError, the run has ended and every other process had its on_stop and exited.
    Planted: ``send_each`` stopping at the first dead group (#5), and ``settle`` doing
    nothing (#17): each fails here."""
    doomed, later, home = tmp_path / "doomed", tmp_path / "later", tmp_path / "home"
    net: Any = Bag(doomed=Logged(str(doomed), "kill", 3), later=Logged(str(later)), home=Logged(str(home)))
    run = mujou.run(net, timer=vt(), processes={"doomed": net.doomed, "later": net.later})
    with hang_guard(HANG_GUARD):
        try:
            with pytest.raises(mujou.ProcessError) as info:
                run.sleep(3.0)
            running, left = run.running, children()
            later_log, home_log = log_of(later), log_of(home)
        finally:
            with contextlib.suppress(mujou.ProcessError):
                run.stop()
    assert not running and left == [], (running, left)
    assert later_log[-1] == "stop" and later_log.count("stop") == 1, later_log
    assert home_log[-1] == "stop", home_log
    assert log_of(later) == later_log  # no update after the run ended
    error = info.value
    assert (error.process, error.exitcode, error.nodes, error.stopped) == ("doomed", -9, ("doomed",), False)
    assert "stopped without on_stop" in str(error), error
    assert log_of(doomed).count("update") == 3 and "stop" not in log_of(doomed)


@pytest.mark.rule("proc.died", "proc.cleanup", "proc.virtual")
def test_a_process_killed_between_two_tags_is_seen_without_an_end_of_file(
    tmp_path: Path, no_leftovers: None
) -> None:
    """#1, #3: process ``b`` (the second) dies after it answered a tag, while the host runs its
    part of it, and a process it forked keeps its connections open: no end of file comes.
    The next tag finds it dead by its exit, ``run.sleep`` raises ProcessError, and leaving
    the block does not hang. Planted: today's main, which sees a death only as an end of
    file: the next tag's send succeeds and its receive waits for ever (HangError)."""
    a, b = tmp_path / "a", tmp_path / "b"
    net: Any = Bag(gate=Gate(at=3), a=Logged(str(a)), b=Logged(str(b), "vanish", 3))
    run = mujou.run(net, timer=vt(), processes={"a": net.a, "b": net.b})
    target = pid_of("b")

    def release_when_b_died() -> None:
        if net.gate.entered.wait(HANG_GUARD):
            wait_until(lambda: is_dead(target), "b to die")
            net.gate.release.set()

    in_background(release_when_b_died)
    holder = Path(f"{b}.holder")
    try:
        with hang_guard(HANG_GUARD), pytest.raises(mujou.ProcessError) as info, run:
            run.sleep(3.0)
    finally:
        if holder.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(holder.read_text()), signal.SIGKILL)
    assert info.value.process == "b" and info.value.exitcode == -9
    assert not run.running and children() == []
    assert log_of(a)[-1] == "stop" and net.gate.stopped
    assert log_of(b).count("update") == 3


# --- interrupts ---------------------------------------------------------------------------------


@pytest.mark.rule("run.interrupt", "proc.stopped", "proc.cleanup")
def test_an_interrupt_in_the_hosts_part_of_a_tag_leaves_the_block_cleanly(
    tmp_path: Path, no_leftovers: None
) -> None:
    """#1: ``interrupt_main()`` while the host's node runs its update of a tag; leaving the
    block stops every process. Planted: today's main, whose stop waits for ever on the
    command lock the interrupted tag left held (HangError instead of KeyboardInterrupt)."""
    far = tmp_path / "far"
    net: Any = Bag(gate=Gate(at=3, hold=1.0), far=Logged(str(far)))
    run = mujou.run(net, timer=vt(), processes={"far": net.far})

    def interrupt() -> None:
        if net.gate.entered.wait(HANG_GUARD):
            _thread.interrupt_main()

    in_background(interrupt)
    with hang_guard(HANG_GUARD), pytest.raises(KeyboardInterrupt), run:
        run.sleep(5.0)
    assert not run.running and children() == []
    assert log_of(far)[-1] == "stop" and net.gate.stopped


@pytest.mark.rule("run.interrupt", "proc.stopped", "proc.cleanup")
def test_an_interrupt_while_the_host_waits_for_a_process_is_seen_at_once(
    tmp_path: Path, no_leftovers: None
) -> None:
    """#4: the process's update blocks until the test lets it go on; ``interrupt_main()``
    meanwhile raises KeyboardInterrupt in ``run.sleep`` before that update finished (seen by
    a file, not a clock), and the run then goes on and stops cleanly: on_stop in the
    process, no ProcessError. Planted: a host wait on the reply that does not look every
    poll (a plain ``Event.wait()``): the interrupt is seen only after the update finished."""
    far = tmp_path / "far"
    net: Any = Bag(far=Logged(str(far), "block", 3))
    run = mujou.run(net, timer=vt(), processes={"far": net.far})
    in_background(when_file(Path(f"{far}.entered"), _thread.interrupt_main))
    with hang_guard(HANG_GUARD), run:
        with pytest.raises(KeyboardInterrupt):
            run.sleep(5.0)
        finished_before = Path(f"{far}.finished").exists()
        Path(f"{far}.go").touch()
        run.sleep(0.5)  # the protocol is whole: the run goes on
        updates = len(log_of(far))
    assert not finished_before
    assert updates >= 8 and log_of(far)[-1] == "stop" and log_of(far).count("stop") == 1
    assert children() == []


# --- starts that fail ---------------------------------------------------------------------------


@pytest.mark.rule("proc.copied", "proc.cleanup")
def test_a_process_that_cannot_rebuild_its_nodes_fails_the_start_whole(
    tmp_path: Path, no_leftovers: None
) -> None:
    """#2: the healthy process has a dedicated_thread node; the other cannot rebuild its node.
    ``mujou.run`` raises the rebuild error, and no process is left. Planted: ``Engine.abort``
    of an unstarted engine leaving its policy running (today's main): the healthy process's
    final state waits for a thread that never started, and ``mujou.run`` hangs (on today's
    main), or the process is killed after the grace period (here): no file of its exit."""
    good = tmp_path / "good"
    net: Any = Bag(good=ExitsNormally(str(good), dedicated_thread=True), bad=Carrier(Unloadable()))
    # Two processes start and end here: slow on a busy machine, and a hang is for ever.
    with (
        hang_guard(TEST_HANG_GUARD - 5),
        pytest.raises(TypeError, match="'bad' cannot be rebuilt in its process"),
    ):
        mujou.run(net, timer=vt(), processes={"good": net.good, "bad": net.bad})
    assert children() == []
    assert not good.exists()  # no hook ran
    assert Path(f"{good}.exited").exists()  # it ended by itself: not killed after a grace period


# --- stopped processes --------------------------------------------------------------------------


@pytest.mark.rule("proc.stopped", "proc.cleanup")
def test_a_process_stopped_by_a_signal_is_waited_for_interruptibly_and_killed_by_the_stop(
    tmp_path: Path, no_leftovers: None
) -> None:
    """#3 and the rule on SIGSTOP: ``run.stats()`` waits for the stopped process, and an
    interrupt leaves that wait with the protocol whole (it works again once the process goes
    on); ``run.stop()`` kills the process after the grace period and raises ProcessError.
    Planted: ``_end_groups`` waiting for the stop's reply without a bound: the stop hangs."""
    frozen, other = tmp_path / "frozen", tmp_path / "other"
    net: Any = Bag(frozen=Logged(str(frozen), "sigstop", 3), other=Logged(str(other)))
    run = mujou.run(net, processes={"frozen": net.frozen, "other": net.other})
    target = pid_of("frozen")
    with hang_guard(HANG_GUARD):
        wait_until(lambda: is_stopped(target), "the process to stop itself")
        timer = threading.Timer(0.3, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            run.stats()  # waits for the stopped process, until interrupted
        timer.join()
        os.kill(target, signal.SIGCONT)
        assert run.stats().nodes["frozen"].updates >= 3  # the protocol is whole
        wait_until(lambda: log_of(frozen).count("update") >= 4, "the process to go on")
        os.kill(target, signal.SIGSTOP)
        wait_until(lambda: is_stopped(target), "the process to stop")
    with hang_guard(HANG_GUARD), pytest.raises(mujou.ProcessError) as info:
        run.stop()
    assert is_dead(target) and children() == []
    error = info.value
    assert error.process == "frozen" and error.exitcode == -9, error
    assert "did not stop within" in str(error), error
    assert log_of(other)[-1] == "stop" and "stop" not in log_of(frozen)
    assert not run.running


AT_EXIT = """
import multiprocessing, sys
sys.path[:0] = {path!r}
import mujou
from _control_nodes import Logged
from _support import Bag

net = Bag(frozen=Logged({log!r}, "sigstop", 3))
run = mujou.run(net, processes={{"frozen": net.frozen}})
run.sleep(1.0)
with open({pids!r}, "w") as file:
    file.write(" ".join(str(p.pid) for p in multiprocessing.active_children() if p.name.startswith("mujou-")))
# The program ends without stopping the run; its process is stopped by a signal.
"""


@pytest.mark.rule("proc.stopped", "proc.cleanup", "run.exit-stops")
def test_the_interpreter_exits_when_a_process_of_the_run_is_stopped(tmp_path: Path) -> None:
    """#3 at exit: a program that returns without stopping its run, one of whose processes
    stopped itself with SIGSTOP, exits, and that process is gone. Planted: ``_close_live``
    without the bounded teardown (today's main): the interpreter's exit hangs."""
    pids = tmp_path / "pids"
    script = AT_EXIT.format(path=[CONFORMANCE, *sys.path], log=str(tmp_path / "frozen"), pids=str(pids))
    found: list[int] = []
    try:
        with (tmp_path / "stderr").open("w") as stderr:
            result = subprocess.run(
                [sys.executable, "-c", script],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                timeout=TEST_HANG_GUARD - 5,  # a start, 10 s of grace and an end: slow here
                check=False,
            )
        found = [int(pid) for pid in pids.read_text().split()]
        assert result.returncode == 0, (tmp_path / "stderr").read_text()
        assert len(found) == 1
        wait_until(lambda: is_dead(found[0]), "the stopped process to be gone")
    finally:
        if not found and pids.exists():
            found = [int(pid) for pid in pids.read_text().split()]
        for pid in found:  # after a failure: no orphan left behind
            if not is_dead(pid):
                os.kill(pid, signal.SIGKILL)
    assert "stop" not in log_of(tmp_path / "frozen")


# --- what cannot be pickled ---------------------------------------------------------------------


@pytest.mark.rule("proc.state", "proc.copied")
def test_what_cannot_cross_is_a_clear_error_and_the_run_goes_on(tmp_path: Path, no_leftovers: None) -> None:
    """#12 and S9: a state_dict holding a lock, and a ``run.write`` of a value the process
    cannot unpickle, each raise an error naming the command and the type; the process lives,
    the run goes on and stops cleanly. Planted: pickling the reply outside the try in the
    process (today's main): the process dies, and a ProcessError says its nodes stopped
    without on_stop."""
    far = tmp_path / "far"
    net: Any = Bag(far=LockedState(str(far)))
    run = mujou.run(net, timer=vt(), processes={"far": net.far})
    with hang_guard(HANG_GUARD), run:
        run.sleep(0.3)
        before = run.stats().nodes["far"].updates
        with pytest.raises(TypeError) as info:
            run.state_dict()
        message = str(info.value)
        assert "'state'" in message and "lock" in message, message
        with pytest.raises(TypeError) as info:
            run.write(net.far.x, Unloadable())
        message = str(info.value)
        assert "'write'" in message and "cannot be unpickled" in message, message
        run.sleep(0.3)
        updates = run.stats().nodes["far"].updates
    assert updates == before + 3, (before, updates)
    assert log_of(far)[-1] == "stop" and log_of(far).count("update") == updates
    assert children() == []


# --- hook errors --------------------------------------------------------------------------------


@pytest.mark.rule("proc.cleanup", "proc.hook-error")
@pytest.mark.parametrize("virtual", [True, False])
def test_a_run_that_failed_in_a_hook_ends_its_processes_without_stop(
    virtual: bool, tmp_path: Path, no_leftovers: None
) -> None:
    """#16: the host's node raises; the HookError is raised, and every process of the run
    stops its nodes and exits, without ``run.stop()``: under the virtual timer before the
    error is raised, under the real-time timer soon after. Planted: no teardown when the
    host's engine ends (``go`` not adding the waker): the processes live until stop(). S8:
    the nodes of the processes are free when the processes have ended (planted: no
    ``_release_nodes``, and the second run raises "in a run that has not ended")."""
    far = tmp_path / "far"
    net: Any = Bag(home=Logged(str(tmp_path / "home"), "raise", 3), far=Logged(str(far)))
    run = mujou.run(net, timer=vt() if virtual else None, processes={"far": net.far})
    with hang_guard(HANG_GUARD):
        with pytest.raises(mujou.HookError):
            run.sleep(3.0)
            run.join(timeout=3.0)
        if virtual:
            assert children() == []
        wait_until(lambda: not children(), "the processes to exit")
        assert log_of(far)[-1] == "stop"
        assert not run.running
        assert run.state_dict()["far"]["updates"] >= 2  # kept from the end
        if virtual:  # S8: the net may run again before stop(), as in one process
            with mujou.run(net, timer=vt()) as again:
                again.sleep(0.1)
        with pytest.raises(mujou.HookError):
            run.stop()
