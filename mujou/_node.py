"""``Node``: the unit of a net, with its arguments, hooks, generator, context and ports."""

from __future__ import annotations

import contextvars
import difflib
import functools
import inspect
import math
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol

import torch

from ._devices import parse_device
from ._errors import HookNameWarning
from ._messages import with_article
from ._net_text import node_text
from ._node_args import DEFAULT_PERIOD, check_period, check_seed, check_trigger_timing, period_from_rate
from ._plain import is_plain
from ._port import PortNode, Staged, _Port
from ._ports import Input
from ._state import copy_to, cpu_copy, is_stateful, load_errors_message
from ._trigger import Trigger, check_trigger
from ._unsaved import warn_unsaved

if TYPE_CHECKING:
    from ._cuda import NodeStreams
    from ._in_run import WarningQueue

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


class Parent(Protocol):
    """What a node reads of the net or node container that holds it (``_net.Branch``)."""

    @property
    def name(self) -> str: ...
    @property
    def _attr(self) -> str: ...
    @property
    def _parent(self) -> Parent | None: ...


class NodeCore:
    """Mujou's bookkeeping of one node, kept in ``node._mujou`` (one attribute, out of the way)."""

    __slots__ = (
        "attr",
        "context",
        "cpu",
        "dedicated",
        "delay",
        "device",
        "engine",
        "generator",
        "hook_thread",
        "hooks",
        "min_interval",
        "own_seed",
        "parent",
        "period",
        "ports",
        "reads",
        "seed",
        "staged",
        "streams",
        "trigger",
    )

    def __init__(
        self,
        period: float,
        seed: int,
        generator: torch.Generator,
        device: torch.device,
        dedicated: bool,
    ) -> None:
        self.period = period  # inf: triggered only
        self.trigger: Trigger | None = None
        self.min_interval = 0.0
        self.delay = 0.0
        self.seed = seed
        self.own_seed = True  # given with Node(seed=...): no run reseeds it (threads.derived-seed)
        self.generator = generator
        self.device = device
        self.cpu = device.type == "cpu"
        self.dedicated = dedicated
        # Each node's hooks run in this context, which starts empty: see threads.context.
        self.context = contextvars.Context()
        self.parent: Parent | None = None  # the net or node container that holds the node
        self.attr = ""
        self.ports: dict[str, _Port] = {}
        self.hook_thread = 0  # the thread running a hook of this node now, else 0
        self.hooks: WarningQueue | None = None  # the hook caller of the node's latest run
        self.reads: list[tuple[_Port, torch.Tensor, int]] = []  # this hook's reads, checked after it
        # Where sends go: the engine's list of messages visible at the batch's end under the
        # virtual timer (visibility.virtual), else None (published at once). Set per run.
        self.staged: list[Staged] | None = None
        self.engine: object | None = None  # the engine of the run the node is in, else None
        self.streams: NodeStreams | None = None  # set for the run when the node touches CUDA


class Node:
    """A part of a net that updates on its own at its own period, on a worker or its own thread.

    Subclass it, call ``super().__init__(...)`` first in ``__init__``, declare ports as class
    attributes and override the hooks you need. See :ref:`threads.node-arguments`.

    Args:
        period: Seconds of the run's timer between two updates on average (finite, > 0);
            None (the default when a ``trigger`` is given): only the trigger updates it.
        rate: Updates per second (Hz) instead of ``period``: ``rate=30`` is ``period=1/30``.
        trigger: Update also (or only) when inputs get new messages: :func:`mujou.on` or
            :func:`mujou.on_all`. See :ref:`trigger.any`.
        min_interval: Timer seconds (>= 0) that at least separate a triggered update from
            the previous update; arrivals meanwhile make one update at the interval's end.
        delay: Timer seconds (>= 0) from the arrival that triggers an update to its due time.
        seed: The seed of ``self.generator``; None: each run seeds it from the run's seed and
            the node's name (see :ref:`threads.derived-seed`), and until the first run it has
            a nondeterministic one.
        device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:N"`` or a torch.device).
        dedicated_thread: Run this node's hooks on a thread of its own instead of the workers.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument has a value that is not allowed.
    """

    _mujou: NodeCore
    state_exclude: ClassVar[tuple[str, ...]] = ()
    """Names of attributes the default ``state_dict`` leaves out (with those of the bases).

    For what a node keeps but should not resume: a cache, a file, a callback, settings that
    the new net's ``__init__`` gives. See :ref:`state.exclude`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check the class once, when it is defined: its hooks' signatures and names, ``state_exclude``.

        See :ref:`nodes.hook-signature` and :ref:`nodes.hook-name-warning`.
        """
        super().__init_subclass__(**kwargs)
        if "state_exclude" in cls.__dict__:
            _check_exclude(cls, cls.__dict__["state_exclude"])
        for name, value in list(cls.__dict__.items()):
            if name in HOOK_PARAMETERS:
                _check_hook_signature(cls, name, value)
            else:
                _check_hook_name(cls, name, value)
        init = cls.__dict__.get("__init__")
        if inspect.isfunction(init):
            cls.__init__ = _refusing_instance_ports(init)  # type: ignore[method-assign]  # wrapped once, at class creation

    def __init__(
        self,
        *,
        period: float | None = DEFAULT_PERIOD,
        rate: float | None = None,
        trigger: Trigger | None = None,
        min_interval: float = 0.0,
        delay: float = 0.0,
        seed: int | None = None,
        device: str | torch.device = "cpu",
        dedicated_thread: bool = False,
    ) -> None:
        ports = _class_ports(type(self))
        checked_trigger = check_trigger(
            type(self),
            trigger,
            [name for name, port in ports if isinstance(port, Input)],
            [name for name, port in ports if not isinstance(port, Input)],
        )
        checked_period = check_period(period_from_rate(period, rate), checked_trigger)
        checked_interval = check_trigger_timing("min_interval", min_interval, checked_trigger)
        checked_delay = check_trigger_timing("delay", delay, checked_trigger)
        checked_seed = check_seed(seed)
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
        core.own_seed = seed is not None
        core.trigger = checked_trigger
        core.min_interval = checked_interval
        core.delay = checked_delay
        self._mujou = core
        for attr, declared in ports:
            # The instance dict: node.attr finds it there (see _ports' docstring).
            self.__dict__[attr] = core.ports[attr] = declared._bound_copy(self, core)

    # Read-only properties: see threads.node-properties.

    @property
    def period(self) -> float | None:
        """Seconds of the run's timer between two updates on average, or None when only a
        trigger updates the node."""
        period = _core(self).period
        return None if period == math.inf else period

    @property
    def trigger(self) -> Trigger | None:
        """What updates the node on its inputs (:func:`mujou.on`, :func:`mujou.on_all`), or None."""
        return _core(self).trigger

    @property
    def min_interval(self) -> float:
        """Timer seconds that at least separate a triggered update from the previous one."""
        return _core(self).min_interval

    @property
    def delay(self) -> float:
        """Timer seconds from a triggering arrival to the update's due time."""
        return _core(self).delay

    @property
    def seed(self) -> int:
        """The seed ``self.generator`` was last seeded with: the node's own, else the one its
        latest run derived (see :ref:`threads.derived-seed`), else one drawn at random."""
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
        """Called to take the node's state: the generator, tensors, stateful and plain attributes.

        The default holds ``"generator"`` and, by name, every attribute that is a tensor, has
        ``state_dict``/``load_state_dict``, or is a plain value (numbers, strings, None, and
        lists, tuples and dicts of them and of tensors), as CPU copies. It leaves out the
        ports and the names in ``state_exclude``; any other attribute is named once in an
        :class:`UnsavedAttributeWarning`. See :ref:`state.default-node-state`.
        """
        state: dict[str, Any] = {"generator": self.generator.get_state()}
        unsaved: list[tuple[str, object]] = []
        for key, value in _state_attributes(self):
            if isinstance(value, torch.Tensor):
                state[key] = cpu_copy(value)
            elif _stateful(value):
                state[key] = cpu_copy(value.state_dict())
            elif is_plain(value):
                state[key] = cpu_copy(value)
            else:
                unsaved.append((key, value))
        if unsaved:
            core = self._mujou
            warn_unsaved(
                type(self), self.name, core.hooks, core.hook_thread == threading.get_ident(), unsaved
            )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Called to restore the state that ``state_dict`` took, after ``on_start``.

        Strict: a missing or unexpected key raises ValueError. Tensors are copied back to
        the node's device, in place when the attribute already holds a tensor of that shape;
        plain values are assigned (as copies, their tensors on the node's device).
        See :ref:`state.default-load`.
        """
        kept = {
            key: value
            for key, value in _state_attributes(self)
            if isinstance(value, torch.Tensor) or _stateful(value) or is_plain(value)
        }
        expected = {"generator", *kept}
        missing = sorted(expected - state.keys())
        unexpected = sorted(state.keys() - expected)
        if missing or unexpected:
            raise ValueError(load_errors_message(missing, unexpected))
        generator_state = state["generator"]
        if not isinstance(generator_state, torch.Tensor):
            raise ValueError("'generator' must hold a tensor from Generator.get_state()")
        self.generator.set_state(generator_state)
        for key, current in kept.items():
            saved = state[key]
            if isinstance(current, torch.Tensor):
                if not isinstance(saved, torch.Tensor):
                    raise ValueError(f"{key!r} must hold a tensor, got {type(saved).__name__}")
                if current.shape == saved.shape and current.dtype == saved.dtype:
                    with torch.no_grad():
                        current.copy_(saved)
                else:
                    setattr(self, key, saved.detach().to(self.device, copy=True))
            elif _stateful(current):
                current.load_state_dict(saved)
            else:
                if not is_plain(saved):
                    raise ValueError(
                        f"{key!r} must hold a plain value (None, a number, a string, a tensor, or a "
                        f"list, tuple or dict of them), got {type(saved).__name__}"
                    )
                setattr(self, key, copy_to(saved, self.device))

    def __str__(self) -> str:
        """The node's line in a printed net, then its ports: see :ref:`net.print`."""
        try:
            return node_text(self)
        except Exception:  # printing must not fail, even while another thread changes the net
            return repr(self)

    def __repr__(self) -> str:
        """``<Sensor 'sensor' period=0.01 cpu>``: class, name, period, device; never raises."""
        cls = type(self).__name__
        try:
            core = self.__dict__.get("_mujou")
            if not isinstance(core, NodeCore):
                return f"<{cls} (not initialized: no super().__init__())>"
            name = self.name
            where = f" {name!r}" if name else " (in no net)"
            thread = " dedicated_thread" if core.dedicated else ""
            when = f"period={core.period:g}" if core.period != math.inf else "period=None"
            if core.trigger is not None:
                when += f" trigger={core.trigger!r}"
            return f"<{cls}{where} {when} {core.device}{thread}>"
        except Exception:  # a repr must not fail, even while another thread changes the net
            return f"<{cls}>"


def _core(node: PortNode) -> NodeCore:
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


# -- the checks of a node class, when it is defined -------------------------------------------

# The hooks Mujou calls, with the arguments it passes (positionally, after self).
HOOK_PARAMETERS: Final[Mapping[str, tuple[str, ...]]] = {
    "on_start": (),
    "on_update": ("dt",),
    "on_stop": (),
    "state_dict": (),
    "load_state_dict": ("state",),
}
# A method's name resembles a hook's when, lower-cased and without underscores, difflib finds
# them this close (0.8: "update" ~ "on_update", "stop" ~ "on_stop"; "state" !~ "state_dict").
_NAME_CUTOFF: Final = 0.8
_FOLDED_HOOKS: Final = {name.replace("_", ""): name for name in HOOK_PARAMETERS}


def _fold(name: str) -> str:
    return name.lower().replace("_", "")


def _function_of(value: object) -> tuple[Callable[..., Any], bool] | None:
    """The function a class attribute defines, and whether it is bound when called; else None."""
    if isinstance(value, staticmethod):
        return value.__func__, False
    if isinstance(value, classmethod):
        return value.__func__, True
    if inspect.isfunction(value):
        return value, True
    return None


def _check_hook_signature(cls: type, name: str, value: object) -> None:
    """Refuse a hook that cannot be called as Mujou calls it (nodes.hook-signature)."""
    found = _function_of(value)
    if found is None:
        return  # not a function: nothing to read a signature from
    function, bound = found
    params = HOOK_PARAMETERS[name]
    expected = f"def {name}({', '.join(('self', *params))})"
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        raise TypeError(
            f"{cls.__name__}.{name} is async; Mujou calls hooks as plain functions and "
            f"never awaits them: define it as {expected}"
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read (a C function): checked when called
        return
    try:
        signature.bind(*([None] if bound else []), *([None] * len(params)))
    except TypeError:
        called = f"node.{name}({', '.join(params)})"
        bare = signature.replace(  # the parameters alone: annotations would only lengthen it
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise TypeError(
            f"{cls.__name__}.{name}{bare} cannot be called as Mujou calls it, "
            f"{called}: define it as {expected}"
        ) from None


def _check_hook_name(cls: type, name: str, value: object) -> None:
    """Warn when a method's name resembles a hook's name (nodes.hook-name-warning)."""
    if name.startswith("_") or hasattr(Node, name):
        return  # private names, and what Node defines, are never hooks misspelled
    found = _function_of(value)
    if found is None:
        return
    close = difflib.get_close_matches(_fold(name), _FOLDED_HOOKS, n=1, cutoff=_NAME_CUTOFF)
    if not close:
        return
    hook = _FOLDED_HOOKS[close[0]]
    function = inspect.unwrap(found[0])
    code = getattr(function, "__code__", None)
    message = (
        f"{cls.__name__}.{name} looks like the hook {hook}, which Mujou calls; Mujou never "
        f"calls {name}. Rename it {hook} if it is meant as the hook; if it is a method of "
        f"your own, give it a name further from {hook} or starting with '_'"
    )
    if code is None:
        warnings.warn(message, HookNameWarning, stacklevel=3)
        return
    module = getattr(function, "__module__", None) or "<unknown>"
    registry = getattr(function, "__globals__", {}).setdefault("__warningregistry__", {})
    # At the method's own line, so the filter and the report point to the misspelled def.
    warnings.warn_explicit(message, HookNameWarning, code.co_filename, code.co_firstlineno, module, registry)


def _refusing_instance_ports(init: Callable[..., None]) -> Callable[..., None]:
    """``init``, then a refusal of any port it assigned on the instance (ports.instance-refused).

    The check runs once per construction, after the class's own ``__init__``, so that setting
    an attribute in a hook costs what it costs on any object.
    """

    @functools.wraps(init)
    def checked(self: Node, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for name, value in vars(self).items():
            if isinstance(value, _Port) and value._node is None:
                raise AttributeError(instance_port_message(type(self), name, value))

    return checked


def instance_port_message(cls: type, name: str, port: object) -> str:
    """The error for a port assigned on a node instance (ports.instance-refused)."""
    kind = type(port).__name__
    return (
        f"{cls.__name__}.{name}: {with_article(kind)} cannot be assigned on a node instance; ports "
        f"are declared on the class: write {name} = {kind}(...) in the body of class "
        f"{cls.__name__}, not self.{name} = {kind}(...) in a method"
    )


# -- the default state: which attributes it keeps ---------------------------------------------


def _stateful(value: object) -> bool:
    """Whether the default state keeps ``value`` by its own ``state_dict`` (not a node's)."""
    return is_stateful(value) and not isinstance(value, Node)


def _state_attributes(node: Node) -> Iterator[tuple[str, Any]]:
    """The instance attributes the default state looks at: not Mujou's, the ports, the excluded."""
    core = _core(node)
    excluded = _excluded(type(node))
    for key, value in list(vars(node).items()):
        if key != "_mujou" and key not in core.ports and key not in excluded:
            yield key, value


def _check_exclude(cls: type, names: object) -> tuple[str, ...]:
    if isinstance(names, tuple | list | set | frozenset) and all(isinstance(n, str) for n in names):
        return tuple(names)
    raise TypeError(
        f"{cls.__name__}.state_exclude must be a tuple of attribute names, such as "
        f"('cache',), got {type(names).__name__}: {names!r}"
    )


def _excluded(cls: type) -> set[str]:
    """The names in ``state_exclude`` of ``cls`` and its bases."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "state_exclude" in klass.__dict__:
            names.update(_check_exclude(klass, klass.__dict__["state_exclude"]))
    return names
