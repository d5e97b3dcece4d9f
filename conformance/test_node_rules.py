"""Conformance tests for the spec page "The rules a node keeps" (spec/en/node-rules.md)."""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import torch
from _support import HANG_GUARD, Bag

import mujou
from mujou import Input, Node, Output


@dataclass
class Shown:
    """A warning as it was shown: its category, its text and the thread that issued it."""

    category: type[Warning]
    text: str
    thread: int


@dataclass
class WarningLog:
    shown: list[Shown] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, category: type[Warning]) -> list[Shown]:
        with self.lock:
            return [w for w in self.shown if issubclass(w.category, category)]


@contextlib.contextmanager
def shown_warnings() -> Iterator[WarningLog]:
    """Record every warning shown, with the thread that issued it (whatever the thread)."""
    log = WarningLog()

    def showwarning(  # noqa: PLR0917 - the signature of warnings.showwarning
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: object = None,
        line: str | None = None,
    ) -> None:
        with log.lock:
            log.shown.append(Shown(category, str(message), threading.get_ident()))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = showwarning
        yield log


@pytest.fixture
def keep_global_rng() -> Iterator[None]:
    """Put the default generator back as it was (the tests that call manual_seed change it)."""
    state = torch.random.get_rng_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


def leaked(node: str, hook: str, setting: str) -> str:
    """The anchored pattern of a LeakedSettingWarning."""
    what, fix = {
        "grad": ("grad mode", r"torch\.no_grad\(\)"),
        "inference": ("inference mode", r"torch\.inference_mode\(\)"),
    }[setting]
    return (
        rf"^node '{re.escape(node)}' returned from {hook} with {what} changed; the next node on "
        r"this thread inherits it: keep such settings inside a with block in the hook "
        rf"\(with {fix}: \.\.\.\)$"
    )


# --------------------------------------------------------------------------------------------
# rules.no-run-calls-in-hooks


class Ticker(Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.005, seed=0)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.zeros(1))


class Caller(Node):
    """Calls a method of the run from one of its hooks, once, and records what happened."""

    def __init__(self, call: str, hook: str, *, dedicated_thread: bool) -> None:
        super().__init__(period=0.005, seed=0, dedicated_thread=dedicated_thread)
        self.call = call
        self.hook = hook
        self.run: mujou.Run | None = None
        self.port: Output | None = None
        self.outcome: BaseException | str | None = None
        self.done = threading.Event()

    def _call(self) -> None:
        run, port = self.run, self.port
        if run is None or port is None or self.done.is_set():
            return
        calls: dict[str, Callable[[], object]] = {
            "sleep": lambda: run.sleep(0.001),
            "wait_for": lambda: run.wait_for(port, lambda m: True, timeout=0.001),
            "join": lambda: run.join(timeout=0.001),
            "state_dict": run.state_dict,
            "stop": run.stop,
        }
        try:
            calls[self.call]()
        except RuntimeError as exc:
            self.outcome = exc
        except BaseException as exc:  # recorded, checked by the test
            self.outcome = f"raised {exc!r} instead of RuntimeError"
        else:
            self.outcome = "returned normally"
        self.done.set()

    def on_update(self, dt: float) -> None:
        if self.hook == "on_update":
            self._call()

    def on_stop(self) -> None:
        if self.hook == "on_stop":
            self._call()


@pytest.mark.rule("rules.no-run-calls-in-hooks")
@pytest.mark.parametrize("call", ["sleep", "wait_for", "join", "state_dict", "stop"])
@pytest.mark.parametrize("hook", ["on_update", "on_stop"])
@pytest.mark.parametrize("dedicated", [False, True], ids=["worker", "dedicated"])
def test_run_calls_from_hooks_raise(call: str, hook: str, dedicated: bool) -> None:
    """> A hook must not wait on the run: calling Run.sleep, wait_for, join, state_dict or stop
    > from a hook raises RuntimeError (it would wait for the node itself)."""
    ticker, caller = Ticker(), Caller(call, hook, dedicated_thread=dedicated)
    net = Bag(ticker=ticker, caller=caller)
    with mujou.run(net, workers=1) as run:
        caller.port = ticker.y
        caller.run = run
        if hook == "on_update":
            assert caller.done.wait(HANG_GUARD), "the hook did not run"
    assert caller.done.is_set()
    outcome = caller.outcome
    assert isinstance(outcome, RuntimeError), outcome
    assert re.search(
        rf"^run\.{call}\(\) cannot be called from a hook of node '{caller.name}' \({hook}\): "
        r"it would wait for the node itself$",
        str(outcome),
    ), str(outcome)


# --------------------------------------------------------------------------------------------
# rules.hook-settings-warning


class GradToggler(Node):
    """Flips torch's grad mode in each of its hooks and leaves it flipped."""

    def __init__(self, *, hooks: tuple[str, ...], dedicated_thread: bool = False) -> None:
        super().__init__(period=0.25, seed=0, dedicated_thread=dedicated_thread)
        self.hooks = hooks
        self.seen: list[bool] = []  # grad mode at the start of each flipping hook
        self.later: list[bool] = []  # grad mode in the updates that do not flip it

    def _flip(self, hook: str) -> None:
        if hook in self.hooks:
            self.seen.append(torch.is_grad_enabled())
            torch.set_grad_enabled(not torch.is_grad_enabled())

    def on_start(self) -> None:
        self._flip("on_start")

    def on_update(self, dt: float) -> None:
        if "on_update" in self.hooks:
            self._flip("on_update")
        else:
            self.later.append(torch.is_grad_enabled())

    def on_stop(self) -> None:
        self._flip("on_stop")


@pytest.mark.rule("rules.hook-settings-warning")
@pytest.mark.parametrize("workers", [1, 2])
def test_leaked_grad_mode_warns_once_per_node(workers: int) -> None:
    """> When a hook returns with torch's per-thread grad mode (torch.is_grad_enabled) ...
    > changed, Mujou issues a LeakedSettingWarning naming the node, the hook and the setting,
    > once per node and setting in a run."""
    net = Bag(
        first=GradToggler(hooks=("on_update",)),
        second=GradToggler(hooks=("on_update",)),
        quiet=GradToggler(hooks=()),
    )
    for _ in range(2):  # once per run: the second run warns again
        with (
            pytest.warns(mujou.LeakedSettingWarning) as record,
            mujou.run(net, timer=mujou.VirtualTimer(), workers=workers) as run,
        ):
            run.sleep(2.0)
        texts = sorted(str(w.message) for w in record if w.category is mujou.LeakedSettingWarning)
        assert len(texts) == 2, texts
        for name, text in zip(["first", "second"], texts, strict=True):
            assert re.search(leaked(name, "on_update", "grad"), text), text
    assert torch.is_grad_enabled()  # the host's thread was not touched


@pytest.mark.rule("rules.hook-settings-warning")
def test_leaked_grad_mode_names_the_hook_and_is_not_undone() -> None:
    """> Mujou issues a LeakedSettingWarning naming the node, the hook and the setting ... It does
    > not change the setting back."""
    node = GradToggler(hooks=("on_start",), dedicated_thread=True)
    probe = GradProbe()
    net = Bag(node=node, probe=probe)
    with (
        pytest.warns(mujou.LeakedSettingWarning, match=leaked("node", "on_start", "grad")),
        mujou.run(net, timer=mujou.VirtualTimer()) as run,
    ):
        run.sleep(1.0)
    assert node.seen == [True]
    # The next hooks on the node's own thread see what on_start left behind.
    assert node.later == [False] * 4
    assert probe.grad == [True] * 4  # another node (on a worker) is not affected


class GradProbe(Node):
    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.grad: list[bool] = []

    def on_update(self, dt: float) -> None:
        self.grad.append(torch.is_grad_enabled())


class InferenceLeaker(Node):
    """Enters inference mode in one update and leaves it in a later one (on its own thread)."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0, dedicated_thread=True)
        self.guard: torch.inference_mode | None = None
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 1:
            self.guard = torch.inference_mode()
            self.guard.__enter__()
        elif self.n == 3 and self.guard is not None:
            self.guard.__exit__(None, None, None)
            self.guard = None

    def on_stop(self) -> None:
        if self.guard is not None:
            self.guard.__exit__(None, None, None)
            self.guard = None


@pytest.mark.rule("rules.hook-settings-warning")
def test_leaked_inference_mode_warns_once() -> None:
    """> When a hook returns with torch's per-thread ... inference mode changed, Mujou issues a
    > LeakedSettingWarning naming the node, the hook and the setting, once per node and setting
    > in a run."""
    node = InferenceLeaker()
    with (
        pytest.warns(mujou.LeakedSettingWarning) as record,
        mujou.run(Bag(leaker=node), timer=mujou.VirtualTimer()) as run,
    ):
        run.sleep(2.0)
    texts = sorted(str(w.message) for w in record if w.category is mujou.LeakedSettingWarning)
    # Inference mode turns grad mode off too: one warning for each setting, though the node
    # changed them twice (entering inference mode, then leaving it).
    assert len(texts) == 2, texts
    assert re.search(leaked("leaker", "on_update", "grad"), texts[0]), texts
    assert re.search(leaked("leaker", "on_update", "inference"), texts[1]), texts


class TidyNode(Node):
    """Changes per-thread settings only inside a with block in the hook."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.grad_inside: list[bool] = []

    def on_update(self, dt: float) -> None:
        with torch.no_grad():
            self.grad_inside.append(torch.is_grad_enabled())
        with torch.inference_mode():
            torch.zeros(1).add_(1)


@pytest.mark.rule("rules.hook-settings-warning")
def test_settings_kept_inside_a_with_do_not_warn() -> None:
    """> When a hook returns with torch's per-thread grad mode ... or inference mode changed
    > (and only then), Mujou issues a LeakedSettingWarning."""
    node = TidyNode()
    with shown_warnings() as log, mujou.run(Bag(tidy=node), timer=mujou.VirtualTimer(), workers=1) as run:
        run.sleep(1.0)
    assert node.grad_inside == [False] * 4
    assert log.of(mujou.MujouWarning) == [], log.of(mujou.MujouWarning)


# --------------------------------------------------------------------------------------------
# rules.manual-seed-warning


def reseeded(node: str) -> str:
    """The anchored pattern of a GlobalRandomWarning about an update."""
    return (
        rf"^node '{re.escape(node)}' called torch\.manual_seed in on_update: that reseeds the "
        r"generator every node shares; draw from self\.generator instead \(seeded with "
        r"Node\(seed=\.\.\.\)\)$"
    )


class Reseeder(Node):
    """Calls torch.manual_seed with a new seed in each update."""

    def __init__(self, base: int, *, reseed: bool = True) -> None:
        super().__init__(period=0.25, seed=0)
        self.base = base
        self.reseed = reseed
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.reseed:
            torch.manual_seed(self.base + self.n)
        torch.randn(2, generator=self.generator)


@pytest.mark.rule("rules.manual-seed-warning")
@pytest.mark.usefixtures("keep_global_rng")
def test_manual_seed_in_a_hook_warns_once_per_node() -> None:
    """> When a hook calls torch.manual_seed (detected as a change of torch.initial_seed()),
    > Mujou issues a GlobalRandomWarning naming the node and the fix (use self.generator), once
    > per node in a run."""
    torch.manual_seed(1)
    net = Bag(a=Reseeder(1000), b=Reseeder(2000), c=Reseeder(0, reseed=False))
    for _ in range(2):  # once per node in each run
        with shown_warnings() as log, mujou.run(net, timer=mujou.VirtualTimer(), workers=1) as run:
            run.sleep(2.0)
        shown = log.of(mujou.GlobalRandomWarning)
        texts = sorted(w.text for w in shown)
        assert len(texts) == 2, texts
        for name, text in zip(["a", "b"], texts, strict=True):
            assert re.search(reseeded(name), text), text
        assert all(w.thread == threading.get_ident() for w in shown)


class SeedsWhileOtherRuns(Node):
    """In its first update, calls torch.manual_seed while the node `busy` is inside a hook."""

    def __init__(self, busy_inside: threading.Event, seeded: threading.Event) -> None:
        super().__init__(period=0.005, seed=0)
        self.busy_inside = busy_inside
        self.seeded = seeded

    def on_update(self, dt: float) -> None:
        if not self.seeded.is_set():
            assert self.busy_inside.wait(HANG_GUARD)
            torch.manual_seed(torch.initial_seed() + 1)
            self.seeded.set()


class BusyWhileOtherSeeds(Node):
    """In its first update, waits inside the hook until the other node has reseeded."""

    def __init__(self, busy_inside: threading.Event, seeded: threading.Event) -> None:
        super().__init__(period=0.005, seed=0)
        self.busy_inside = busy_inside
        self.seeded = seeded

    def on_update(self, dt: float) -> None:
        if not self.busy_inside.is_set():
            self.busy_inside.set()
            assert self.seeded.wait(HANG_GUARD)


@pytest.mark.rule("rules.manual-seed-warning")
@pytest.mark.usefixtures("keep_global_rng")
def test_manual_seed_warning_names_only_the_node_that_called_it() -> None:
    """> When a hook calls torch.manual_seed ..., Mujou issues a GlobalRandomWarning naming the
    > node (the one that called it, not another node whose hook ran at the same time)."""
    busy_inside, seeded = threading.Event(), threading.Event()
    net = Bag(
        busy=BusyWhileOtherSeeds(busy_inside, seeded),
        seeder=SeedsWhileOtherRuns(busy_inside, seeded),
    )
    with shown_warnings() as log, mujou.run(net, workers=2) as run:
        assert seeded.wait(HANG_GUARD)
        run.sleep(0.02)
    texts = [w.text for w in log.of(mujou.GlobalRandomWarning)]
    assert len(texts) == 1, texts
    assert texts[0].startswith("node 'seeder' "), texts


@pytest.mark.rule("rules.manual-seed-warning")
@pytest.mark.usefixtures("keep_global_rng")
def test_a_reseed_by_the_host_between_its_calls_names_no_node() -> None:
    """> When a hook calls torch.manual_seed ..., Mujou issues a GlobalRandomWarning naming the
    > node: the host's own torch.manual_seed, between two of its calls, names no node."""
    a, b = Reseeder(0, reseed=False), Reseeder(0, reseed=False)
    with shown_warnings() as log, mujou.run(Bag(a=a, b=b), timer=mujou.VirtualTimer(), workers=1) as run:
        run.sleep(1.0)
        torch.manual_seed(torch.initial_seed() + 1)
        run.sleep(1.0)
    assert a.n == b.n == 8  # the updates after the reseed ran
    assert log.of(mujou.GlobalRandomWarning) == []


@pytest.mark.rule("rules.manual-seed-warning")
@pytest.mark.usefixtures("keep_global_rng")
def test_manual_seed_warning_with_pytest_warns() -> None:
    """> Mujou issues a GlobalRandomWarning naming the node and the fix (use self.generator)."""
    torch.manual_seed(1)
    with (
        pytest.warns(mujou.GlobalRandomWarning, match=reseeded("seeder")),
        mujou.run(Bag(seeder=Reseeder(77)), timer=mujou.VirtualTimer()) as run,
    ):
        run.sleep(0.5)


# --------------------------------------------------------------------------------------------
# rules.warnings-on-host


class LeakThenSignal(Node):
    """Leaks grad mode in its first update; signals in its second (the first has returned)."""

    def __init__(self, *, dedicated_thread: bool, leak_in_stop: bool = False) -> None:
        super().__init__(period=0.005, seed=0, dedicated_thread=dedicated_thread)
        self.leak_in_stop = leak_in_stop
        self.n = 0
        self.first_returned = threading.Event()

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 1 and not self.leak_in_stop:
            torch.set_grad_enabled(False)
        elif self.n >= 2:
            self.first_returned.set()

    def on_stop(self) -> None:
        if self.leak_in_stop:
            torch.set_grad_enabled(False)


@pytest.mark.rule("rules.warnings-on-host")
@pytest.mark.parametrize("dedicated", [False, True], ids=["worker", "dedicated"])
def test_warnings_wait_for_the_hosts_next_call(dedicated: bool) -> None:
    """> Mujou's warnings about hooks are issued on the host's thread, at the host's next call
    > on the run (or when the run is stopped), never on a worker."""
    node = LeakThenSignal(dedicated_thread=dedicated)
    host = threading.get_ident()
    with shown_warnings() as log, mujou.run(Bag(leaker=node), workers=1) as run:
        assert node.first_returned.wait(HANG_GUARD)
        # The leak happened and its hook returned, but the host made no call since.
        assert log.of(mujou.LeakedSettingWarning) == []
        run.sleep(0.0)
        shown = log.of(mujou.LeakedSettingWarning)
        assert len(shown) == 1, shown
        assert shown[0].thread == host
    assert len(log.of(mujou.LeakedSettingWarning)) == 1


class Ticks(Node):
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.005, seed=0)

    def on_update(self, dt: float) -> None:
        self.y.send(torch.zeros(1))


class Fed(Node):
    x = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(period=0.005, seed=0)


@pytest.mark.rule("rules.warnings-on-host")
@pytest.mark.parametrize("call", ["read", "stats", "write", "subscribe", "sleep", "wait_for"])
def test_any_host_call_issues_the_pending_warnings(call: str) -> None:
    """> Mujou's warnings about hooks are issued on the host's thread, at the host's next call
    > on the run."""
    node, ticks, fed = LeakThenSignal(dedicated_thread=False), Ticks(), Fed()
    with shown_warnings() as log, mujou.run(Bag(leaker=node, ticks=ticks, fed=fed), workers=1) as run:
        assert node.first_returned.wait(HANG_GUARD)
        assert log.of(mujou.LeakedSettingWarning) == []
        calls: dict[str, Callable[[], object]] = {
            "read": lambda: run.read(ticks.y),
            "stats": run.stats,
            "write": lambda: run.write(fed.x, torch.zeros(1)),
            "subscribe": lambda: run.subscribe(ticks.y).close(),
            "sleep": lambda: run.sleep(0.0),
            "wait_for": lambda: run.wait_for(ticks.y, timeout=HANG_GUARD),
        }
        calls[call]()
        shown = log.of(mujou.LeakedSettingWarning)
        assert len(shown) == 1, f"run.{call}() did not issue the pending warning"
        assert shown[0].thread == threading.get_ident()


@pytest.mark.rule("rules.warnings-on-host")
@pytest.mark.parametrize("timer", ["virtual", "realtime"])
def test_warnings_from_on_stop_are_issued_when_stopped(timer: str) -> None:
    """> Mujou's warnings about hooks are issued on the host's thread, ... (or when the run is
    > stopped), never on a worker."""
    node = LeakThenSignal(dedicated_thread=False, leak_in_stop=True)
    the_timer = mujou.VirtualTimer() if timer == "virtual" else mujou.RealTimeTimer()
    with shown_warnings() as log:
        with mujou.run(Bag(leaker=node), timer=the_timer, workers=1) as run:
            run.sleep(0.05)
            assert log.of(mujou.LeakedSettingWarning) == []
        shown = log.of(mujou.LeakedSettingWarning)
    assert len(shown) == 1, shown
    assert shown[0].thread == threading.get_ident()
    assert "on_stop" in shown[0].text


@pytest.mark.rule("rules.warnings-on-host")
def test_warnings_under_virtual_timer_are_on_host() -> None:
    """> Mujou's warnings about hooks are issued on the host's thread ... never on a worker."""
    nodes = {f"n{i}": GradToggler(hooks=("on_start", "on_update")) for i in range(4)}
    with shown_warnings() as log, mujou.run(Bag(**nodes), timer=mujou.VirtualTimer(), workers=2) as run:
        run.sleep(1.0)
    shown = log.of(mujou.LeakedSettingWarning)
    # One per node: on_start and on_update leak the same setting.
    assert len(shown) == 4, shown
    assert {w.thread for w in shown} == {threading.get_ident()}


# --- gaps found by mutation testing ---------------------------------------------------------


class SeedsThenSignals(Node):
    """Calls torch.manual_seed in its first update once `busy` is inside its hook; its second
    update signals that the first has returned."""

    def __init__(self, busy_inside: threading.Event, returned: threading.Event) -> None:
        super().__init__(period=0.005, seed=0, dedicated_thread=True)
        self.busy_inside = busy_inside
        self.returned = returned
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        if self.n == 1:
            assert self.busy_inside.wait(HANG_GUARD)
            torch.manual_seed(torch.initial_seed() + 1)
        else:
            self.returned.set()


class InsideUntilReturned(Node):
    """Stays inside its first update until the seeding node's hook has returned."""

    def __init__(self, busy_inside: threading.Event, returned: threading.Event) -> None:
        super().__init__(period=0.005, seed=0, dedicated_thread=True)
        self.busy_inside = busy_inside
        self.returned = returned

    def on_update(self, dt: float) -> None:
        if not self.busy_inside.is_set():
            self.busy_inside.set()
            assert self.returned.wait(HANG_GUARD)


@pytest.mark.rule("rules.manual-seed-warning")
@pytest.mark.usefixtures("keep_global_rng")
def test_manual_seed_warning_names_the_nodes_in_a_hook_meanwhile() -> None:
    """> When hooks of other nodes ran at the same time, the warning names them too, as nodes
    > that may have made the call instead."""
    busy_inside, returned = threading.Event(), threading.Event()
    net = Bag(
        busy=InsideUntilReturned(busy_inside, returned),
        seeder=SeedsThenSignals(busy_inside, returned),
    )
    with shown_warnings() as log, mujou.run(net, workers=1) as run:
        assert returned.wait(HANG_GUARD), "hang guard: the seeder's second update"
        run.sleep(0.02)
    texts = [w.text for w in log.of(mujou.GlobalRandomWarning)]
    assert len(texts) == 1, texts
    assert texts[0].startswith("node 'seeder' (or node 'busy', whose hook ran meanwhile) called "), texts
