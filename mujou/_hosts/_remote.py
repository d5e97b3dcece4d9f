"""The host's side of a group on another host: ``mujou.OnHost``, its launch through the
host's agent, and the handle on the remote process that the process layer's ``Group`` holds.

``RemoteProcess`` has what ``Group`` uses of a ``multiprocessing`` process (``sentinel``,
``exitcode``, ``join``, ``kill``, ``close``), from the life line (``_life``): the sentinel is
a pipe of the host's own whose write end closes when the process ended, when the agent closed
the line, or when the agent was silent for ``timeout`` seconds (hosts.lost). A process whose
host was lost has no exit code (None) and an ``end_reason`` that names the host.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, final

from .._errors import MujouInternalError
from . import _life as life
from ._address import parse_address, secret_bytes

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from .._processes._child import Setup
    from ._plane import Part

CLOCK_PINGS = 5  # round trips that measure a host's clock offset (the shortest one counts)


class HostError(RuntimeError):
    """A group's host refused the run, or could not be reached, at its start. See :ref:`hosts.refused`.

    Attributes:
        host: The host's address, ``"HOST:PORT"``.
        process: The group's name in ``processes=``.
    """

    def __init__(self, host: str, process: str, reason: str) -> None:
        super().__init__(f"host {host!r} of process {process!r}: {reason}")
        self.host = host
        self.process = process

    def __reduce__(self) -> tuple[type[HostError], tuple[str, str, str]]:
        return (type(self), (self.host, self.process, str(self).partition(": ")[2]))


@final
class OnHost:
    """A group of ``processes=`` placed on another host. See :ref:`hosts.placement`.

    Args:
        group: The nodes, as a group of ``processes=`` takes them (a node, a net, a
            container, or a list or tuple of those).
        address: The host's agent, ``"HOST:PORT"`` (``python -m mujou serve`` there).
        rank: Instead of ``address``, under ``torchrun``: the rank whose machine runs the
            group (see :ref:`hosts.torchrun`).
        secret: The run's secret, as the agent was given it; None: the ``MUJOU_SECRET``
            environment variable.
        timeout: Real seconds of silence after which the host is lost and the run stops.
    """

    _mujou_remote = True  # what mujou._processes recognises a remote group by

    def __init__(
        self,
        group: object,
        address: str | None = None,
        *,
        rank: int | None = None,
        secret: str | bytes | None = None,
        timeout: float = 10.0,
    ) -> None:
        if (address is None) == (rank is None):
            raise TypeError(
                "mujou.OnHost takes either an address 'HOST:PORT' or rank= (under torchrun), not both"
            )
        if address is not None:
            parse_address(address)
        elif isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"rank must be an int, got {type(rank).__name__}: {rank!r}")
        elif rank < 1:
            raise ValueError(f"rank must be 1 or more (rank 0 runs the program), got {rank!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}: {timeout!r}")
        if not 0.5 <= timeout < float("inf"):
            raise ValueError(f"timeout must be at least 0.5 seconds and finite, got {timeout!r}")
        if secret is not None:
            secret_bytes(secret, "mujou.OnHost")
        self.group = group
        self.rank = rank
        self.timeout = float(timeout)
        self._address = address
        self._secret = secret

    @property
    def address(self) -> str:
        """The address of the group's agent, as given, or under torchrun that of rank ``rank``."""
        if self._address is not None:
            return self._address
        from ._torchrun import agent_address

        assert self.rank is not None
        return agent_address(self.rank)

    def __repr__(self) -> str:
        where = repr(self._address) if self._address is not None else f"rank={self.rank}"
        return f"mujou.OnHost({self.group!r}, {where})"

    def _key(self) -> bytes:
        """The run's secret, as bytes (hosts.secret)."""
        return secret_bytes(self._secret, f"the group on host {self.address!r}")


def launch(
    where: OnHost, name: str, setup: Setup, plane: Part | None
) -> tuple[RemoteProcess, Connection, Connection, Connection | None]:
    """The remote process of group ``name``, its control and events connections, and under
    the virtual timer its tags connection (NOTE [ the tags connection ] in ``_processes._group``)."""
    from ._launch import Launch, host_preparation, versions
    from ._link import HandshakeError, SilentPeerError, connect

    address, secret = parse_address(where.address), where._key()
    key = secrets.token_bytes(16)
    opened: list[Connection] = []
    try:
        try:
            lifeline = connect(address, secret, where.timeout)
            opened.append(lifeline)
            offset = _clock_offset(lifeline)
            data = pickle.dumps(setup, protocol=pickle.HIGHEST_PROTOCOL)
            lifeline.send(
                (
                    "launch",
                    key,
                    Launch(
                        name,
                        data,
                        versions(),
                        host_preparation(),
                        where.timeout,
                        offset,
                        plane,
                        tags=setup.virtual,
                    ),
                )
            )
            answer = (
                lifeline.recv()
                if lifeline.poll(where.timeout)
                else ("refused", f"no answer within {where.timeout:g} s")
            )
            if answer[0] != "ok":
                raise HostError(where.address, name, f"refused the run: {answer[1]}")
            control = connect(address, secret, where.timeout)
            opened.append(control)
            control.send(("control", key))
            events = connect(address, secret, where.timeout)
            opened.append(events)
            events.send(("events", key))
            tags = None
            if setup.virtual:
                tags = connect(address, secret, where.timeout)
                opened.append(tags)
                tags.send(("tags", key))
        except SilentPeerError as exc:
            raise HostError(where.address, name, f"{exc}: is a Mujou agent listening there?") from None
        except HandshakeError as exc:
            raise HostError(
                where.address, name, f"{exc}: give the agent and the run the same secret"
            ) from None
        except (OSError, EOFError) as exc:
            raise HostError(
                where.address,
                name,
                f"cannot be reached ({type(exc).__name__}: {exc}); is 'python -m mujou serve' running there?",
            ) from None
    except BaseException:
        for connection in opened:
            connection.close()
        raise
    process = RemoteProcess(where.address, name, lifeline, where.timeout)
    process.clock_offset = offset
    return process, control, events, tags


def _clock_offset(lifeline: Connection) -> float:
    """The agent's monotonic clock minus this one's, from the shortest of a few round trips."""
    best: tuple[float, float] | None = None
    for _ in range(CLOCK_PINGS):
        before = time.monotonic()
        lifeline.send(("clock", b""))
        there = float(lifeline.recv())
        after = time.monotonic()
        if best is None or after - before < best[0]:
            best = (after - before, there - (before + after) / 2)
    assert best is not None
    return best[1]


class RemoteProcess:
    """What ``Group`` holds of a process on another host (see the module's docstring)."""

    def __init__(self, host: str, name: str, lifeline: Connection, timeout: float) -> None:
        self.host = host
        self.name = name
        self.pid: int | None = None
        self.end_reason: str | None = None
        self.clock_offset = 0.0  # the host's monotonic clock minus this one's, measured at the launch
        self._exitcode: int | None = None
        self._lifeline = lifeline
        self._timeout = timeout
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._sentinel, self._signal = os.pipe()
        self._started = threading.Event()  # the agent said the process's id
        self.on_close: Callable[[], None] | None = None  # called once, by close (mujou._hosts._ray)
        self._monitor = threading.Thread(target=self._guarded, name=f"mujou-life-{name}", daemon=True)
        self._monitor.start()

    @property
    def sentinel(self) -> int:
        return self._sentinel

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    def is_alive(self) -> bool:
        return not self._ended.is_set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the end; once ended, the life line and the sentinel close."""
        if self._ended.wait(timeout):
            self.close()

    def kill(self) -> None:
        """Ask the agent to SIGKILL the process (a lost host: nothing can be asked)."""
        if not self._ended.is_set():
            with self._lock, contextlib.suppress(OSError):
                self._lifeline.send_bytes(life.frame(life.KILL))

    def close(self) -> None:
        """Close the life line and the sentinel (once ended; idempotent)."""
        with self._lock:
            for fd in (self._sentinel, self._signal):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._sentinel = self._signal = -1
            self._lifeline.close()
            hook, self.on_close = self.on_close, None
        if hook is not None:
            hook()

    def _guarded(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # a bug: the process counts as lost, never a silent death
            error = MujouInternalError(f"internal error in Mujou on {threading.current_thread().name}")
            error.__cause__ = exc
            self._end(None, f"was lost to an internal error in Mujou ({type(exc).__name__}: {exc})")
            raise error from exc

    def _watch(self) -> None:
        beat = life.interval(self._timeout)
        heard = sent = time.monotonic()
        lifeline = self._lifeline
        while True:
            ready = lifeline.poll(max(0.0, sent + beat - time.monotonic()))
            now = time.monotonic()
            if ready:
                try:
                    kind, value = life.parse(lifeline.recv_bytes())
                except (EOFError, OSError, ValueError):
                    self._end(None, f"on host {self.host!r} was lost: its agent closed the connection")
                    return
                heard = now
                if kind == life.PID:
                    self.pid = value
                    self._started.set()
                elif kind == life.EXIT:
                    self._end(value, None if value == 0 else f"on host {self.host!r} ended unexpectedly")
                    return
            elif now - heard > self._timeout:
                self._end(
                    None, f"on host {self.host!r} was lost: its host did not answer for {self._timeout:g} s"
                )
                return
            if now - sent >= beat:  # once a beat: not in answer to each frame (a storm of both ends)
                sent = now
                with self._lock, contextlib.suppress(OSError):
                    lifeline.send_bytes(life.frame(life.ALIVE))

    def _end(self, code: int | None, reason: str | None) -> None:
        with self._lock:
            self._exitcode = code
            self.end_reason = reason
            with contextlib.suppress(OSError):
                os.close(self._signal)
            self._signal = -1
        self._ended.set()


def remote_pids(processes: Sequence[Any]) -> list[int]:
    """The ids of remote processes the agents reported (for tests on one machine)."""
    return [p.pid for p in processes if isinstance(p, RemoteProcess) and p.pid is not None]
