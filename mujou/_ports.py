"""Typed ports: ``Output`` sends snapshots, ``Input`` reads the latest message.

A port is declared on the node class (``y = Output()``); each node gets its own bound copy
in ``Node.__init__``, kept in the node's ``__dict__`` under the same name. The declared port
has ``__set__`` (ports cannot be reassigned) but no ``__get__``, so ``node.y`` finds the copy
in the instance dict at the speed of any attribute, while ``Node.y`` is the declared port.
Messages are shared between the readers of a port and must not be changed in place: see
:ref:`ports.message-read-only`. A message is a tensor or a nest of tensors and scalars
(``_messages.py``); a bare tensor takes a path of its own, the hot path of every update.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Generic, cast, overload

import torch

from ._cuda import host_to_node
from ._messages import KINDS, Nest, cpu_tensor_copy, flatten, map_tensors, rebuild
from ._port import Latest, M, PortCore, PortNode, RunSlot, _Port
from ._routing import Route
from ._specs import Declared, clash

if TYPE_CHECKING:
    from collections.abc import Sequence

_get_ident = threading.get_ident
_Tensor = torch.Tensor
_DEVICE = Route.DEVICE
# Guards the host's writes, which may come from several host threads at once: each gets a
# number of its own (a node's sends come from its hooks, one at a time).
_WRITE_LOCK = threading.Lock()


class Output(_Port, Generic[M]):
    """A port a node sends messages on; any number of inputs read it.

    Declare it on the node class: ``y = Output()``; ``Output(dtype=..., shape=...)`` or
    ``Output(spec=...)`` declares what its messages are (:class:`TensorSpec`). For type
    checkers, ``Output[Pose]`` sends ``Pose`` messages (``Output()`` alone: tensors). See
    :ref:`ports.declare` and :ref:`ports.typed`.
    """

    __slots__ = ("_checks", "_readers", "_route", "_slot")

    @overload
    def __init__(
        self, *, dtype: torch.dtype | None = None, shape: Sequence[int | None] | None = None
    ) -> None: ...

    @overload
    def __init__(self, *, spec: type[M]) -> None: ...

    @overload
    def __init__(self, *, spec: object) -> None: ...

    def __init__(self, *, dtype: object = None, shape: object = None, spec: object = None) -> None:
        super().__init__(dtype, shape, spec)
        self._readers: list[Input[Any]] = []
        self._route = Route.HOST  # planned when a run starts
        self._slot: RunSlot | None = None  # the node's in the current (or last) run: the stamps
        # The declarations a message is checked against: the port's own, then its readers'.
        self._checks: tuple[tuple[Declared, _Port], ...] = ()

    def _bound_copy(self, node: PortNode, core: PortCore) -> Output[M]:
        port = super()._bound_copy(node, core)
        assert isinstance(port, Output)
        port._readers = []
        port._route = Route.HOST
        port._slot = None
        port._checks = () if self._declared is None else ((self._declared, port),)
        return port

    def _begin_run(self, slot: RunSlot) -> None:
        """A run of the node starts: its messages are stamped with its updates' times (ports.stamp)."""
        self._slot = slot

    def send(self, value: M, *, copy: bool = True) -> None:
        """Send a snapshot of ``value``: later changes to ``value`` do not change the message.

        ``value`` is a tensor or a nest of tensors and scalars; each tensor is snapshotted.
        With ``copy=False``, a tensor itself is the message wherever no copy is needed (as
        ``Tensor.to(copy=False)``): the node hands it over and must not change it afterwards.
        Called from the hooks of this port's node only. See :ref:`ports.send-snapshot`,
        :ref:`ports.send-no-copy` and :ref:`ports.message`.

        Raises:
            TypeError: ``value`` is not a message, does not match the port's declaration (or
                a reader's), or ``copy`` is not a bool.
            RuntimeError: called outside the node's hooks.
        """
        core = self._core
        if core is None or core.hook_thread != _get_ident():
            core = self._check_hook_thread("send()")
        if value.__class__ is not _Tensor and not isinstance(value, _Tensor):
            self._send_nest(value, copy, core)
            return
        if self._checks:
            self._check(value)
        tensor: torch.Tensor = value  # type: ignore[assignment]  # a tensor, just checked
        if tensor.requires_grad:
            tensor = tensor.detach()
        cpu = tensor.is_cpu
        if cpu:  # copy is checked to be a bool on the way: False, True, else the TypeError
            if copy is False:
                message, version = tensor, tensor._version
            elif copy is True:
                message, version = tensor.clone(), 0  # a new tensor: its version counter is 0
            else:
                raise _not_bool(copy)
        elif copy is not True and copy is not False:
            raise _not_bool(copy)
        else:
            message = self._snapshot_off_cpu(tensor, copy, core)
            version, cpu = message._version, message.is_cpu
        slot: RunSlot = self._slot  # type: ignore[assignment]  # set for the run: send() runs in a hook
        staged = core.staged
        if staged is None:  # _publish, inlined: the hot path
            latest = self._latest
            number = 1 if latest is None else latest[4] + 1
            self._latest = (message, version, None, slot.last, number, cpu)
            if self._watchers:
                for watcher in self._watchers:
                    watcher(message)
            if self._wakes:
                lodge = self._lodge  # the claim without the lock (NOTE [ the send that lodges ])
                if lodge is None or not lodge(number):
                    slot.sent(self)
        else:  # virtual timer: visible once the batch ends (visibility.virtual)
            staged.append((self, message, version, None, slot.last))

    def _snapshot_off_cpu(self, tensor: torch.Tensor, copy: bool, core: PortCore) -> torch.Tensor:
        """The message of a tensor that is not on the CPU (detached): see the CUDA rules."""
        if self._route is _DEVICE and tensor.device == core.device:
            # cuda.send-stays-on-device: copied on the node's stream, which is waited for
            # before any reader can see the copy (or the tensor, with copy=False).
            assert core.streams is not None and core.streams.stream is not None
            own = core.streams.stream
            current = torch.cuda.current_stream(tensor.device)
            if current != own:  # the hook made another stream current: its work comes first
                own.wait_stream(current)
            if copy:
                with torch.cuda.stream(own):
                    message = tensor.clone()
            else:
                message = tensor
            own.synchronize()
            return message
        if tensor.is_cuda:
            return tensor.to("cpu", copy=True)  # cuda.host-memory-route
        return tensor.clone() if copy else tensor

    def _send_nest(self, value: object, copy: object, core: PortCore) -> None:
        """send() of anything but a tensor: a nest, snapshotted leaf by leaf (ports.message)."""
        try:
            leaves, spec = flatten(value)
        except TypeError as exc:
            raise TypeError(f"port {self.name!r} sends {KINDS}; got {exc}") from None
        if copy is not True and copy is not False:
            raise _not_bool(copy)
        if self._checks:
            self._check(value)
        snapshot = []
        for leaf in leaves:
            if isinstance(leaf, _Tensor):
                tensor = leaf.detach() if leaf.requires_grad else leaf
                if tensor.is_cpu:
                    snapshot.append(tensor.clone() if copy else tensor)
                else:
                    snapshot.append(self._snapshot_off_cpu(tensor, copy, core))
            else:
                snapshot.append(leaf)
        message = rebuild(spec, snapshot)
        nest = Nest(spec, snapshot)
        stamp = self._slot.last  # type: ignore[union-attr]  # set for the run: send() runs in a hook
        if core.staged is None:
            self._publish(message, 0, nest, stamp)
            if self._wakes:
                self._slot.sent(self)  # type: ignore[union-attr]  # set for the run: send() runs in a hook
        else:
            core.staged.append((self, message, 0, nest, stamp))

    def _check(self, value: object) -> None:
        for declared, owner in self._checks:
            problem = declared.problem(value)
            if problem:
                if owner is self:
                    raise TypeError(f"port {self.name!r} {problem}")
                raise TypeError(f"port {self.name!r} sends to input {owner.name!r}, which {problem}")


class Input(_Port, Generic[M]):
    """A port a node reads the latest message of its one source from.

    Declare it on the node class: ``x = Input()``; ``Input(optional=True)`` may stay without
    a source and without host messages; ``dtype=``, ``shape=`` and ``spec=`` declare what its
    messages are, as for :class:`Output`. See :ref:`ports.read-latest`.
    """

    __slots__ = (
        "_base",
        "_coalesced",
        "_link",
        "_optional",
        "_read",
        "_seen",
        "_seen_before",
        "_slot",
        "_source",
    )

    @overload
    def __init__(
        self,
        *,
        optional: bool = False,
        dtype: torch.dtype | None = None,
        shape: Sequence[int | None] | None = None,
    ) -> None: ...

    @overload
    def __init__(self, *, optional: bool = False, spec: type[M]) -> None: ...

    @overload
    def __init__(self, *, optional: bool = False, spec: object) -> None: ...

    def __init__(
        self, *, optional: bool = False, dtype: object = None, shape: object = None, spec: object = None
    ) -> None:
        if not isinstance(optional, bool):
            raise TypeError(f"optional must be a bool, got {type(optional).__name__}: {optional!r}")
        super().__init__(dtype, shape, spec)
        self._optional = optional
        # What the read path reads: the source, or in a run with processes the stand-in of a
        # source in another process (_processes/_wire.py); and the output the net connected,
        # which ``source`` shows (the same, but for those stand-ins on the host).
        self._source: Output[Any] | None = None
        self._link: Output[Any] | None = None
        self._slot: RunSlot | None = None  # the node's in the current (or last) run
        # The number of the latest message when the node's last update started, and when
        # the update before it started (0: none yet): see Input.fresh.
        self._seen = 0
        self._seen_before = 0
        # The number of the latest message when the run started (or was restored): the
        # arrivals counted in ``_coalesced`` come after it (trigger.coalesce).
        self._base = 0
        self._coalesced = 0
        # The latest message (its ``_latest`` tuple) the running hook read first from this
        # port, checked after the hook (ports.message-read-only); a second, other message it
        # reads goes to the node's ``reads`` list. None: none read.
        self._read: tuple[Any, ...] | None = None

    def _bound_copy(self, node: PortNode, core: PortCore) -> Input[M]:
        port = super()._bound_copy(node, core)
        assert isinstance(port, Input)
        port._optional = self._optional
        port._source = port._link = None
        port._slot = None
        port._seen = port._seen_before = port._base = port._coalesced = 0
        port._read = None
        return port

    def _begin_run(self, slot: RunSlot) -> None:
        """A run of the node starts: no update has seen a message yet (ports.fresh)."""
        self._slot = slot
        self._seen = self._seen_before = self._coalesced = 0
        self._read = None
        latest = (self if self._source is None else self._source)._latest
        self._base = 0 if latest is None else latest[4]

    @property
    def optional(self) -> bool:
        """Whether the input may have neither a source nor a message from the host."""
        return self._optional

    @property
    def source(self) -> Output[M] | None:
        """The output connected to this input, or None (the host may write it)."""
        return self._link

    def _message(self) -> Any:
        source = self._source
        return self._checked_latest() if source is None else source._checked_latest()

    def read(self) -> M | None:
        """The latest visible message, on this node's device, or None when there is none yet.

        The message is shared with the other readers: do not change it in place (clone it
        first). Called from the hooks of this port's node only. See :ref:`ports.read-latest`.
        """
        core = self._core
        if core is None or core.hook_thread != _get_ident():
            core = self._check_hook_thread("read()")
        source = self._source
        port = self if source is None else source
        latest = port._latest
        if latest is None:
            return None
        message = latest[0]
        if latest[5] and core.cpu:  # a bare tensor on the CPU read on the CPU: the common case
            if message._version != latest[1]:
                port._raise_changed()
            read = self._read
            if read is None:  # noted for the check after the hook, without a new tuple
                self._read = latest
            elif read is not latest:
                core.reads.append((self, message, latest[1]))
            shared: M = message  # typed by assignment: cast() would be a call on the hot path
            return shared
        return cast("M", self._read_other(core, port, latest))

    def _read_other(self, core: PortCore, port: _Port, latest: Latest) -> Any:
        """read() of a nest, or of a tensor that is not on the CPU or is read on a device."""
        message, version, nest, _, _, _ = latest
        if nest is not None:
            return self._read_nest(core, port, message, nest)
        if message._version != version:
            port._raise_changed()
        if message.device == core.device:
            if core.streams is not None and core.streams.stream is not None:
                # The reader's kernels use the sender's memory: keep it from being reused
                # before they are done.
                message.record_stream(core.streams.stream)
            core.reads.append((self, message, version))
            return message
        return _move(message, core)

    def _read_nest(self, core: PortCore, port: _Port, message: Any, nest: Nest) -> Any:
        """read() of a nest: checked, and its tensors moved to this node's device one by one."""
        if not nest.unchanged(message):
            port._raise_changed()
        moved = False
        for tensor, version in nest.tensors:
            if tensor.device == core.device:
                if tensor.is_cuda and core.streams is not None and core.streams.stream is not None:
                    tensor.record_stream(core.streams.stream)
                core.reads.append((self, tensor, version))
            else:
                moved = True
        if not moved:
            return message
        device = core.device
        return map_tensors(message, lambda tensor: tensor if tensor.device == device else _move(tensor, core))

    @property
    def stamp(self) -> float | None:
        """The timer time the latest visible message was sent at, or None when there is none.

        Called from the hooks of this port's node only. See :ref:`ports.stamp`.
        """
        core = self._core
        if core is None or core.hook_thread != _get_ident():
            self._check_hook_thread("stamp")
        latest = (self if self._source is None else self._source)._latest
        return None if latest is None else latest[3]

    @property
    def fresh(self) -> bool:
        """Whether the latest visible message arrived since the node's last update started.

        In ``on_update``: since the node's previous update started (in its first update of a
        run: whether there is a message). Called from the hooks of this port's node only.
        See :ref:`ports.fresh`.
        """
        core = self._core
        if core is None or core.hook_thread != _get_ident():
            self._check_hook_thread("fresh")
        latest = (self if self._source is None else self._source)._latest
        if latest is None:
            return False
        slot = self._slot
        in_update = slot is not None and slot.hook == "on_update"
        return latest[4] != (self._seen_before if in_update else self._seen)

    def _fresh_next(self) -> bool:
        """Whether the node's next update finds the latest message fresh: an arrival since its
        last update started (for the state tree, and a trigger's condition)."""
        latest = (self if self._source is None else self._source)._latest
        return latest is not None and latest[4] != self._seen

    def _restore_fresh(self, fresh: bool) -> None:
        """Make the node's next update find the latest message fresh, or not (a restore)."""
        latest = (self if self._source is None else self._source)._latest
        number = 0 if latest is None else latest[4]
        self._seen = number - 1 if fresh else number
        self._base = number

    def _host_snapshot(self, value: object, what: str, copy: bool = True) -> tuple[Any, Nest | None]:
        """The host's snapshot of ``value`` for this input, on its node's device, and its tensors;
        with ``copy=False``, each tensor already on that device itself (run.write-no-copy).

        Raises TypeError, starting with ``what``, when ``value`` is not a message or does not
        match the input's declaration (cuda.write-on-device for each tensor).
        """
        core = self._core
        device = self.node.device if core is None else core.device
        if value.__class__ is _Tensor or isinstance(value, _Tensor):
            if self._declared is not None:
                self._check_host(value, what)
            if copy and core is not None and core.cpu:  # the common case, in short
                return cpu_tensor_copy(value), None
            return host_to_node(value, device, copy), None
        try:
            leaves, spec = flatten(value)
        except TypeError as exc:
            raise TypeError(f"{what} takes {KINDS}; got {exc}") from None
        self._check_host(value, what)
        snapshot = [
            host_to_node(leaf, device, copy) if isinstance(leaf, _Tensor) else leaf for leaf in leaves
        ]
        return rebuild(spec, snapshot), Nest(spec, snapshot)

    def _check_host(self, value: object, what: str) -> None:
        if self._declared is not None:
            problem = self._declared.problem(value)
            if problem:
                raise TypeError(f"{what}: input {self.name!r} {problem}")

    def _write(self, message: Any, nest: Nest | None, stamp: float) -> None:
        """Publish the host's message (run.write, inputs=, a restore), sent at ``stamp``."""
        version = message._version if nest is None else 0
        with _WRITE_LOCK:
            self._publish(message, version, nest, stamp)


def _not_bool(copy: object) -> TypeError:
    return TypeError(f"copy must be a bool, got {type(copy).__name__}: {copy!r}")


def _move(tensor: torch.Tensor, core: PortCore) -> torch.Tensor:
    """A message's tensor copied to the reading node's device (cuda.copy-stream, cuda.device-to-device)."""
    if tensor.is_cuda and core.streams is not None:
        return core.streams.copy_in(tensor)
    return tensor.to(core.device)


def link(output: Output[Any], input: Input[Any]) -> None:
    """Make ``output`` the source of ``input``; ValueError when their declarations clash.

    See :ref:`net.typed-connect`.
    """
    if output._declared is not None and input._declared is not None:
        found = clash(output._declared.tree, input._declared.tree)
        if found:
            raise ValueError(
                f"cannot connect output {output.name!r} to input {input.name!r}: the output "
                f"declares {output._declared.text} and the input {input._declared.text}, "
                f"which no message matches ({found.strip()})"
            )
    input._source = input._link = output
    output._readers.append(input)
    declared = input._declared
    if declared is not None and all(declared is not known for known, _ in output._checks):
        output._checks = (*output._checks, (declared, input))
