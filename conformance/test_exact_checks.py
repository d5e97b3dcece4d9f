"""Conformance tests of two checks at their edges: a scalar of a port's declaration is of
exactly its type, no subclass (``ports.typed``, ``ports.typed-check``), and a container held
twice in a node's attribute, without a cycle, is a plain value of the default state
(``state.default-node-state``).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest
import torch
from _support import Bag, vt

import mujou
from mujou import Input, Node, Output

SCALARS = {"n": int, "s": str, "f": float, "b": bool}
GOOD: dict[str, Any] = {"n": 1, "s": "x", "f": 1.0, "b": False}
# A bool is the one scalar of a message whose type is a subclass of another's (int): each
# case puts one where the declaration says int, with the error's tail.
SUBCLASSED: list[tuple[str, object, str]] = [
    ("n", True, "at ['n'] int, got bool True"),
    ("n", False, "at ['n'] int, got bool False"),
]


class ScalarSender(Node):
    """Sends each of ``values`` on its declared output and on its undeclared one (which feeds a
    declared input), one pair per update; keeps the errors ("" for none)."""

    declared: Output[dict[str, Any]] = Output(spec=SCALARS)
    plain: Output[dict[str, Any]] = Output()

    def __init__(self, values: list[dict[str, Any]]) -> None:
        super().__init__(period=0.25)
        self.values = values
        self.errors: list[tuple[str, str]] = []

    def on_update(self, dt: float) -> None:
        for value in self.values:
            found = []
            for port in (self.declared, self.plain):
                try:
                    port.send(value)
                except TypeError as exc:
                    found.append(str(exc))
                else:
                    found.append("")
            self.errors.append((found[0], found[1]))
        self.values = []


class ScalarReader(Node):
    x: Input[dict[str, Any]] = Input(optional=True, spec=SCALARS)


@pytest.mark.rule("ports.typed", "ports.typed-check")
def test_a_scalar_declaration_refuses_its_types_subclasses() -> None:
    """> bool, int, float, str or None for a scalar of exactly that type ...
    > A message that does not match a declaration raises TypeError naming the port, the
    > declaration and what was received: at send, against the output's declaration and those
    > of the inputs it feeds; at run.write and for inputs=, against the input's declaration.

    ``True`` is an ``int`` to ``isinstance``, but not a message for a port that declares an
    ``int`` (a subclass of a scalar type is no message at all, by ports.message). Planted: the
    scalar check by ``isinstance`` instead of the exact type (``_specs._leaf_matches``); the
    bools then pass, and this fails."""
    values = [GOOD, *({**GOOD, key: value} for key, value, _ in SUBCLASSED)]
    sender, reader, written = ScalarSender(values), ScalarReader(), ScalarReader()
    net = Bag(sender=sender, reader=reader, written=written)
    net.connect(sender.plain, reader.x)
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.25)
        assert sender.errors[0] == ("", "")
        for (declared, fed), (_, _, tail) in zip(sender.errors[1:], SUBCLASSED, strict=True):
            assert declared.startswith("port 'sender.declared' expects " + tail), declared
            assert fed.startswith("port 'sender.plain' sends to input 'reader.x', which expects " + tail), fed
        run.write(written.x, GOOD)
        for key, value, tail in SUBCLASSED:
            with pytest.raises(TypeError, match=r"^run\.write\(\): input 'written\.x' expects ") as info:
                run.write(written.x, {**GOOD, key: value})
            assert tail in str(info.value), str(info.value)
        assert run.read(written.x) == GOOD
    other = ScalarReader()
    with pytest.raises(TypeError, match=r"^inputs\['reader\.x'\]: input 'reader\.x' expects at \['n'\] int"):
        mujou.run(Bag(reader=other), timer=vt(), inputs={other.x: {**GOOD, "n": True}})


class Sharing(Node):
    """Holds the same list twice, and the same tuple and dict under two keys: no cycle."""

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=1)
        row = [1.0, 2.0]
        self.grid = [row, row]
        point = (3, "p")
        self.by_key = {"a": point, "b": point}
        inner = {"k": [row]}
        self.nested = ([inner, inner], inner)
        self.shared_tensor = [torch.ones(2)] * 2
        self.updates = 0

    def on_update(self, dt: float) -> None:
        self.updates += 1
        self.grid = [self.grid[0], self.grid[0]]  # still shared after each update


@pytest.mark.rule("state.default-node-state", "state.default-load")
def test_a_container_held_twice_without_a_cycle_is_a_plain_value(tmp_path: Any) -> None:
    """> ... or a list, tuple or dict (whose keys are such scalars) of plain values and tensors.

    A list held twice in one attribute holds nothing but plain values: the default state
    keeps it, names it in no warning, and a resume loads it back. Planted: a container never
    taken off the set of open containers after its items were checked (``_plain._plain``
    without the ``discard``), so that its second occurrence looks like a cycle; the four
    attributes are then left out with a warning, and this fails."""
    node = Sharing()
    with warnings.catch_warnings():
        warnings.simplefilter("error", mujou.UnsavedAttributeWarning)
        state = node.state_dict()
    assert set(state) == {"generator", "grid", "by_key", "nested", "shared_tensor", "updates"}, sorted(state)
    assert state["grid"] == [[1.0, 2.0], [1.0, 2.0]]
    assert state["by_key"] == {"a": (3, "p"), "b": (3, "p")}
    assert state["nested"] == ([{"k": [[1.0, 2.0]]}, {"k": [[1.0, 2.0]]}], {"k": [[1.0, 2.0]]})
    assert all(torch.equal(t, torch.ones(2)) for t in state["shared_tensor"])
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["grid"] == [[1.0, 2.0], [1.0, 2.0]]
    # Through a run, a file and a resume.
    with mujou.run(Bag(node=Sharing()), timer=vt()) as run:
        run.sleep(0.5)
        mujou.save(run.state_dict(), tmp_path / "state.pt")
    resumed = Sharing()
    resumed.grid = []
    with mujou.run(Bag(node=resumed), timer=vt(), state=mujou.load(tmp_path / "state.pt")) as run:
        assert resumed.grid == [[1.0, 2.0], [1.0, 2.0]] and resumed.updates == 2
        run.sleep(0.25)
    assert resumed.updates == 3
