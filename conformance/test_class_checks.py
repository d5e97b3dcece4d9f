"""Conformance tests for the mistakes caught when a node class is defined or built:
``nodes.hook-signature``, ``nodes.hook-name-warning`` (spec/en/nodes-and-ports.md),
``ports.instance-refused`` and ``threads.rate`` (spec/en/threads-and-devices.md).

Each class here is defined inside its test, so that the class statement is what the test
checks.
"""

from __future__ import annotations

import fractions
import inspect
import math
import re
import warnings
from typing import Any

import pytest
import torch
from _support import Bag, vt

import mujou
from mujou import Input, Node, Output

# --------------------------------------------------------------------------------------------
# nodes.hook-signature

EXPECTED = {
    "on_start": "def on_start(self)",
    "on_update": "def on_update(self, dt)",
    "on_stop": "def on_stop(self)",
    "state_dict": "def state_dict(self)",
    "load_state_dict": "def load_state_dict(self, state)",
}


def _define(body: str) -> type:
    """The class ``Robot(Node)`` with ``body`` (indented), defined as a class statement runs."""
    source = "class Robot(Node):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    namespace: dict[str, Any] = {"Node": Node}
    exec(source, namespace)  # a class statement, as in a user's module
    robot: type = namespace["Robot"]
    return robot


@pytest.mark.rule("nodes.hook-signature")
@pytest.mark.parametrize(
    ("body", "hook", "signature"),
    [
        ("def on_update(self): pass", "on_update", "(self)"),
        ("def on_update(self, dt, extra): pass", "on_update", "(self, dt, extra)"),
        ("def on_update(self, *, dt): pass", "on_update", "(self, *, dt)"),
        ("def on_start(self, when): pass", "on_start", "(self, when)"),
        ("def on_stop(self, reason): pass", "on_stop", "(self, reason)"),
        ("def state_dict(self, into): pass", "state_dict", "(self, into)"),
        ("def load_state_dict(self): pass", "load_state_dict", "(self)"),
        ("@staticmethod\ndef on_stop(node): pass", "on_stop", "(node)"),
    ],
)
def test_a_hook_that_cannot_be_called_fails_the_class_statement(body: str, hook: str, signature: str) -> None:
    """> ... a function, a staticmethod or a classmethod that cannot be called as Mujou calls it
    > ... the class statement raises TypeError naming the class, the hook, its signature and
    > the one expected."""
    called = re.escape(EXPECTED[hook].removeprefix("def ").replace("self, ", "").replace("(self)", "()"))
    with pytest.raises(
        TypeError,
        match=rf"^Robot\.{hook}{re.escape(signature)} cannot be called as Mujou calls it, "
        rf"node\.{called}: define it as {re.escape(EXPECTED[hook])}$",
    ):
        _define(body)


@pytest.mark.rule("nodes.hook-signature")
def test_an_async_hook_fails_the_class_statement() -> None:
    """> ..., or as an async def, the class statement raises TypeError."""
    with pytest.raises(
        TypeError,
        match=r"^Robot\.on_update is async; Mujou calls hooks as plain functions and never awaits "
        r"them: define it as def on_update\(self, dt\)$",
    ):
        _define("async def on_update(self, dt): pass")


@pytest.mark.rule("nodes.hook-signature")
@pytest.mark.parametrize(
    "body",
    [
        "def on_update(self, dt): pass",
        "def on_update(self, dt, gain=2.0): pass",
        "def on_update(self, *args): pass",
        "def on_update(self, dt, *args, scale=1, **kwargs): pass",
        "def on_start(self, *, warm=True): pass",
        "def load_state_dict(self, state, strict=True): pass",
        "def state_dict(self, destination=None, prefix=''): return {}",
        "@staticmethod\ndef on_update(dt): pass",
        "@classmethod\ndef on_stop(cls): pass",
    ],
)
def test_hooks_that_can_be_called_are_accepted(body: str) -> None:
    """> Extra parameters with defaults, *args and **kwargs are accepted."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        robot = _define(body)
    assert issubclass(robot, Node)


@pytest.mark.rule("nodes.hook-signature")
def test_a_hook_with_the_wrong_signature_fails_before_any_node_or_run() -> None:
    """The check is at the class statement: no node is made, no net is run."""
    made: list[str] = []
    with pytest.raises(TypeError, match=r"^Lazy\.on_update\(self\) cannot be called"):

        class Lazy(Node):
            made.append("class body")

            def on_update(self) -> None:  # type: ignore[override]  # the mistake, on purpose
                made.append("update")

    assert made == ["class body"]


# --------------------------------------------------------------------------------------------
# nodes.hook-name-warning


@pytest.mark.rule("nodes.hook-name-warning")
@pytest.mark.parametrize(
    ("name", "hook"),
    [
        ("update", "on_update"),
        ("on_updates", "on_update"),
        ("onUpdate", "on_update"),
        ("OnUpdate", "on_update"),
        ("on_stat", "on_start"),
        ("start", "on_start"),
        ("stop", "on_stop"),
        ("onstop", "on_stop"),
        ("stateDict", "state_dict"),
        ("load_state", "load_state_dict"),
    ],
)
def test_a_name_like_a_hook_warns_at_its_def(name: str, hook: str) -> None:
    """> ... a method whose name is no hook's but resembles one, the class statement issues a
    > HookNameWarning naming the method and the hook it resembles, at the line of the method's
    > def."""
    lines = [
        "class Robot(Node):",
        "    gain = 2.0",
        "",
        f"    def {name}(self, dt: float = 0.0) -> None:",
        "        pass",
    ]
    source = "\n".join(lines) + "\n"
    code = compile(source, "robot_module.py", "exec")
    with pytest.warns(mujou.HookNameWarning) as record:
        exec(code, {"Node": Node, "__name__": "robot_module"})
    assert len(record) == 1, [str(w.message) for w in record]
    warning = record[0]
    assert str(warning.message) == (
        f"Robot.{name} looks like the hook {hook}, which Mujou calls; Mujou never calls {name}. "
        f"Rename it {hook} if it is meant as the hook; if it is a method of your own, give it a "
        f"name further from {hook} or starting with '_'"
    )
    assert (warning.filename, warning.lineno) == ("robot_module.py", 4)  # the def's line


@pytest.mark.rule("nodes.hook-name-warning")
@pytest.mark.parametrize(
    "body",
    [
        "def _update(self): pass",  # starts with _
        "def __call__(self): pass",
        "def step(self): pass",
        "def reset(self): pass",
        "def state(self): pass",
        "def compute(self, x): pass",
        "def on_message(self, x): pass",
        "update = 3",  # not a method
        "def on_update(self, dt): pass",  # the hook itself
    ],
)
def test_names_far_from_hooks_and_private_names_do_not_warn(body: str) -> None:
    """> A name that starts with _, and a name that Node itself defines, is never checked."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _define(body)


@pytest.mark.rule("nodes.hook-name-warning")
def test_the_warning_is_silenced_as_the_spec_shows() -> None:
    """> ... or silence the warning where the class is defined, like any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=mujou.HookNameWarning, message=r"Robot\.stop ")

        class Robot(Node):
            def stop(self) -> None:  # a method of its own, on purpose
                pass

        with pytest.raises(mujou.HookNameWarning, match=r"^Other\.stop looks like the hook on_stop"):

            class Other(Node):
                def stop(self) -> None:
                    pass

    assert issubclass(mujou.HookNameWarning, mujou.MujouWarning)
    assert Robot.stop is not Node.on_stop


# --------------------------------------------------------------------------------------------
# ports.instance-refused


@pytest.mark.rule("ports.instance-refused")
@pytest.mark.parametrize("kind", [Output, Input])
def test_a_port_made_on_an_instance_is_refused_at_once(kind: type[Any]) -> None:
    """> Assigning a port that belongs to no node ... as an attribute of a node instance, such
    > as self.y = Output() in __init__, is refused: making the node raises AttributeError as
    > the __init__ that assigned it returns, naming the class and the attribute and saying
    > that ports are declared on the class."""
    reached: list[str] = []

    class Robot(Node):
        def __init__(self) -> None:
            super().__init__()
            self.y = kind()
            reached.append("after")

    name = kind.__name__
    with pytest.raises(
        AttributeError,
        match=rf"^Robot\.y: an {name} cannot be assigned on a node instance; ports are "
        rf"declared on the class: write y = {name}\(\.\.\.\) in the body of class Robot, not "
        rf"self\.y = {name}\(\.\.\.\) in a method$",
    ):
        Robot()
    assert reached == ["after"]  # refused as the __init__ that assigned it returns


class LateAssigner(Node):
    """Assigns a port in a hook, where no construction follows: its first use says the fix."""

    def __init__(self) -> None:
        super().__init__(period=0.25)
        self.errors: list[str] = []

    def on_update(self, dt: float) -> None:
        self.z = Output()
        try:
            self.z.send(torch.zeros(1))
        except TypeError as exc:
            self.errors.append(str(exc))


@pytest.mark.rule("ports.instance-refused")
def test_a_port_made_in_a_hook_names_the_fix_at_its_first_use() -> None:
    """> A port assigned on an instance later, in a hook, fails at its first use with a
    > TypeError that says ports are declared on the class."""
    node = LateAssigner()
    with mujou.run(Bag(node=node), timer=vt()) as run:
        run.sleep(0.25)
    assert node.errors == [
        "this Output belongs to no node: it was made outside a class body (such as self.y = "
        "Output() in a hook); ports are declared on the class: write y = Output() in the class body"
    ]


@pytest.mark.rule("ports.instance-refused", "ports.declare")
def test_other_attributes_and_declared_ports_behave_as_before() -> None:
    """A node keeps any other attribute; a declared port still cannot be reassigned."""

    class Robot(Node):
        y = Output()

        def __init__(self) -> None:
            super().__init__()
            self.gain = 2.0
            self.alias = self.y  # the node's own port, under another name: not a new port

    robot = Robot()
    assert robot.gain == 2.0 and robot.alias is robot.y
    with pytest.raises(AttributeError, match=r"^port 'y' of Robot cannot be assigned"):
        robot.y = Output()  # the mistake, on purpose


# --------------------------------------------------------------------------------------------
# threads.rate


class Counter(Node):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dts: list[float] = []

    def on_update(self, dt: float) -> None:
        self.dts.append(dt)


@pytest.mark.rule("threads.rate")
def test_rate_gives_the_period_in_hertz() -> None:
    """> rate= gives the period in hertz: a node with rate=r has period == 1 / r."""
    assert Counter(rate=30).period == 1 / 30
    assert Counter(rate=fractions.Fraction(1, 2)).period == 2.0
    assert Counter(rate=None).period == 0.01
    node = Counter(rate=4)
    with mujou.run(Bag(node=node), timer=vt()) as run:
        run.sleep(1.0)
    assert node.dts == [0.25] * 4
    assert "rate" in inspect.signature(Node.__init__).parameters


@pytest.mark.rule("threads.rate")
@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        (
            {"rate": 30, "period": 0.1},
            TypeError,
            r"^give period= \(seconds between updates\) or rate= \(updates per second, Hz\), not "
            r"both; got period=0\.1 and rate=30$",
        ),
        ({"rate": 30, "period": None}, TypeError, r"^give period= .* got period=None and rate=30$"),
        ({"rate": 0}, ValueError, r"^rate must be a finite number of hertz > 0, got 0$"),
        ({"rate": -5.0}, ValueError, r"^rate must be a finite number of hertz > 0, got -5\.0$"),
        ({"rate": math.inf}, ValueError, r"^rate must be a finite number of hertz > 0, got inf$"),
        ({"rate": math.nan}, ValueError, r"^rate must be a finite number of hertz > 0, got nan$"),
        ({"rate": 5e-324}, ValueError, r"^rate must be a number of hertz whose period 1/rate is finite"),
        ({"rate": "30"}, TypeError, r"^rate must be a real number of hertz > 0, got str: '30'$"),
        ({"rate": True}, TypeError, r"^rate must be a real number of hertz > 0, got bool: True$"),
    ],
)
def test_bad_rates_are_refused(kwargs: dict[str, Any], error: type[Exception], pattern: str) -> None:
    """> It must be a finite real number > 0 (ValueError; TypeError if not a real number or a
    > bool); giving both rate and period (None included) raises TypeError naming both."""
    with pytest.raises(error, match=pattern):
        Counter(**kwargs)
