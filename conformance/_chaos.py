"""One chaos trial: a random small net with processes, one fault at a random moment, and the
checks of what a run must leave behind (proc.died, proc.cleanup, proc.hook-error,
run.interrupt, run.hook-error, run.start-error, run.start-undone, run.internal-error).

``python -c 'import _chaos, sys; sys.exit(_chaos.main(sys.argv[1:]))' SEED WORKDIR`` (with
this directory on ``sys.path``) runs trial SEED in a process of its own, as
conformance/test_chaos.py does: a hang or a crash then fails the trial, never the caller. The
trial's plan (net, placement, timer, fault, moment) is drawn from ``random.Random(SEED)``, so
the same seed plans the same trial; when the fault lands in real time varies. Its last line on
stdout is ``CHAOS-RESULT`` and a JSON object: the plan, the outcome (what the host's calls
raised) and the problems found (none: exit status 0). ``faulthandler`` dumps every thread's
stack and ends the process if the trial runs past ``TRIAL_BOUND``.

The nodes are in this module, at the top level: the run's processes are spawned and import
them by name. Each node appends a line to ``WORKDIR/<run>/<node>.log`` when its ``on_start``
has returned and when its ``on_stop`` ran, with its process id: the hooks of a node in
another process leave their trace where the host can count them even if that process died.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import faulthandler
import gc
import json
import multiprocessing
import os
import random
import resource
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

import mujou
from mujou import Input, Net, Node, Output

# Bounds for hangs, not for speed: a busy machine starts a process (a new interpreter that
# imports torch) in seconds, and a stop may wait out EXIT_GRACE (10 s) for a process.
TRIAL_BOUND = 150.0  # real seconds a whole trial may take; past it faulthandler ends it
CALL_BOUND = 60.0  # real seconds one host call may take
SETTLE = 5.0  # real seconds given to descriptors, processes and /dev/shm entries to go

FAULTS = (
    "kill",  # SIGKILL of a process of the run: ProcessError (proc.died)
    "sigstop",  # SIGSTOP of a process, SIGCONT a moment later: the run goes on
    "sigstop-stop",  # SIGSTOP of a process, then run.stop(): it returns (proc.cleanup)
    "raise-child",  # on_update raises in another process: HookError (proc.hook-error)
    "raise-host",  # on_update raises in the host's process: HookError (run.hook-error)
    "raise-child-start",  # on_start raises in another process: mujou.run raises HookError
    "raise-host-start",  # on_start raises in the host's process: mujou.run raises HookError
    "unpicklable-error",  # on_update raises an exception that cannot be pickled (proc.hook-error)
    "unpicklable-state",  # a node's state_dict in another process cannot be pickled
    "interrupt",  # _thread.interrupt_main() while the host waits: KeyboardInterrupt (run.interrupt)
    "fd-limit",  # RLIMIT_NOFILE of the host lowered to what is open for a moment
    "exit-on-start",  # a process's node calls os._exit in on_start: mujou.run fails
)


# --- the nodes ------------------------------------------------------------------------------


class UnpicklableError(Exception):
    """An exception that cannot be pickled: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class Logged(Node):
    """A node that logs its started and stopped hooks to a file and fails as ``fault`` says.

    ``fault`` is None or ``(kind, k)``: "raise" / "unpicklable-error" in its update number k,
    "raise-start" / "exit-start" in on_start, "unpicklable-state" from its update number k on.
    """

    def __init__(
        self, logdir: str, fault: tuple[str, int] | None, *, period: float | None, trigger: Any = None
    ) -> None:
        super().__init__(period=period, trigger=trigger)
        self.logdir = logdir
        self.fault = fault
        self.count = 0
        self._log = -1  # the log file's descriptor, open from on_start to on_stop

    def _write(self, what: str) -> None:
        os.write(self._log, f"{what} {os.getpid()}\n".encode())

    def on_start(self) -> None:
        if self.fault == ("raise-start", 0):
            raise ValueError(f"{self.name} fails to start")
        if self.fault == ("exit-start", 0):
            os._exit(3)
        self.count = 0
        self._log = os.open(Path(self.logdir) / f"{self.name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._write("start")

    def on_stop(self) -> None:
        if self._log < 0:  # no on_stop without an on_start: the log says so
            self._log = os.open(Path(self.logdir) / f"{self.name}.log", os.O_WRONLY | os.O_APPEND)
        self._write("stop")
        os.close(self._log)
        self._log = -1

    def step(self) -> None:
        """Count the update; fail in it if the fault says so."""
        self.count += 1
        if self.fault is None or self.count != self.fault[1]:
            return
        if self.fault[0] == "raise":
            raise ValueError(f"{self.name} fails at update {self.count}")
        if self.fault[0] == "unpicklable-error":
            raise UnpicklableError(f"{self.name} fails unpicklably at update {self.count}")

    def state_dict(self) -> dict[str, Any]:
        state = {"count": self.count}
        if self.fault is not None and self.fault[0] == "unpicklable-state" and self.count >= self.fault[1]:
            return {**state, "lock": threading.Lock()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.count = state["count"]


class Source(Logged):
    """Periodic: sends its update count; the message's size changes every 10th update, so
    that its transport to another process makes a new ring (new shared memory) now and then."""

    out = Output()

    def __init__(self, logdir: str, fault: tuple[str, int] | None, period: float) -> None:
        super().__init__(logdir, fault, period=period)

    def on_update(self, dt: float) -> None:
        self.step()
        self.out.send(torch.full((4 + self.count // 10 % 2,), float(self.count)))


class Relay(Logged):
    """Triggered by ``x``: sends it on, plus one."""

    x = Input()
    out = Output()

    def __init__(self, logdir: str, fault: tuple[str, int] | None) -> None:
        super().__init__(logdir, fault, period=None, trigger=mujou.on("x"))

    def on_update(self, dt: float) -> None:
        self.step()
        message = self.x.read()
        assert message is not None  # triggered by it
        self.out.send(message + 1.0)


class Sink(Logged):
    """Periodic: reads its optional input."""

    x = Input(optional=True)

    def __init__(self, logdir: str, fault: tuple[str, int] | None, period: float) -> None:
        super().__init__(logdir, fault, period=period)

    def on_update(self, dt: float) -> None:
        self.step()
        self.x.read()


Descriptors = dict[str, str]  # a process's open descriptors: number -> what it is


class ChaosNet(Net):
    """The net of a trial: nodes set by name from its plan."""


# --- the plan ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one seed draws: the net, the placement, the timer, the fault and its moment."""

    seed: int
    kinds: dict[str, str]  # node name -> "source" | "relay" | "sink", in registration order
    periods: dict[str, float]
    wires: list[tuple[str, str]]  # (writer, reader)
    groups: dict[str, list[str]]  # process name -> its nodes; the others are the host's
    virtual: bool
    workers: int | None
    fault: str
    target: str  # the node (hook faults) or the process (signals) the fault is aimed at
    update: int  # the update number a hook fault happens in
    delay: float  # real seconds after the run started that a signal or an interrupt comes
    hold: float  # real seconds a SIGSTOP or a low descriptor limit lasts

    @property
    def host_nodes(self) -> list[str]:
        placed = {name for names in self.groups.values() for name in names}
        return [name for name in self.kinds if name not in placed]


HOST_FAULTS = ("raise-host", "raise-host-start")
NODE_FAULTS = ("raise-child", "raise-child-start", "unpicklable-error", "unpicklable-state", "exit-on-start")
SIGNALS = ("kill", "sigstop", "sigstop-stop")


def plan(seed: int) -> Plan:
    """The trial of ``seed``: 2 to 6 nodes, 1 or 2 processes besides the host's, a timer, a fault."""
    rng = random.Random(seed)
    fault = FAULTS[seed % len(FAULTS)]  # any len(FAULTS) seeds in a row try every fault
    kinds: dict[str, str] = {}
    wires: list[tuple[str, str]] = []
    writers: list[str] = []
    for i in range(rng.randint(1, 2)):
        kinds[f"source{i}"] = "source"
        writers.append(f"source{i}")
    for i in range(rng.randint(0, 2)):
        wires.append((rng.choice(writers), f"relay{i}"))
        kinds[f"relay{i}"] = "relay"
        writers.append(f"relay{i}")
    for i in range(rng.randint(2 - len(kinds) if len(kinds) < 2 else 0, 2)):
        kinds[f"sink{i}"] = "sink"
        if rng.random() < 0.8:
            wires.append((rng.choice(writers), f"sink{i}"))
    periods = {name: rng.choice([0.005, 0.01, 0.02, 0.05]) for name, kind in kinds.items() if kind != "relay"}
    names = list(kinds)
    rng.shuffle(names)
    target = names.pop() if fault in HOST_FAULTS else ""  # the host keeps it
    groups: dict[str, list[str]] = {f"p{g}": [names.pop()] for g in range(rng.randint(1, min(2, len(names))))}
    for name in names:  # the others: the host's, or a group's
        where = rng.choice([None, *groups])
        if where is not None:
            groups[where].append(name)
    if fault in NODE_FAULTS:
        target = rng.choice([name for names_ in groups.values() for name in names_])
    elif fault in SIGNALS:
        target = rng.choice(sorted(groups))
    return Plan(
        seed=seed,
        kinds=kinds,
        periods=periods,
        wires=wires,
        groups=groups,
        virtual=rng.random() < 0.5,
        workers=rng.choice([1, 2, None]),
        fault=fault,
        target=target,
        update=rng.randint(1, 4),
        delay=rng.uniform(0.0, 0.6),
        hold=rng.uniform(0.02, 0.5),
    )


def node_fault(plan: Plan, name: str) -> tuple[str, int] | None:
    """The fault of node ``name`` in its hooks, if the plan aims one at it."""
    if name != plan.target:
        return None
    hook_faults = {
        "raise-child": ("raise", plan.update),
        "raise-host": ("raise", plan.update),
        "unpicklable-error": ("unpicklable-error", plan.update),
        "unpicklable-state": ("unpicklable-state", 1),
        "raise-child-start": ("raise-start", 0),
        "raise-host-start": ("raise-start", 0),
        "exit-on-start": ("exit-start", 0),
    }
    return hook_faults.get(plan.fault)


def build(plan: Plan, logdir: Path) -> tuple[ChaosNet, dict[str, list[Node]]]:
    """The plan's net, its nodes logging to ``logdir``, and its ``processes=``."""
    net = ChaosNet()
    nodes: dict[str, Source | Relay | Sink] = {}
    for name, kind in plan.kinds.items():
        fault = node_fault(plan, name)
        if kind == "source":
            nodes[name] = Source(str(logdir), fault, plan.periods[name])
        elif kind == "relay":
            nodes[name] = Relay(str(logdir), fault)
        else:
            nodes[name] = Sink(str(logdir), fault, plan.periods[name])
        setattr(net, name, nodes[name])
    for writer_name, reader_name in plan.wires:
        writer, reader = nodes[writer_name], nodes[reader_name]
        assert isinstance(writer, Source | Relay) and isinstance(reader, Relay | Sink)
        net.connect(writer.out, reader.x)
    return net, {group: [nodes[name] for name in names] for group, names in plan.groups.items()}


# --- what a run leaves behind ---------------------------------------------------------------


def descriptors() -> Descriptors:
    """This process's open descriptors (number -> what it is), but those of multiprocessing's
    helpers (the resource tracker, a fork server, the resource sharer's listener, which the
    first ring a real-time run hands to another process starts), which outlive a run by design."""
    from multiprocessing import forkserver, resource_sharer, resource_tracker

    listener = getattr(getattr(resource_sharer, "_resource_sharer", None), "_listener", None)
    socket = getattr(getattr(listener, "_listener", None), "_socket", None)
    helpers = {
        getattr(resource_tracker._resource_tracker, "_fd", None),
        getattr(forkserver._forkserver, "_forkserver_alive_fd", None),
        None if socket is None else socket.fileno(),
    }
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        if fd not in {str(h) for h in helpers if h is not None}:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                found[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return found


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def children() -> dict[int, str]:
    """This process's child processes but the helpers that outlive a run by design (the
    resource tracker, a fork server, multiprocessing's or Mujou's): pid -> state. A process
    that a fork server started is not a child: ``Trial.pids`` has it."""
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        helper = b"resource_tracker" in cmdline or b"forkserver" in cmdline
        if int(fields[1]) == me and not helper:
            found[int(entry)] = fields[0]
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def settle(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within SETTLE seconds (polled)."""
    end = time.monotonic() + SETTLE
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def hook_log(logdir: Path, name: str) -> tuple[int, int, set[int]]:
    """How many times node ``name`` started and stopped, and in which processes."""
    path = logdir / f"{name}.log"
    lines = path.read_text().split() if path.exists() else []
    words = list(zip(lines[::2], lines[1::2], strict=True))
    return (
        sum(1 for what, _ in words if what == "start"),
        sum(1 for what, _ in words if what == "stop"),
        {int(pid) for _, pid in words},
    )


# --- one trial --------------------------------------------------------------------------------


class Trial:
    """Runs a plan's faulty run and checks what it leaves behind; ``problems`` says what failed."""

    def __init__(self, plan: Plan, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.problems: list[str] = []
        self.outcome: list[str] = []  # what each host call raised, in order ("" for nothing)
        self.dead: set[str] = set()  # the processes the fault ended
        self.pids: dict[str, int] = {}
        self.fired = threading.Event()
        self.in_call = threading.Event()  # the host's thread is in a call of the run
        self.stopped = threading.Event()  # the injector stopped the run (sigstop-stop)

    def timed(self, what: str, call: Callable[[], object]) -> BaseException | None:
        """Run one host call; note what it raised, and a problem if it took past CALL_BOUND."""
        began = time.monotonic()
        error: BaseException | None = None
        try:
            self.in_call.set()
            try:
                call()
            finally:
                self.in_call.clear()
        except BaseException as exc:  # KeyboardInterrupt included: it is one of the outcomes
            error = exc
        took = time.monotonic() - began
        if took > CALL_BOUND:
            self.problems.append(f"{what} took {took:.1f} s (bound {CALL_BOUND} s)")
        said = f"{what}: {type(error).__name__ if error else 'ok'}"
        if self.outcome and self.outcome[-1].split(" x")[0] == said:  # "run.sleep: ok x12"
            count = int(self.outcome[-1].split(" x")[1]) if " x" in self.outcome[-1] else 1
            self.outcome[-1] = f"{said} x{count + 1}"
        else:
            self.outcome.append(said)
        return error

    def expect(
        self, error: BaseException | None, allowed: tuple[type[BaseException], ...], what: str
    ) -> None:
        if error is not None and not isinstance(error, allowed):
            text = "".join(traceback.format_exception(error))[-1500:]
            self.problems.append(f"{what} raised {type(error).__name__}, not one of {allowed}: {text}")

    def run(self) -> None:
        plan = self.plan
        logdir = self.workdir / "faulty"
        logdir.mkdir()
        net, processes = build(plan, logdir)
        timer = mujou.VirtualTimer() if plan.virtual else mujou.RealTimeTimer()
        shm_before = shm_entries()
        fds_before = descriptors()
        run_holder: list[mujou.Run] = []
        error = self.timed(
            "mujou.run",
            lambda: run_holder.append(mujou.run(net, timer=timer, processes=processes, workers=plan.workers)),
        )
        start_fault = plan.fault in ("raise-child-start", "raise-host-start", "exit-on-start")
        if start_fault:
            wanted: type[BaseException] = (
                mujou.ProcessError if plan.fault == "exit-on-start" else mujou.HookError
            )
            if error is None:
                self.problems.append(f"mujou.run returned despite {plan.fault}")
            else:
                self.expect(error, (wanted,), "mujou.run")
            if plan.fault == "exit-on-start":
                self.dead.add(next(g for g, names in plan.groups.items() if plan.target in names))
        elif error is not None:
            self.expect(error, (), "mujou.run")
        if run_holder:
            self.drive(run_holder[0], logdir)
        run_holder.clear()  # done with it, as a program is
        self.find_pids(logdir)  # a process of a failed start is in its nodes' logs
        self.check_hooks(logdir, fault_run=True)
        self.check_left(shm_before, fds_before, "after the faulty run")
        self.run_again(net, processes, shm_before, fds_before)

    def find_pids(self, logdir: Path) -> None:
        """The process id of each group: from multiprocessing, else from its nodes' logs."""
        for group, names in self.plan.groups.items():
            found = [p.pid for p in multiprocessing.active_children() if p.name == f"mujou-{group}"]
            logged = {pid for name in names for pid in hook_log(logdir, name)[2]}
            for pid in (*found, *logged):
                if pid is not None and pid != os.getpid():
                    self.pids[group] = pid

    def drive(self, run: mujou.Run, logdir: Path) -> None:
        """The host's calls while the fault comes; then the end of the run."""
        plan = self.plan
        self.find_pids(logdir)
        injector = threading.Thread(target=self.inject, args=(run,), name="chaos-injector", daemon=True)
        injector.start()
        try:
            self.calls(run)
        finally:
            injector.join(CALL_BOUND)
            if injector.is_alive():
                self.problems.append("the injector thread did not end")
            error = self.timed("run.stop", run.stop)
            self.expect_end(error, "run.stop")
            if plan.fault in ("sigstop", "sigstop-stop") and plan.target in self.pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pids[plan.target], signal.SIGCONT)

    def step(self, run: mujou.Run) -> Callable[[], object]:
        plan = self.plan
        if plan.virtual:
            return lambda: run.sleep(0.05)
        return lambda: run.sleep(0.02)

    def calls(self, run: mujou.Run) -> None:
        """The host's calls: steps of time, a state and stats now and then, until the fault
        came and was seen, or the run has run long enough for it."""
        plan = self.plan
        rng = random.Random(plan.seed + 1)
        end = time.monotonic() + plan.delay + plan.hold + 2.0
        seen: BaseException | None = None
        after_interrupt = False
        refused = 0  # the states refused with a TypeError (unpicklable-state)
        while time.monotonic() < end:
            choice = rng.random()
            if plan.fault == "unpicklable-state" and choice < 0.5:
                call: Callable[[], object] = run.state_dict
                what = "run.state_dict"
            elif choice < 0.1:
                call, what = run.stats, "run.stats"
            elif choice < 0.2:
                call, what = run.state_dict, "run.state_dict"
            else:
                call, what = self.step(run), "run.sleep"
            error = self.timed(what, call)
            if error is None:
                continue
            if isinstance(error, KeyboardInterrupt) and plan.fault == "interrupt" and not after_interrupt:
                after_interrupt = True  # run.interrupt: the run goes on
                if not run.running:
                    self.problems.append("the run stopped after a KeyboardInterrupt")
                end = time.monotonic() + 0.3
                continue
            if (
                isinstance(error, TypeError)
                and plan.fault == "unpicklable-state"
                and what == "run.state_dict"
            ):
                refused += 1  # the process lives and the run goes on
                continue
            seen = error
            break
        if not self.fired.wait(CALL_BOUND):
            self.problems.append("the fault never fired")
        if plan.fault == "unpicklable-state" and not refused:
            self.problems.append("run.state_dict() never refused the state that cannot be pickled")
        self.check_outcome(seen, after_interrupt)

    def check_outcome(self, seen: BaseException | None, interrupted: bool) -> None:
        """What the host's calls raised, against what the fault's rules say."""
        plan = self.plan
        fault = plan.fault
        if fault == "kill":
            if seen is None:
                self.problems.append("no ProcessError after the SIGKILL of a process")
            self.expect(seen, (mujou.ProcessError,), "a call after SIGKILL")
            if isinstance(seen, mujou.ProcessError) and seen.process != plan.target:
                self.problems.append(f"ProcessError names {seen.process!r}, not {plan.target!r}")
        elif fault in ("raise-child", "raise-host", "unpicklable-error"):
            if seen is None:
                self.problems.append(f"no HookError after {fault} of {plan.target}")
            self.expect(seen, (mujou.HookError,), "a call after a failing hook")
            if isinstance(seen, mujou.HookError):
                if (seen.node, seen.hook) != (plan.target, "on_update"):
                    self.problems.append(f"HookError of {seen.node}.{seen.hook}, not {plan.target}")
                cause = type(seen.__cause__)
                want = (
                    RuntimeError
                    if fault == "unpicklable-error" and plan.target not in plan.host_nodes
                    else None
                )
                if want is not None and cause is not want:
                    self.problems.append(f"the cause of an unpicklable error is {cause.__name__}")
        elif fault == "interrupt":
            if not interrupted:
                self.problems.append("no KeyboardInterrupt from a host call")
            self.expect(seen, (), "a call after the interrupt")
        elif fault == "unpicklable-state":  # only TypeErrors of run.state_dict (counted above)
            self.expect(seen, (), "a call with a state that cannot be pickled")
        elif fault == "fd-limit":
            self.expect(
                seen, (mujou.MujouInternalError, mujou.HookError, OSError), "a call with few descriptors"
            )
        elif fault == "sigstop":  # the run goes on
            self.expect(seen, (), f"a call after {fault}")
        elif not (isinstance(seen, RuntimeError) and self.stopped.is_set()):  # sigstop-stop
            # A call that waited raises the ProcessError of the process killed at the stop; one
            # made after the stop, RuntimeError (the run has ended).
            self.expect(seen, (mujou.ProcessError,), f"a call after {fault}")

    def expect_end(self, error: BaseException | None, what: str) -> None:
        """run.stop() raises only the error the run already had."""
        fault = self.plan.fault
        allowed: tuple[type[BaseException], ...] = ()
        if fault in ("kill", "sigstop-stop"):
            allowed = (mujou.ProcessError,)
        elif fault in ("raise-child", "raise-host", "unpicklable-error"):
            allowed = (mujou.HookError,)
        elif fault == "fd-limit":
            allowed = (mujou.MujouInternalError, mujou.HookError, OSError)
        self.expect(error, allowed, what)

    def inject(self, run: mujou.Run) -> None:
        """The fault of a signal, an interrupt or a descriptor limit, at the plan's moment.

        After a SIGSTOP that lasts, this thread stops the run: the host's thread may be in a
        call that waits for the stopped process (the spec leaves open whether it may)."""
        plan = self.plan
        try:
            time.sleep(plan.delay)
            pid = self.pids.get(plan.target)
            if plan.fault == "kill" and pid is not None:
                self.dead.add(plan.target)
                os.kill(pid, signal.SIGKILL)
            elif plan.fault in ("sigstop", "sigstop-stop") and pid is not None:
                os.kill(pid, signal.SIGSTOP)
                if plan.fault == "sigstop":
                    time.sleep(plan.hold)
                    os.kill(pid, signal.SIGCONT)
                else:
                    self.dead.add(plan.target)
                    self.expect_end(self.timed("run.stop (another thread)", run.stop), "run.stop")
                    self.stopped.set()
            elif plan.fault == "interrupt":
                if self.in_call.wait(CALL_BOUND):  # into a call of the run, not the trial's code
                    _thread.interrupt_main()
            elif plan.fault == "fd-limit":
                with low_descriptor_limit():
                    time.sleep(plan.hold)
        except ProcessLookupError:
            pass  # the process had ended already (a hook fault of another kind ended the run)
        finally:
            self.fired.set()

    def check_hooks(self, logdir: Path, *, fault_run: bool) -> None:
        """on_stop exactly once for every node that started in a process that lived; never
        more than once, nor without an on_start, anywhere."""
        where = {name: group for group, names in self.plan.groups.items() for name in names}
        for name in self.plan.kinds:
            started, stopped, _ = hook_log(logdir, name)
            process = where.get(name, "host")
            lived = not fault_run or process not in self.dead
            label = f"{'faulty' if fault_run else 'second'} run: node {name} (process {process})"
            if started > 1 or stopped > started:
                self.problems.append(f"{label}: {started} on_start, {stopped} on_stop")
            elif lived and stopped != started:
                self.problems.append(f"{label}: started but got no on_stop")
            if not fault_run and started != 1:
                self.problems.append(f"{label}: {started} on_start")

    def check_left(self, shm_before: set[str], fds_before: Descriptors, when: str) -> None:
        """No process of the run left, no /dev/shm entry of it, the descriptors back."""
        if not settle(lambda: not children()):
            self.problems.append(f"{when}: processes left: {children()}")
        gone = [pid for pid in self.pids.values() if alive(pid)]
        if gone:
            self.problems.append(f"{when}: processes of the run alive: {gone}")
        ours = {str(pid) for pid in (os.getpid(), *self.pids.values())}

        def left_shm() -> set[str]:
            return {e for e in shm_entries() - shm_before if "mujou" in e or any(p in e for p in ours)}

        if not settle(lambda: not left_shm()):
            self.problems.append(f"{when}: /dev/shm entries left: {sorted(left_shm())}")

        def descriptors_back() -> bool:
            gc.collect()  # the trial's own references to the run (tracebacks) go first
            return len(descriptors()) <= len(fds_before)

        if not settle(descriptors_back):
            now = descriptors()
            new = {fd: what for fd, what in now.items() if fds_before.get(fd) != what}
            self.problems.append(f"{when}: {len(now)} descriptors open, {len(fds_before)} before; new: {new}")

    def run_again(
        self,
        net: ChaosNet,
        processes: dict[str, list[Node]],
        shm_before: set[str],
        fds_before: Descriptors,
    ) -> None:
        """The same net, without its fault, runs again and ends cleanly."""
        logdir = self.workdir / "second"
        logdir.mkdir()
        for name in self.plan.kinds:
            node = getattr(net, name)
            node.logdir, node.fault = str(logdir), None
        self.pids = {}
        self.dead = set()

        def again() -> None:
            with mujou.run(net, timer=mujou.VirtualTimer(), processes=processes, workers=1) as run:
                self.find_pids(logdir)
                run.sleep(0.2)

        error = self.timed("second run", again)
        self.expect(error, (), "the second run")
        self.check_hooks(logdir, fault_run=False)
        self.check_left(shm_before, fds_before, "after the second run")


@contextlib.contextmanager
def low_descriptor_limit() -> Iterator[None]:
    """RLIMIT_NOFILE of this process at its lowest free descriptor number, for the block: no
    new descriptor can be made in it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)  # the number the next descriptor takes
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(lowest_free, soft), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Warm(Node):
    """The node of the warm-up run."""

    def __init__(self) -> None:
        super().__init__(period=0.1)

    def on_update(self, dt: float) -> None:
        pass


class WarmNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.warm = Warm()


def warm_up() -> None:
    """A first run with a process, before the descriptors are counted: what a program opens
    once, at its first run, and keeps (multiprocessing's resource tracker, say) is then open
    before the trial's runs, and only what a run leaves behind counts."""
    net = WarmNet()
    with mujou.run(net, timer=mujou.VirtualTimer(), processes={"warm": net.warm}) as run:
        run.sleep(0.1)


def main(argv: list[str]) -> int:
    """``SEED WORKDIR``: run the trial, print its result; 0 if it found no problem."""
    seed = int(argv[0])
    Path(argv[1]).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"trial-{seed}-", dir=argv[1]))
    faulthandler.enable()
    faulthandler.dump_traceback_later(TRIAL_BOUND, exit=True)
    torch.set_num_threads(1)
    warnings_off()
    warm_up()
    trial = Trial(plan(seed), workdir)
    try:
        trial.run()
    except BaseException as exc:  # the trial's own code failed: a problem, with its traceback
        trial.problems.append("the trial raised: " + "".join(traceback.format_exception(exc))[-3000:])
    result = {
        "seed": seed,
        "plan": dataclasses.asdict(trial.plan),
        "outcome": trial.outcome,
        "problems": trial.problems,
    }
    print("CHAOS-RESULT " + json.dumps(result), flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 1 if trial.problems else 0


def warnings_off() -> None:
    import warnings

    warnings.simplefilter("ignore", mujou.OversubscriptionWarning)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
