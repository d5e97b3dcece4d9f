"""What inputs and outputs share: ``_Port``, and a published message as one reference.

See ``_ports.py`` for the ports themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import torch
from typing_extensions import TypeVar

from ._messages import Nest
from ._specs import Declared, declare

if TYPE_CHECKING:
    from ._cuda import NodeStreams
    from ._trigger import Trigger

M = TypeVar("M", default=torch.Tensor)  # the type of a port's messages, for type checkers
Watcher = Callable[[Any], None]
# A published message, as one reference, so a reader on another thread sees all of one
# message, never parts of two: (message, its version counter when sent (a bare tensor), what
# a nest was when sent (None for a bare tensor), the timer time it was sent, its number on
# this port: 1, 2, ... (Input.fresh compares these), and whether it is a bare tensor on the
# CPU: Input.read's common case, asked once when it is published instead of at each read).
Latest = tuple[Any, int, Nest | None, float, int, bool]
# A message sent under the virtual timer, visible once the instant ends: the port and a
# Latest without its number, which it gets when it is published.
Staged = tuple["_Port", Any, int, Nest | None, float]
# Guards replacing a port's watchers (subscribe, wait_for and their ends, from any host
# thread): adding and removing are rare, so one lock serves every port.
_WATCHERS_LOCK = threading.Lock()


class PortNode(Protocol):
    """The node a port belongs to, as its port sees it: the public properties of a
    :class:`~mujou.Node` (``port.node`` is the node itself; this module sits below ``Node``)."""

    @property
    def name(self) -> str:
        """The node's dotted path in the outermost net that holds it, or "" outside any net."""
        ...

    @property
    def period(self) -> float | None:
        """Seconds of the run's timer between two updates, or None (triggered only)."""
        ...

    @property
    def trigger(self) -> Trigger | None:
        """What updates the node on its inputs, or None."""
        ...

    @property
    def min_interval(self) -> float:
        """Timer seconds that at least separate a triggered update from the previous one."""
        ...

    @property
    def delay(self) -> float:
        """Timer seconds from a triggering arrival to the update's due time."""
        ...

    @property
    def seed(self) -> int:
        """The seed the node's generator was last seeded with."""
        ...

    @property
    def generator(self) -> torch.Generator:
        """The node's own random generator."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the node computes; received messages arrive there."""
        ...

    @property
    def dedicated_thread(self) -> bool:
        """Whether the node runs on a thread of its own instead of the run's workers."""
        ...


class PortCore(Protocol):
    """What a port reads of its node's bookkeeping (``_node.NodeCore``), in the hot paths."""

    @property
    def hook_thread(self) -> int:
        """The thread running a hook of the node now, else 0."""
        ...

    @property
    def staged(self) -> list[Staged] | None:
        """Where sends go under the virtual timer (visible at the batch's end), else None."""
        ...

    @property
    def reads(self) -> list[tuple[_Port, torch.Tensor, int]]:
        """The messages the running hook read, with their versions: checked after it."""
        ...

    @property
    def device(self) -> torch.device:
        """The node's device."""
        ...

    @property
    def cpu(self) -> bool:
        """Whether the node's device is the CPU."""
        ...

    @property
    def streams(self) -> NodeStreams | None:
        """The node's CUDA streams in the run, when it touches CUDA."""
        ...

    @property
    def ports(self) -> dict[str, _Port]:
        """The node's ports by attribute name."""
        ...


class RunSlot(Protocol):
    """What a port reads of its node's place in a run, and tells it (the engine's ``Slot``)."""

    @property
    def last(self) -> float:
        """The timer time the node's running (or last) update started: a send's stamp."""
        ...

    @property
    def hook(self) -> str:
        """The hook of the node running now ("on_update", ...)."""
        ...

    @property
    def traced_at(self) -> tuple[str, float] | None:
        """Tracing: where the node's last update ran (a thread's name, a time in the slice)."""
        ...

    @property
    def sent(self) -> Callable[[_Port], None]:
        """Called with ``port`` when a message this node's update sent there wakes triggered
        nodes, before the send returns (it takes the engine's lock)."""
        ...


def bare_cpu(message: Any, nest: Nest | None) -> bool:
    """``Latest``'s last field: whether ``message`` is a bare tensor on the CPU (a nest, or a
    tensor elsewhere, is read the other way: ``Input._read_other``)."""
    return nest is None and isinstance(message, torch.Tensor) and message.is_cpu


class _Port:
    """What inputs and outputs share: a name, a node, a declaration, the latest message, watchers."""

    __slots__ = ("_attr", "_core", "_declared", "_hand", "_latest", "_lodge", "_node", "_wakes", "_watchers")

    def __init__(self, dtype: object = None, shape: object = None, spec: object = None) -> None:
        self._attr = ""
        self._node: PortNode | None = None
        self._core: PortCore | None = None  # the node's, for the hot paths
        self._latest: Latest | None = None  # replaced whole by each publish, read once
        # Replaced (under _WATCHERS_LOCK), never mutated, so a sender iterates it without a lock.
        self._watchers: tuple[Watcher, ...] = ()
        self._declared: Declared | None = declare(dtype, shape, spec)
        # The triggered nodes a message made visible here wakes, by their index in the run,
        # set for each run (the engine's _arrivals): an output's readers, or a host-fed
        # input's own node.
        self._wakes: tuple[int, ...] = ()
        # The one node in _wakes that a send may hand to the sender's worker, -1 for none (set
        # with _wakes; NOTE [ the send that hands off ] in the engine's _policy).
        self._hand = -1
        # An output's claim of ``_hand`` without the engine's lock, called with the message's
        # number after a send (None: none; NOTE [ the send that lodges ] in the engine's _lodge).
        self._lodge: Callable[[int], bool] | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = name

    def __set__(self, node: object, value: object) -> None:
        raise AttributeError(
            f"port {self._attr!r} of {type(node).__name__} cannot be assigned; "
            "ports are declared once on the class"
        )

    def _bound_copy(self, node: PortNode, core: PortCore) -> _Port:
        port = type(self).__new__(type(self))
        _Port.__init__(port)
        port._attr = self._attr
        port._node = node
        port._core = core
        port._declared = self._declared
        return port

    def _begin_run(self, slot: RunSlot) -> None:
        """A run of the node starts, in which ``slot`` is its place (see the subclasses)."""

    @property
    def node(self) -> PortNode:
        """The node this port belongs to (a :class:`Node`)."""
        if self._node is None:
            raise self._no_node()
        return self._node

    def _no_node(self) -> TypeError:
        """The error for a port that belongs to no node: the class's, or one made in a hook."""
        kind = type(self).__name__
        if not self._attr:  # made outside a class body: assigned on an instance, in a hook
            return TypeError(
                f"this {kind} belongs to no node: it was made outside a class body (such as "
                f"self.y = {kind}() in a hook); ports are declared on the class: write "
                f"y = {kind}() in the class body"
            )
        return TypeError(
            f"{kind} {self._attr!r} is the class attribute; use the port of a node instance (node.port)"
        )

    @property
    def name(self) -> str:
        """The port's dotted name, made of the node's name, a dot and the attribute name."""
        if self._node is None:
            return self._attr
        node_name = self._node.name
        return f"{node_name}.{self._attr}" if node_name else self._attr

    def _publish(self, message: Any, version: int, nest: Nest | None, stamp: float) -> None:
        """Make ``message`` the latest: sent at ``stamp``, with its versions when it was sent."""
        latest = self._latest
        number = 1 if latest is None else latest[4] + 1
        self._latest = (message, version, nest, stamp, number, bare_cpu(message, nest))
        for watcher in self._watchers:
            watcher(message)

    def _message(self) -> Any:
        """The message a reader of this port gets now (see Input for inputs)."""
        return self._checked_latest()

    def _checked_latest(self) -> Any:
        """The latest message, checked to be as it was published (ports.message-read-only)."""
        latest = self._latest
        if latest is None:
            return None
        message, version, nest, _, _, _ = latest
        if (message._version != version) if nest is None else not nest.unchanged(message):
            self._raise_changed()
        return message

    def _peek(self) -> Any:
        """The latest message as it is now, unchecked (run.wait_for)."""
        latest = self._latest
        return None if latest is None else latest[0]

    def _raise_changed(self) -> NoReturn:
        raise RuntimeError(
            f"the latest message on {self.name!r} was changed in place after it was sent, "
            "by a node that kept a message it read (or a view of it, as "
            "torch.nn.utils.vector_to_parameters makes), or by the sender after "
            "send(copy=False); messages are read-only: clone them before changing them or "
            "keeping them, and send with copy=False only a tensor the node no longer changes"
        )

    def _add_watcher(self, watcher: Watcher) -> None:
        with _WATCHERS_LOCK:
            self._watchers = (*self._watchers, watcher)

    def _remove_watcher(self, watcher: Watcher) -> None:
        with _WATCHERS_LOCK:
            # ==, not is: a bound method is a new object each time it is read.
            self._watchers = tuple(w for w in self._watchers if w != watcher)

    def _check_hook_thread(self, verb: str) -> PortCore:
        """The node's bookkeeping, when the calling thread runs a hook of the node; else an error."""
        core = self._core
        if self._node is None or core is None:
            raise self._no_node()
        if core.hook_thread != threading.get_ident():
            raise RuntimeError(
                f"port {self.name!r}: {verb} was called outside the hooks of node "
                f"{self._node.name!r}; a port is used only from its node's hooks, and the host "
                "uses run.read() and run.write()"
            )
        return core

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class HasPorts(Protocol):
    """A node as ``forget_messages`` reads it (``_node.Node``): its bookkeeping."""

    @property
    def _mujou(self) -> PortCore: ...


def forget_messages(nodes: Iterable[HasPorts]) -> None:
    """Empty every port of ``nodes``: a run starts with no message, whatever an earlier run of
    the net left on its ports (run.again). Called once the run holds the nodes, before any hook."""
    for node in nodes:
        for port in node._mujou.ports.values():
            port._latest = None
