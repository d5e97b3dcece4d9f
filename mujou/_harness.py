"""``Harness``: a node (or a small net) under the virtual timer, fed and stepped by a test.

Built on the public run: ``mujou.run`` with a ``VirtualTimer``, ``run.write`` for the feeds at
their times, ``run.state_dict``. It records each message its outputs send, with the time it
was sent (read from the port as the message is published). See the "Testing" page.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, final

from ._errors import HookError
from ._messages import cpu_copy
from ._net import Net
from ._node import Node
from ._numbers import non_negative
from ._port import _Port
from ._ports import Input, Output
from ._run import Run, _host_message
from ._start import run as start_run
from ._timer import VirtualTimer


@final
class Harness:
    """Runs one node, or a small net, under the virtual timer for a test.

    A node is run alone in a net of its own, named ``name`` (by default its class's name in
    snake case). The run starts at once, as :func:`mujou.run` starts it (``inputs``,
    ``state``, ``seed`` and ``workers`` as there); time moves only in :meth:`advance` and
    :meth:`step`. Use it as a context manager, or call :meth:`close`. See
    :ref:`testing.harness`.

    Args:
        target: The node or net to run; a node must be in no net.
        inputs: First messages of inputs without a source, by port or port name.
        state: A state tree to resume from.
        seed: The run's seed (None: that of the virtual timer, 0).
        workers: The run's worker threads.
        name: The name of a lone node in its net.

    Raises:
        TypeError, ValueError: as :func:`mujou.run`, or a target that is neither a node nor a
            net, a node already in a net, a port name that names no port.
        HookError: an ``on_start`` hook raised.
    """

    def __init__(
        self,
        target: Node | Net,
        *,
        inputs: Mapping[str, Any] | Mapping[Input[Any], Any] | Mapping[Input[Any] | str, Any] | None = None,
        state: Mapping[str, Any] | None = None,
        seed: int | None = None,
        workers: int = 1,
        name: str | None = None,
    ) -> None:
        if isinstance(target, Net):
            if name is not None:
                raise TypeError("name= names a lone node in its net; a net's nodes have their names")
            net = target
        elif isinstance(target, Node):
            net = _lone(target, name)
        else:
            raise TypeError(
                f"target must be a mujou.Node or a mujou.Net, got {type(target).__name__}: {target!r}"
            )
        self._target = target
        self._net = net
        self._ports: dict[str, _Port] = {}
        for node in net.nodes():
            for attr, port in node._mujou.ports.items():
                self._ports[port.name] = port
                if node is target:
                    self._ports.setdefault(attr, port)
        first = {} if inputs is None else {self._input(key, "inputs"): value for key, value in inputs.items()}
        self._lock = threading.Lock()
        self._sent: dict[Output[Any], list[tuple[float, Any]]] = {}
        self._watchers: list[tuple[Output[Any], Callable[[object], None]]] = []
        self._feeds: list[tuple[float, int, Input[Any], Any]] = []  # (at, order, port, snapshot)
        self._count = 0
        self._closed = False
        for port in self._ports.values():
            if isinstance(port, Output) and port not in self._sent:
                self._sent[port] = []
                watcher = self._recorder(port)
                port._add_watcher(watcher)
                self._watchers.append((port, watcher))
        try:
            self._run = start_run(
                net, timer=VirtualTimer(), workers=workers, inputs=first, state=state, seed=seed
            )
        except BaseException:
            self._unwatch()
            if isinstance(target, Node):  # refused: the node is free again, for another harness
                delattr(net, target._mujou.attr)
            raise

    def _recorder(self, port: Output[Any]) -> Callable[[object], None]:
        """A watcher of ``port`` that logs each message it publishes with its send time."""
        log = self._sent[port]

        def record(message: object) -> None:
            latest = port._latest  # set before the watchers are called: the message's time
            stamp = latest[3] if latest is not None else float("nan")
            with self._lock:
                log.append((stamp, message))

        return record

    def _unwatch(self) -> None:
        for port, watcher in self._watchers:
            port._remove_watcher(watcher)
        self._watchers.clear()

    def _port(self, port: object, what: str) -> _Port:
        if isinstance(port, str):
            found = self._ports.get(port)
            if found is None:
                raise ValueError(f"{what}: no port is named {port!r}; the ports are {sorted(self._ports)}")
            return found
        if isinstance(port, _Port) and port._node is not None and self._ports.get(port.name) is port:
            return port
        raise ValueError(f"{what}: {port!r} is not a port of the harness's {_kind(self._target)}")

    def _input(self, port: object, what: str) -> Input[Any]:
        found = self._port(port, what)
        if not isinstance(found, Input):
            raise TypeError(f"{what}: {found.name!r} is an output; the host feeds inputs")
        return found

    # -- the run -------------------------------------------------------------------------------

    @property
    def run(self) -> Run:
        """The :class:`mujou.Run` underneath, for what the harness does not wrap."""
        return self._run

    @property
    def net(self) -> Net:
        """The net that runs, the one given or the lone node's own."""
        return self._net

    @property
    def time(self) -> float:
        """The run's timer time."""
        return self._run.time

    def feed(self, port: Input[Any] | Output[Any] | str, message: Any, *, at: float | None = None) -> None:
        """Write ``message`` to an input without a source at timer time ``at`` (default: now).

        A feed at a later time is written when :meth:`advance` or :meth:`step` reaches it,
        after the updates due at that time, as ``run.sleep`` then ``run.write`` would; feeds of
        one time are written in the order they were given. The message is a snapshot taken now.

        Raises:
            ValueError: ``at`` is before the current time; the port has a source or is not of
                the harness's net.
            TypeError: the port is an output, or the message does not fit it.
        """
        target = self._input(port, "feed")
        self._open("feed")
        now = self._run.time
        when = now if at is None else non_negative("at", at)
        if when < now:
            raise ValueError(f"at={at!r} is in the past: the harness's time is {now!r}")
        if target.source is not None:
            raise ValueError(
                f"input {target.name!r} has the source {target.source.name!r}; feed inputs without one"
            )
        snapshot = _host_message(target, message, f"feed({target.name!r})")[0]
        if when == now:
            self._run.write(target, snapshot)
            return
        self._feeds.append((when, self._count, target, snapshot))
        self._count += 1
        self._feeds.sort(key=lambda feed: feed[:2])

    def advance(self, seconds: float) -> None:
        """Run ``seconds`` of timer time, writing the feeds due meanwhile at their times.

        Raises:
            HookError: a hook failed (the run has stopped).
        """
        self._open("advance")
        self._until(self._run.time + non_negative("seconds", seconds))

    def step(self) -> float:
        """Run to the next time an update is due or a feed is given, and what is due then.

        Returns the new time. Updates that a message wakes at the same time run at the next
        step, without the time moving.

        Raises:
            RuntimeError: nothing is due and no feed is waiting.
            HookError: a hook failed (the run has stopped).
        """
        self._open("step")
        run = self._run
        before = self._updates()
        run._sleep_until(run.time, stacklevel=3)  # what is waiting at this time: a woken node
        if self._updates() != before:
            return run.time
        engine = run._engine
        with engine.lock:
            due = engine.policy.next_due()
        if self._feeds:
            due = min(due, self._feeds[0][0])
        if due == float("inf"):
            raise RuntimeError("step(): nothing is due and no feed is waiting; feed an input first")
        self._until(due)
        return self._run.time

    def _updates(self) -> int:
        return sum(node.updates for node in self._run.stats().nodes.values())

    def _until(self, until: float) -> None:
        while self._feeds and self._feeds[0][0] <= until:
            at, _, port, snapshot = self._feeds.pop(0)
            self._run._sleep_until(at, stacklevel=4)
            self._run.write(port, snapshot)
        self._run._sleep_until(until, stacklevel=4)

    def _open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{what}(): the harness is closed")

    # -- what happened -------------------------------------------------------------------------

    def sent(self, port: Output[Any] | str) -> list[tuple[float, Any]]:
        """Every message the output sent since the harness started: ``(time, message)``, oldest
        first, as CPU copies."""
        found = self._port(port, "sent")
        if not isinstance(found, Output):
            raise TypeError(f"sent: {found.name!r} is an input; sent() lists an output's messages")
        with self._lock:
            log = list(self._sent[found])
        return [(stamp, cpu_copy(message)) for stamp, message in log]

    def read(self, port: Input[Any] | Output[Any] | str) -> Any:
        """The port's latest message, as :meth:`mujou.Run.read`."""
        return self._run.read(self._port(port, "read"))  # type: ignore[arg-type]  # an Input or Output

    def state(self) -> dict[str, Any]:
        """The lone node's state (its entry of the state tree), or a net's whole state tree."""
        tree = self._run.state_dict()
        if isinstance(self._target, Node):
            node_state: dict[str, Any] = tree[self._target._mujou.attr]
            return node_state
        return tree

    def state_dict(self) -> dict[str, Any]:
        """The run's whole state tree, as :meth:`mujou.Run.state_dict`."""
        return self._run.state_dict()

    # -- the end -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the run (every ``on_stop`` runs); what was sent and the state stay readable.

        Raises:
            HookError: a hook failed, and no earlier call raised it.
        """
        if self._closed:
            return
        self._closed = True
        reported = self._run._engine.error_reported  # raised to the test already (by advance)
        try:
            self._run.stop()
        except HookError:
            if not reported:
                raise
        finally:
            self._unwatch()

    def __enter__(self) -> Harness:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(HookError):  # the exception leaving the block stays the one seen
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<mujou.testing.Harness of {_kind(self._target)}: {state}, t={self._run.time:.3f} s>"


def _kind(target: Node | Net) -> str:
    return f"{type(target).__name__} {'node' if isinstance(target, Node) else 'net'}"


def _lone(node: Node, name: object) -> Net:
    """A net holding ``node`` alone, under ``name`` or its class's name in snake case."""
    if node._mujou.parent is not None:
        raise ValueError(
            f"node {node.name!r} is in a net already: give the harness that net, or a node in none"
        )
    if name is None:
        name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", type(node).__name__).lower()
        if not name.isidentifier():
            name = "node"
    elif not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}: {name!r}")
    elif not name.isidentifier():
        raise ValueError(f"name must be a Python identifier, got {name!r}")
    net = Net()
    setattr(net, name, node)
    return net
