"""Conformance tests for the "Arguments" section of spec/en/running.md.

Rules: ``run.number-arguments`` (every duration and rate takes any real number and refuses the
rest clearly) and ``run.call-arguments`` (the host's calls name the argument they refuse).
Each number argument is tried through the public call that takes it; the times are those of the
virtual timer, so nothing depends on the machine's speed.
"""

from __future__ import annotations

import decimal
import math
import queue
import re
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import pytest
import torch
from _support import Bag, Plain, vt

import mujou
from mujou import Input, Node, Output


class Silent(Node):
    """An output that never sends, and an input nobody feeds."""

    out = Output()
    x = Input(optional=True)

    def __init__(self) -> None:
        super().__init__(period=0.25)


@pytest.fixture
def silent() -> Iterator[tuple[mujou.Run, Silent]]:
    node = Silent()
    with mujou.run(Bag(s=node), timer=vt()) as run:
        yield run, node


@pytest.fixture
def real_silent() -> Iterator[tuple[mujou.Run, Silent]]:
    node = Silent()
    with mujou.run(Bag(s=node), timer=mujou.RealTimeTimer()) as run:
        yield run, node


class Woken(Node):
    """A triggered node: min_interval and delay apply to it."""

    x = Input()

    def __init__(self, *, min_interval: object = 0.0, delay: object = 0.0) -> None:
        super().__init__(trigger=mujou.on("x"), min_interval=min_interval, delay=delay)  # type: ignore[arg-type]  # any value, on purpose


# Each site: (name, argument, the bound, "or None" allowed) and a call that passes the value.
Site = tuple[str, str, str, bool]
SITES: list[Site] = [
    ("Node(period=)", "period", "> 0", False),
    ("Node(min_interval=)", "min_interval", ">= 0", False),
    ("Node(delay=)", "delay", ">= 0", False),
    ("on_all(timeout=)", "timeout", "> 0", True),
    ("RealTimeTimer(scale=)", "scale", "> 0", False),
    ("run.sleep(seconds)", "seconds", ">= 0", False),
    ("run.wait_for(timeout=)", "timeout", ">= 0", True),
    ("run.join(timeout=)", "timeout", ">= 0", True),
    ("Subscription.get(timeout=)", "timeout", ">= 0", True),
]


def call(site: str, run: mujou.Run, node: Silent, value: object) -> object:
    """Pass ``value`` to the argument of ``site``; return what the call gives (see accepted)."""
    if site == "Node(period=)":
        return Plain(period=value).period  # type: ignore[arg-type]  # any real number, on purpose
    if site == "Node(min_interval=)":
        return Woken(min_interval=value).min_interval
    if site == "Node(delay=)":
        return Woken(delay=value).delay
    if site == "on_all(timeout=)":
        return mujou.on_all("x", timeout=value).timeout  # type: ignore[arg-type]  # on purpose
    if site == "RealTimeTimer(scale=)":
        return mujou.RealTimeTimer(scale=value)  # type: ignore[arg-type]  # on purpose
    if site == "run.sleep(seconds)":
        before = run.time
        run.sleep(value)  # type: ignore[arg-type]  # on purpose
        return run.time - before
    if site == "run.wait_for(timeout=)":
        before = run.time
        try:
            run.wait_for(node.out, timeout=value)  # type: ignore[arg-type]  # on purpose
        except TimeoutError:
            return run.time - before
        raise AssertionError("wait_for returned a message that was never sent")
    if site == "run.join(timeout=)":
        before = run.time
        try:
            run.join(timeout=value)  # type: ignore[arg-type]  # on purpose
        except TimeoutError:
            return run.time - before
        raise AssertionError("join returned though the run did not end")
    assert site == "Subscription.get(timeout=)"
    with run.subscribe(node.out) as subscription:
        try:
            subscription.get(timeout=value)  # type: ignore[arg-type]  # on purpose
        except RuntimeError as exc:  # under the virtual timer: none is waiting
            assert "no message is waiting" in str(exc), exc
            return "checked"
    raise AssertionError("get returned a message that was never sent")


ACCEPTED: list[tuple[str, object, float]] = [
    ("int", 2, 2.0),
    ("float", 0.25, 0.25),
    ("Fraction", Fraction(1, 4), 0.25),
    ("numpy float32", np.float32(0.5), 0.5),
    ("numpy float64", np.float64(0.75), 0.75),
    ("numpy int64", np.int64(1), 1.0),
    ("numpy float16", np.float16(0.5), 0.5),
]


@pytest.mark.rule("run.number-arguments")
@pytest.mark.parametrize("site", [s[0] for s in SITES])
@pytest.mark.parametrize(("kind", "value", "number"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_durations_and_rates_take_any_real_number(
    silent: tuple[mujou.Run, Silent], site: str, kind: str, value: object, number: float
) -> None:
    """> The arguments that are durations or rates (period of Node, scale of RealTimeTimer,
    seconds of run.sleep, and timeout of run.wait_for, run.join and Subscription.get) take any
    real number: a numbers.Real such as an int, a float, a fractions.Fraction or a NumPy
    scalar, but not a bool, converted to a float."""
    run, node = silent
    got = call(site, run, node, value)
    if site.startswith(("Node(", "on_all(")):
        assert type(got) is float and got == number, got
    elif site == "RealTimeTimer(scale=)":
        assert repr(got) == f"RealTimeTimer(scale={number!r})", repr(got)
    elif site != "Subscription.get(timeout=)":
        assert got == number, f"{site} with {value!r} waited {got} timer seconds"


@pytest.mark.rule("run.number-arguments")
def test_a_real_time_subscription_get_takes_a_fraction(real_silent: tuple[mujou.Run, Silent]) -> None:
    """> timeout of [...] Subscription.get [...] take any real number."""
    run, node = real_silent
    with run.subscribe(node.out) as subscription:
        for value in (Fraction(0), np.float64(0.0), 0):
            with pytest.raises(queue.Empty):
                subscription.get(timeout=value)  # type: ignore[arg-type]  # on purpose


REFUSED: list[tuple[str, object, type[Exception], str]] = [
    ("str", "1", TypeError, "real"),
    ("None", None, TypeError, "real"),
    ("bool", True, TypeError, "real"),
    ("numpy bool", np.bool_(True), TypeError, "real"),
    ("complex", 1j, TypeError, "real"),
    ("Decimal", decimal.Decimal("0.5"), TypeError, "real"),
    ("tensor", torch.tensor(0.5), TypeError, "real"),
    ("10**400", 10**400, ValueError, "finite"),
    ("-10**400", -(10**400), ValueError, "finite"),
    ("huge Fraction", Fraction(10**400, 3), ValueError, "finite"),
    ("nan", math.nan, ValueError, "finite"),
    ("inf", math.inf, ValueError, "finite"),
    ("numpy inf", np.float64("inf"), ValueError, "finite"),
    ("negative", -0.5, ValueError, "finite"),
    ("negative Fraction", Fraction(-1, 2), ValueError, "finite"),
]
ZERO: list[tuple[str, object, type[Exception], str]] = [
    ("0", 0, ValueError, "finite"),
    ("0.0", 0.0, ValueError, "finite"),
    ("tiny Fraction", Fraction(1, 10**400), ValueError, "finite"),
]


class Case(NamedTuple):
    site: str
    name: str
    bound: str
    optional: bool
    value: object
    error: type[Exception]
    word: str


def cases() -> Iterator[object]:
    """Every refused value at every site (None is allowed where the timeout may be None)."""
    for site, name, bound, optional in SITES:
        for kind, value, error, word in REFUSED + (ZERO if bound == "> 0" else []):
            if value is None and (optional or site == "Node(period=)"):
                continue  # period=None: triggered only (trigger.period-none)
            yield pytest.param(Case(site, name, bound, optional, value, error, word), id=f"{site}-{kind}")


@pytest.mark.rule("run.number-arguments")
@pytest.mark.parametrize("case", list(cases()))
def test_other_values_are_refused_naming_the_argument(silent: tuple[mujou.Run, Silent], case: Case) -> None:
    """> One that is not a real number raises TypeError; one that is not finite, out of range
    (period and scale > 0, the others >= 0) or too large for a float (10**400) raises
    ValueError. Each message names the argument, shows the value and says what is allowed."""
    run, node = silent
    before = run.time
    unit = "" if case.name == "scale" else " of seconds"
    allowed = re.escape(f"{unit} {case.bound}" + (" or None" if case.optional else ""))
    expected = rf"^{case.name} must be a {case.word} number{allowed}, got "
    with pytest.raises(case.error, match=expected) as info:
        call(case.site, run, node, case.value)
    assert type(info.value) is case.error, type(info.value)
    message, value = str(info.value), case.value
    if isinstance(value, int) and abs(value) > 10**100:
        assert "too large for a float" in message and "1000000000" in message, message
    if len(repr(value)) > 80:
        assert len(message) < 300, f"the message shows all of the value: {len(message)} characters"
    else:
        assert repr(value) in message, message
    assert run.time == before, "the refused call advanced the time"


def test_the_sites_are_every_number_argument() -> None:
    """The table of sites covers every number argument the rule lists (a guard on the test)."""
    assert {s[0] for s in SITES} == {
        "Node(period=)",
        "Node(min_interval=)",
        "Node(delay=)",
        "on_all(timeout=)",
        "RealTimeTimer(scale=)",
        "run.sleep(seconds)",
        "run.wait_for(timeout=)",
        "run.join(timeout=)",
        "Subscription.get(timeout=)",
    }


# --- run.call-arguments ---------------------------------------------------------------------


@pytest.mark.rule("run.call-arguments")
@pytest.mark.parametrize("predicate", [5, "p", torch.zeros(1)], ids=["int", "str", "tensor"])
def test_wait_for_refuses_a_predicate_that_is_not_callable(
    silent: tuple[mujou.Run, Silent], predicate: object
) -> None:
    """> predicate of run.wait_for a callable or None (TypeError) [...]; nothing is waited for."""
    run, node = silent
    with pytest.raises(
        TypeError,
        match=r"^predicate must be a callable taking the message and returning a bool, or None, got ",
    ) as info:
        run.wait_for(node.out, predicate, timeout=1.0)  # type: ignore[arg-type]  # on purpose
    assert type(predicate).__name__ in str(info.value), str(info.value)
    assert run.time == 0.0, "the refused wait_for waited"


Call = Callable[[mujou.Run, Silent, object], object]
PORT_CALLS: list[tuple[str, Call]] = [
    ("read", lambda run, node, port: run.read(port)),  # type: ignore[arg-type]  # on purpose
    ("write", lambda run, node, port: run.write(port, torch.zeros(1))),  # type: ignore[arg-type]
    ("subscribe", lambda run, node, port: run.subscribe(port)),  # type: ignore[arg-type]
    ("wait_for", lambda run, node, port: run.wait_for(port, timeout=1.0)),  # type: ignore[arg-type]
]


@pytest.mark.rule("run.call-arguments")
@pytest.mark.parametrize("call_port", [c[1] for c in PORT_CALLS], ids=[c[0] for c in PORT_CALLS])
def test_host_calls_name_the_port_they_refuse(silent: tuple[mujou.Run, Silent], call_port: Call) -> None:
    """> port an Input or an Output of a node (TypeError) of the run's net (ValueError)."""
    run, node = silent
    with pytest.raises(TypeError, match=r"^port must be an Input or Output of a node, got int$"):
        call_port(run, node, 5)
    with pytest.raises(
        TypeError, match=r"^Input 'x' is the class attribute; pass the port of a node instance"
    ):
        call_port(run, node, Silent.x)
    stranger = Silent()
    Bag(s=stranger)  # named, but in another net
    with pytest.raises(ValueError, match=r"^port 's\.x' is not a port of this run's net$"):
        call_port(run, node, stranger.x)
    assert run.time == 0.0


@pytest.mark.rule("run.call-arguments")
@pytest.mark.parametrize("maxsize", [0, -1, 1.5, "8", True])
def test_subscribe_names_a_maxsize_it_refuses(silent: tuple[mujou.Run, Silent], maxsize: object) -> None:
    """> maxsize of run.subscribe a positive int (ValueError)."""
    run, node = silent
    with pytest.raises(ValueError, match=r"^maxsize must be a positive int, got "):
        run.subscribe(node.out, maxsize)  # type: ignore[arg-type]  # on purpose
