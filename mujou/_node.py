"""``Node``: the unit of a net, with its arguments, hooks, generator, context and ports."""

from __future__ import annotations

import contextvars
import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ._devices import parse_device
from ._port import Staged, _Port
from ._ports import Input
from ._state import cpu_copy, is_stateful, load_errors_message

if TYPE_CHECKING:
    from ._cuda import NodeStreams
    from ._engine import Engine
    from ._net import Net

_SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds in [0, 2**64)
_PORT_CACHE: dict[type, tuple[tuple[str, _Port], ...]] = {}


def _class_ports(cls: type) -> tuple[tuple[str, _Port], ...]:
    ports = _PORT_CACHE.get(cls)
    if ports is None:
        found: dict[str, _Port] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, _Port):
                    found[name] = value
                else:
                    found.pop(name, None)
        ports = _PORT_CACHE[cls] = tuple(found.items())
    return ports


class NodeCore:
    """Mujou's bookkeeping of one node, kept in ``node._mujou`` (one attribute, out of the way)."""

    __slots__ = (
        "attr",
        "context",
        "cpu",
        "dedicated",
        "device",
        "engine",
        "generator",
        "hook_thread",
        "parent",
        "period",
        "ports",
        "reads",
        "seed",
        "staged",
        "streams",
    )

    def __init__(
        self,
        period: float,
        seed: int,
        generator: torch.Generator,
        device: torch.device,
        dedicated: bool,
    ) -> None:
        self.period = period
        self.seed = seed
        self.generator = generator
        self.device = device
        self.cpu = device.type == "cpu"
        self.dedicated = dedicated
        # Each node's hooks run in this context, which starts empty: see threads.context.
        self.context = contextvars.Context()
        self.parent: Net | None = None
        self.attr = ""
        self.ports: dict[str, _Port] = {}
        self.hook_thread = 0  # the thread running a hook of this node now, else 0
        self.reads: list[tuple[Input[Any], torch.Tensor, int]] = []  # this hook's reads, checked after it
        # Where sends go: the engine's list of messages visible at the batch's end under the
        # virtual timer (visibility.virtual), else None (published at once). Set per run.
        self.staged: list[Staged] | None = None
        self.engine: Engine | None = None
        self.streams: NodeStreams | None = None  # set for the run when the node touches CUDA


def _check_period(period: object) -> float:
    if isinstance(period, bool) or not isinstance(period, numbers.Real):
        raise TypeError(
            f"period must be a real number of seconds > 0, got {type(period).__name__}: {period!r}"
        )
    value = float(period)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"period must be a finite number of seconds > 0, got {period!r}")
    return value


def _check_seed(seed: object) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be None or an int, got {type(seed).__name__}: {seed!r}")
    if not 0 <= seed < _SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64), got {seed!r}")
    return seed


class Node:
    """A part of a net that updates on its own at its own period, on a worker or its own thread.

    Subclass it, call ``super().__init__(...)`` first in ``__init__``, declare ports as class
    attributes and override the hooks you need. See :ref:`threads.node-arguments`.

    Args:
        period: Seconds of the run's timer between two updates on average (finite, > 0).
        seed: The seed of ``self.generator``; None draws a nondeterministic one.
        device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:N"`` or a torch.device).
        dedicated_thread: Run this node's hooks on a thread of its own instead of the workers.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument has a value that is not allowed.
    """

    _mujou: NodeCore

    def __init__(
        self,
        *,
        period: float = 0.01,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        dedicated_thread: bool = False,
    ) -> None:
        checked_period = _check_period(period)
        checked_seed = _check_seed(seed)
        parsed = parse_device(device)
        if not isinstance(dedicated_thread, bool):
            raise TypeError(
                "dedicated_thread must be a bool, "
                f"got {type(dedicated_thread).__name__}: {dedicated_thread!r}"
            )
        generator = torch.Generator(device=parsed)
        if checked_seed is None:
            checked_seed = generator.seed()
        else:
            generator.manual_seed(checked_seed)
        core = NodeCore(checked_period, checked_seed, generator, parsed, dedicated_thread)
        self._mujou = core
        for attr, declared in _class_ports(type(self)):
            # The instance dict: node.attr finds it there (see _ports' docstring).
            self.__dict__[attr] = core.ports[attr] = declared._bound_copy(self, core)

    # Read-only properties: see threads.node-properties.

    @property
    def period(self) -> float:
        """Seconds of the run's timer between two updates on average."""
        return _core(self).period

    @property
    def seed(self) -> int:
        """The seed ``self.generator`` was made from (drawn at random when none was given)."""
        return _core(self).seed

    @property
    def generator(self) -> torch.Generator:
        """The node's own random generator, on its device; its state is in the node's state."""
        return _core(self).generator

    @property
    def device(self) -> torch.device:
        """Where the node computes; received messages arrive there."""
        return _core(self).device

    @property
    def dedicated_thread(self) -> bool:
        """Whether the node runs on a thread of its own instead of the run's workers."""
        return _core(self).dedicated

    @property
    def name(self) -> str:
        """The node's dotted path in the outermost net that holds it, or "" outside any net."""
        core = _core(self)
        parts: list[str] = []
        attr, parent = core.attr, core.parent
        while parent is not None:
            parts.append(attr)
            attr, parent = parent._attr, parent._parent
        return ".".join(reversed(parts))

    # Hooks: each is called by Mujou, on the node's worker or thread, never two at once.

    def on_start(self) -> None:
        """Called once when the run starts, before the node's first update."""

    def on_update(self, dt: float) -> None:
        """Called at each update, ``dt`` timer seconds after the previous one started."""

    def on_stop(self) -> None:
        """Called once when the run stops, after the node's last update."""

    def state_dict(self) -> dict[str, Any]:
        """Called to take the node's state: the generator, tensors and stateful attributes.

        The default holds ``"generator"`` and every attribute that is a tensor or has
        ``state_dict``/``load_state_dict``, as CPU copies. See :ref:`state.default-node-state`.
        """
        state: dict[str, Any] = {"generator": self.generator.get_state()}
        for key, value in vars(self).items():
            if key == "_mujou":
                continue
            if isinstance(value, torch.Tensor):
                state[key] = cpu_copy(value)
            elif is_stateful(value):
                state[key] = cpu_copy(value.state_dict())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Called to restore the state that ``state_dict`` took, after ``on_start``.

        Strict: a missing or unexpected key raises ValueError. Tensors are copied back to
        the node's device, in place when the attribute already holds a tensor of that shape.
        See :ref:`state.default-load`.
        """
        expected = {"generator"}
        for key, value in vars(self).items():
            if key != "_mujou" and (isinstance(value, torch.Tensor) or is_stateful(value)):
                expected.add(key)
        missing = sorted(expected - state.keys())
        unexpected = sorted(state.keys() - expected)
        if missing or unexpected:
            raise ValueError(load_errors_message(missing, unexpected))
        generator_state = state["generator"]
        if not isinstance(generator_state, torch.Tensor):
            raise ValueError("'generator' must hold a tensor from Generator.get_state()")
        self.generator.set_state(generator_state)
        for key in expected - {"generator"}:
            current, saved = getattr(self, key), state[key]
            if isinstance(current, torch.Tensor):
                if not isinstance(saved, torch.Tensor):
                    raise ValueError(f"{key!r} must hold a tensor, got {type(saved).__name__}")
                if current.shape == saved.shape and current.dtype == saved.dtype:
                    with torch.no_grad():
                        current.copy_(saved)
                else:
                    setattr(self, key, saved.to(self.device))
            else:
                current.load_state_dict(saved)


def _core(node: Node) -> NodeCore:
    """The node's bookkeeping, or a clear error when ``super().__init__()`` was not called."""
    try:
        return node.__dict__["_mujou"]  # type: ignore[no-any-return]  # vars() is dict[str, Any]
    except KeyError:
        raise TypeError(not_initialized_message(node)) from None


def not_initialized_message(node: object) -> str:
    """The error for a node whose class's ``__init__`` did not call ``super().__init__()``."""
    cls = type(node).__name__
    return (
        f"{cls} was not initialized as a mujou.Node: call super().__init__() at the start of {cls}.__init__"
    )


def is_initialized(node: Node) -> bool:
    """Whether ``Node.__init__`` ran for ``node``."""
    return "_mujou" in node.__dict__
