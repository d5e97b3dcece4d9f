"""Conformance tests for the spec page "Overview" (spec/en/overview.md).

Modelled on trio's ``test_exports.py``: the public surface of Mujou is exactly ``mujou.__all__``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest
import torch

import mujou
from mujou import Input, Net, Node, Output

# The names api.md promises, and nothing else.
DOCUMENTED_API = frozenset(
    {
        "Node",
        "Input",
        "Output",
        "TensorSpec",
        "Net",
        "NodeList",
        "NodeDict",
        "on",
        "on_all",
        "Trigger",
        "run",
        "Run",
        "Subscription",
        "Timer",
        "RealTimeTimer",
        "VirtualTimer",
        "save",
        "load",
        "plot_trace",
        "Recording",
        "RecordedMessage",
        "RecordedPort",
        "HookError",
        "MujouWarning",
        "OversubscriptionWarning",
        "LeakedSettingWarning",
        "GlobalRandomWarning",
        "UnsavedAttributeWarning",
        "HookNameWarning",
        "TruncatedRecordingWarning",
        "RecordingVersionWarning",
        "RunStats",
        "NodeStats",
        "HostStats",
        "MujouInternalError",
        "StateFileError",
        "ProcessError",
        "Recorder",
        "Replay",
        "OnHost",
        "OnRay",
        "HostError",
        "serve_ranks",
    }
)


def _public_names(module: types.ModuleType) -> set[str]:
    """The non-underscore names of ``module`` that are not submodules."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }


@pytest.mark.rule("overview.public-api")
def test_all_is_the_documented_api() -> None:
    """> The public API is exactly the names in `mujou.__all__`."""
    assert isinstance(mujou.__all__, (list, tuple)), type(mujou.__all__)
    names = list(mujou.__all__)
    assert len(names) == len(set(names)), f"duplicates in mujou.__all__: {sorted(names)}"
    assert set(names) == DOCUMENTED_API, (
        f"missing: {sorted(DOCUMENTED_API - set(names))}, undocumented: {sorted(set(names) - DOCUMENTED_API)}"
    )


@pytest.mark.rule("overview.public-api")
@pytest.mark.parametrize("name", sorted(DOCUMENTED_API))
def test_each_exported_name(name: str) -> None:
    """> each is importable from `mujou`, has a docstring, and reports `__module__ == "mujou"`."""
    assert name in mujou.__all__
    assert hasattr(mujou, name), f"mujou.__all__ lists {name!r} but mujou has no such attribute"
    obj = getattr(mujou, name)
    namespace: dict[str, object] = {}
    exec(f"from mujou import {name} as imported", namespace)
    assert namespace["imported"] is obj
    doc = inspect.getdoc(obj)
    assert doc, f"mujou.{name} has no docstring"
    # inspect.getdoc inherits docstrings; the object itself must have one.
    assert obj.__doc__, f"mujou.{name} has no docstring of its own"
    assert getattr(obj, "__module__", None) == "mujou", (
        f"mujou.{name}.__module__ == {getattr(obj, '__module__', None)!r}, expected 'mujou'"
    )
    qualname = getattr(obj, "__qualname__", None)
    assert qualname == name, f"mujou.{name}.__qualname__ == {qualname!r}"


@pytest.mark.rule("overview.public-api")
def test_no_public_name_outside_all() -> None:
    """> Every other module and name is private and may change."""
    extra = _public_names(mujou) - set(mujou.__all__)
    assert not extra, f"public names of mujou not in __all__: {sorted(extra)}"


@pytest.mark.rule("overview.public-api")
def test_submodules_are_private() -> None:
    """> Every other module and name is private and may change."""
    path = getattr(mujou, "__path__", None)
    assert path is not None, "mujou is a package"
    public = [info.name for info in pkgutil.iter_modules(path) if not info.name.startswith("_")]
    assert public == ["testing"], f"public submodules of mujou: {public}"  # overview.testing-module
    # Importing every private module adds no public name to mujou itself.
    for info in pkgutil.iter_modules(path):
        if info.name != "__main__":
            importlib.import_module(f"mujou.{info.name}")
    extra = _public_names(mujou) - set(mujou.__all__)
    assert not extra, f"public names of mujou not in __all__: {sorted(extra)}"


@pytest.mark.rule("overview.public-api")
def test_public_classes_document_their_public_methods() -> None:
    """> each [name] ... has a docstring (and so does each public method of a public class)."""
    undocumented: list[str] = []
    for name in mujou.__all__:
        obj = getattr(mujou, name)
        if not isinstance(obj, type) or issubclass(obj, BaseException):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            is_api = callable(value) or isinstance(value, (property, staticmethod, classmethod))
            if is_api and not inspect.getdoc(getattr(obj, attr)):
                undocumented.append(f"mujou.{name}.{attr}")
    assert not undocumented, f"public methods without a docstring: {undocumented}"


@pytest.mark.rule("overview.run-no-constructor")
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((Net(),), {}), ((), {"net": Net()}), ((1, 2, 3), {"x": 4})],
    ids=["no-arguments", "a-net", "net-keyword", "junk"],
)
def test_run_has_no_public_constructor(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    """> `mujou.Run` has no public constructor: `mujou.Run(...)` raises TypeError
    > "mujou.Run has no public constructor; use mujou.run(net)"."""
    with pytest.raises(TypeError, match=r"^mujou\.Run has no public constructor; use mujou\.run\(net\)$"):
        mujou.Run(*args, **kwargs)


class _Counter(Node):
    """A node that counts its updates and sends the count."""

    count = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.n = 0

    def on_update(self, dt: float) -> None:
        self.n += 1
        self.count.send(torch.tensor(self.n))


class _Doubler(Node):
    """A node that doubles what it reads."""

    x = Input()
    y = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)

    def on_update(self, dt: float) -> None:
        x = self.x.read()
        if x is not None:
            self.y.send(2 * x)


class _FirstNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.counter = _Counter()
        self.doubler = _Doubler()
        self.connect(self.counter.count, self.doubler.x)


@pytest.mark.rule("overview.run-no-constructor")
def test_run_comes_from_mujou_run() -> None:
    """> A Run comes only from `mujou.run`."""
    net = _FirstNet()
    with mujou.run(net, timer=mujou.VirtualTimer()) as run:
        assert type(run) is mujou.Run
        run.sleep(1.0)
        # A first net: the counter sent 4 (at t=1.0), which the doubler saw as 3 (sent at 0.75).
        assert run.read(net.counter.count) == torch.tensor(4)
        assert run.read(net.doubler.y) == torch.tensor(6)
    assert not run.running
