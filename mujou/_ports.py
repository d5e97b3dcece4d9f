"""Typed ports: ``Output`` sends snapshots, ``Input`` reads the latest message.

A port is declared on the node class (``y = Output()``); each node gets its own bound copy
in ``Node.__init__``, kept in the node's ``__dict__`` under the same name. The declared port
has ``__set__`` (ports cannot be reassigned) but no ``__get__``, so ``node.y`` finds the copy
in the instance dict at the speed of any attribute, while ``Node.y`` is the declared port.
Messages are shared between the readers of a port and must not be changed in place: see
:ref:`ports.message-read-only`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import torch

from ._routing import Route

if TYPE_CHECKING:
    from ._node import Node, NodeCore

Watcher = Callable[[torch.Tensor], None]
# A published message: the tensor and its version counter when it was sent, as one reference,
# so a reader on another thread sees both of one message, never a pair torn between two.
Latest = tuple[torch.Tensor, int]
_get_ident = threading.get_ident
_Tensor = torch.Tensor
_DEVICE = Route.DEVICE
# Guards replacing a port's watchers (subscribe, wait_for and their ends, from any host
# thread): adding and removing are rare, so one lock serves every port.
_WATCHERS_LOCK = threading.Lock()


class _Port:
    """What inputs and outputs share: a name, a node, the latest message and its watchers."""

    __slots__ = ("_attr", "_core", "_latest", "_node", "_watchers")

    def __init__(self) -> None:
        self._attr = ""
        self._node: Node | None = None
        self._core: NodeCore | None = None  # the node's, for the hot paths
        self._latest: Latest | None = None  # replaced whole by each publish, read once
        # Replaced (under _WATCHERS_LOCK), never mutated, so a sender iterates it without a lock.
        self._watchers: tuple[Watcher, ...] = ()

    def __set_name__(self, owner: type, name: str) -> None:
        self._attr = name

    def __set__(self, node: object, value: object) -> None:
        raise AttributeError(
            f"port {self._attr!r} of {type(node).__name__} cannot be assigned; "
            "ports are declared once on the class"
        )

    def _bound_copy(self, node: Node, core: NodeCore) -> _Port:
        port = type(self).__new__(type(self))
        _Port.__init__(port)
        port._attr = self._attr
        port._node = node
        port._core = core
        return port

    @property
    def node(self) -> Node:
        """The node this port belongs to."""
        if self._node is None:
            raise TypeError(
                f"{type(self).__name__} {self._attr!r} is the class attribute; "
                "use the port of a node instance (node.port)"
            )
        return self._node

    @property
    def name(self) -> str:
        """The port's dotted name, made of the node's name, a dot and the attribute name."""
        if self._node is None:
            return self._attr
        node_name = self._node.name
        return f"{node_name}.{self._attr}" if node_name else self._attr

    def _publish(self, message: torch.Tensor, version: int | None = None) -> None:
        """Make ``message`` the latest; ``version`` is its version counter when it was sent."""
        self._latest = (message, message._version if version is None else version)
        for watcher in self._watchers:
            watcher(message)

    def _message(self) -> torch.Tensor | None:
        """The message a reader of this port gets now (see Input for inputs)."""
        return self._checked_latest()

    def _checked_latest(self) -> torch.Tensor | None:
        """The latest message, checked to be as it was published (ports.message-read-only)."""
        latest = self._latest
        if latest is None:
            return None
        message, version = latest
        if message._version != version:
            self._raise_changed()
        return message

    def _peek(self) -> torch.Tensor | None:
        """The latest message as it is now, unchecked (the state tree, run.wait_for)."""
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

    def _check_hook_thread(self, verb: str) -> Node:
        node = self.node
        if node._mujou.hook_thread != threading.get_ident():
            raise RuntimeError(
                f"port {self.name!r}: {verb}() was called outside the hooks of node "
                f"{node.name!r}; a port is used only from its node's hooks, and the host "
                "uses run.read() and run.write()"
            )
        return node

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class Output(_Port):
    """A port a node sends messages on; any number of inputs read it.

    Declare it on the node class: ``y = Output()``. See :ref:`ports.declare`.
    """

    __slots__ = ("_readers", "_route")

    def __init__(self) -> None:
        super().__init__()
        self._readers: list[Input] = []
        self._route = Route.HOST  # planned when a run starts

    def _bound_copy(self, node: Node, core: NodeCore) -> Output:
        port = super()._bound_copy(node, core)
        assert isinstance(port, Output)
        port._readers = []
        port._route = Route.HOST
        return port

    def send(self, value: torch.Tensor, *, copy: bool = True) -> None:
        """Send a snapshot of ``value``: later changes to ``value`` do not change the message.

        With ``copy=False``, ``value`` itself is the message wherever no copy is needed (as
        ``Tensor.to(copy=False)``): the node hands it over and must not change it afterwards.
        Called from the hooks of this port's node only. See :ref:`ports.send-snapshot` and
        :ref:`ports.send-no-copy`.

        Raises:
            TypeError: ``value`` is not a tensor, or ``copy`` is not a bool.
            RuntimeError: called outside the node's hooks.
        """
        core = self._core
        if core is None or core.hook_thread != _get_ident():
            core = self._check_hook_thread("send")._mujou
        if not isinstance(value, _Tensor):
            raise TypeError(f"port {self.name!r} sends torch.Tensor messages, got {type(value).__name__}")
        if copy is not True and copy is not False:
            raise TypeError(f"copy must be a bool, got {type(copy).__name__}: {copy!r}")
        if value.requires_grad:
            value = value.detach()
        if value.is_cpu:
            message = value.clone() if copy else value
        elif self._route is _DEVICE and value.device == core.device:
            # cuda.send-stays-on-device: copied on the node's stream, which is waited for
            # before any reader can see the copy (or the tensor, with copy=False).
            assert core.streams is not None and core.streams.stream is not None
            own = core.streams.stream
            current = torch.cuda.current_stream(value.device)
            if current != own:  # the hook made another stream current: its work comes first
                own.wait_stream(current)
            if copy:
                with torch.cuda.stream(own):
                    message = value.clone()
            else:
                message = value
            own.synchronize()
        elif value.is_cuda:
            message = value.to("cpu", copy=True)  # cuda.host-memory-route
        else:
            message = value.clone() if copy else value
        if core.staged is None:  # _publish, inlined: the hot path
            self._latest = (message, message._version)
            for watcher in self._watchers:
                watcher(message)
        else:  # virtual timer: visible once the batch ends (visibility.virtual)
            core.staged.append((self, message, message._version))


class Input(_Port):
    """A port a node reads the latest message of its one source from.

    Declare it on the node class: ``x = Input()``; ``Input(optional=True)`` may stay without
    a source and without host messages. See :ref:`ports.read-latest`.
    """

    __slots__ = ("_optional", "_source")

    def __init__(self, *, optional: bool = False) -> None:
        super().__init__()
        if not isinstance(optional, bool):
            raise TypeError(f"optional must be a bool, got {type(optional).__name__}: {optional!r}")
        self._optional = optional
        self._source: Output | None = None

    def _bound_copy(self, node: Node, core: NodeCore) -> Input:
        port = super()._bound_copy(node, core)
        assert isinstance(port, Input)
        port._optional = self._optional
        port._source = None
        return port

    @property
    def optional(self) -> bool:
        """Whether the input may have neither a source nor a message from the host."""
        return self._optional

    @property
    def source(self) -> Output | None:
        """The output connected to this input, or None (the host may write it)."""
        return self._source

    def _message(self) -> torch.Tensor | None:
        source = self._source
        return self._checked_latest() if source is None else source._checked_latest()

    def read(self) -> torch.Tensor | None:
        """The latest visible message, on this node's device, or None when there is none yet.

        The message is shared with the other readers: do not change it in place (clone it
        first). Called from the hooks of this port's node only. See :ref:`ports.read-latest`.
        """
        core = self._core
        if core is None or core.hook_thread != _get_ident():
            core = self._check_hook_thread("read")._mujou
        port = self if self._source is None else self._source
        latest = port._latest
        if latest is None:
            return None
        message, version = latest
        if message._version != version:
            port._raise_changed()
        if core.cpu and message.is_cpu:  # the common case, in short
            core.reads.append((self, message, version))
            return message
        if message.device == core.device:
            if core.streams is not None and core.streams.stream is not None:
                # The reader's kernels use the sender's memory: keep it from being reused
                # before they are done.
                message.record_stream(core.streams.stream)
            core.reads.append((self, message, version))
            return message
        if message.is_cuda and core.streams is not None:
            return core.streams.copy_in(message)  # cuda.copy-stream, cuda.device-to-device
        return message.to(core.device)
