"""The agent on a remote host (``python -m mujou serve``): it starts the processes of the
groups a run places on this host, and ends them (hosts.agent).

It listens on one TCP address (loopback unless told otherwise). A connection is taken only
once it proved it knows the run's secret (``_link``); a run's host then opens three for each
remote process, each naming the process by a random key: the life line (``_life``) with the
``Launch``, the control connection and the events connection (and under the virtual timer a
fourth, the lockstep's tags connection). With all of them, the agent starts the process from
its own fork server (Linux) or with ``spawn``, handing it the control, events and tags
connections: from then on the host and the process talk directly, with the process
layer's protocol. The agent watches the process and the life line: it tells the host the
process's exit code, and kills the process when the host asks, when the life line closes,
or when the host has been silent for the launch's timeout; and the process ends by itself
when the agent dies (``_orphan``).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from .._errors import MujouInternalError
from .._processes._server import start_context
from . import _life as life
from ._address import parse_address
from ._launch import Launch, refusal
from ._link import HANDSHAKE_TIMEOUT, HandshakeError, accepted

ACCEPT_POLL = 0.5  # real seconds between looks whether the agent was asked to stop


@dataclass
class _Pending:
    """A remote process whose three connections are arriving."""

    life: Connection | None = None
    launch: Launch | None = None
    control: Connection | None = None
    events: Connection | None = None
    tags: Connection | None = None  # under the virtual timer (Launch.tags)
    complete: threading.Event = field(default_factory=threading.Event)

    def ready(self) -> bool:
        return (
            self.launch is not None
            and self.control is not None
            and self.events is not None
            and (self.tags is not None or not self.launch.tags)
        )


class Agent:
    """An agent listening on ``address`` for runs that know ``secret``."""

    def __init__(
        self, address: str, secret: bytes, *, once: bool = False, log: Callable[[str], None] | None = None
    ) -> None:
        host, port = (
            parse_address(address) if address.rpartition(":")[2] != "0" else (address.rpartition(":")[0], 0)
        )
        self._secret = secret
        self._once = once
        self._log = log if log is not None else _stderr
        self._socket = socket.create_server((host, port))
        self.address = "{}:{}".format(*self._socket.getsockname()[:2])
        self._pending: dict[bytes, _Pending] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._children: list[threading.Thread] = []

    def serve(self) -> None:
        """Take connections until ``stop`` (or, with ``once``, until a run's process ended).

        The fork server starts meanwhile (it imports torch: seconds), so that the first run
        rarely waits for it."""
        threading.Thread(
            target=self._guarded, args=(start_context,), name="mujou-agent-server", daemon=True
        ).start()
        self._socket.settimeout(ACCEPT_POLL)
        try:
            while not self._stop.is_set():
                try:
                    sock, peer = self._socket.accept()
                except TimeoutError:
                    continue
                threading.Thread(
                    target=self._guarded, args=(self._take, sock, peer), name="mujou-agent-take", daemon=True
                ).start()
        finally:
            self._socket.close()
            for thread in list(self._children):
                thread.join(HANDSHAKE_TIMEOUT)

    def stop(self) -> None:
        self._stop.set()

    def _guarded(self, body: Callable[..., None], *args: Any) -> None:
        try:
            body(*args)
        except BaseException as exc:  # a bug here ends this connection, never silently
            self._log(
                f"mujou agent: internal error on {threading.current_thread().name}: "
                f"{type(exc).__name__}: {exc}"
            )
            error = MujouInternalError("internal error in Mujou's agent - please file a bug")
            error.__cause__ = exc
            raise error from exc

    def _take(self, sock: socket.socket, peer: Any) -> None:
        """One connection: its handshake, then its part of a remote process."""
        try:
            connection = accepted(sock, self._secret)
        except (HandshakeError, OSError) as exc:
            self._log(f"mujou agent: refused a connection from {peer[0]}:{peer[1]}: {exc}")
            return
        if not connection.poll(HANDSHAKE_TIMEOUT):
            connection.close()
            return
        try:
            kind, key, *rest = connection.recv()
            while kind == "clock":  # the host measures this clock's offset (hosts.clock)
                connection.send(time.monotonic())
                if not connection.poll(HANDSHAKE_TIMEOUT):
                    raise TimeoutError("no launch after the clock's pings")
                kind, key, *rest = connection.recv()
        except Exception as exc:
            self._log(f"mujou agent: a malformed first message from {peer[0]}:{peer[1]}: {exc}")
            connection.close()
            return
        with self._lock:
            pending = self._pending.setdefault(key, _Pending())
            if kind == "launch":
                launch: Launch = rest[0]
                why = refusal(launch.versions)
                if why is not None:
                    self._pending.pop(key, None)
                    connection.send(("refused", why))
                    connection.close()
                    return
                pending.life, pending.launch = connection, launch
            elif kind == "control":
                pending.control = connection
            elif kind == "events":
                pending.events = connection
            elif kind == "tags":
                pending.tags = connection
            else:
                connection.close()
                return
            ready = pending.ready()
            if ready:
                self._pending.pop(key, None)
        if kind == "launch":
            connection.send(("ok", time.monotonic()))
        if ready:
            thread = threading.Thread(
                target=self._guarded, args=(self._run, pending), name="mujou-agent-process", daemon=True
            )
            self._children.append(thread)
            thread.start()
        elif kind == "launch":
            expiry = threading.Timer(HANDSHAKE_TIMEOUT, self._expire, args=(key,))
            expiry.daemon = True
            expiry.start()

    def _expire(self, key: bytes) -> None:
        """A launch whose other connections never came: forget it."""
        with self._lock:
            pending = self._pending.pop(key, None)
        if pending is not None:
            for connection in (pending.life, pending.control, pending.events, pending.tags):
                if connection is not None:
                    connection.close()

    def _run(self, pending: _Pending) -> None:
        """Start the process, then keep its life line until it ended."""
        from ._orphan import main

        lifeline, launch = pending.life, pending.launch
        assert (
            lifeline is not None
            and launch is not None
            and pending.control is not None
            and pending.events is not None
        )
        beat = life.interval(launch.timeout)
        started = threading.Event()
        # The first start of the fork server imports torch (seconds): the host hears from us meanwhile.
        beating = threading.Thread(
            target=self._guarded, args=(_beat, lifeline, beat, started), name="mujou-agent-beat", daemon=True
        )
        beating.start()
        try:
            context = start_context()
        finally:
            started.set()
            beating.join()
        # The process watches the read end; this end closes when the agent dies (_orphan).
        watched, watch = context.Pipe(duplex=False)
        process = context.Process(
            target=main,
            args=(watched, launch, pending.control, pending.events, pending.tags),
            name=f"mujou-{launch.name}",
        )
        try:
            process.start()
        except BaseException:
            watch.close()
            raise
        finally:
            watched.close()
            for connection in (pending.control, pending.events, pending.tags):
                if connection is not None:
                    connection.close()
        self._log(f"mujou agent: started process {launch.name!r} (pid {process.pid})")
        heard = sent = time.monotonic()
        with contextlib.suppress(OSError):
            lifeline.send_bytes(life.frame(life.PID, process.pid or 0))
        try:
            while process.exitcode is None:
                ready = wait([lifeline, process.sentinel], max(0.0, sent + beat - time.monotonic()))
                now = time.monotonic()
                if lifeline in ready:
                    try:
                        kind, _ = life.parse(lifeline.recv_bytes())
                    except (EOFError, OSError, ValueError):
                        self._log(
                            f"mujou agent: the run's host closed the line of {launch.name!r}: killing it"
                        )
                        process.kill()
                        break
                    heard = now
                    if kind == life.KILL:
                        process.kill()
                elif now - heard > launch.timeout:
                    self._log(
                        f"mujou agent: the run's host was silent for {launch.timeout:g} s: "
                        f"killing {launch.name!r}"
                    )
                    process.kill()
                    break
                if now - sent >= beat:  # once a beat: not in answer to each frame
                    sent = now
                    with contextlib.suppress(OSError):
                        lifeline.send_bytes(life.frame(life.ALIVE))
            process.join()
            code = process.exitcode
            assert code is not None
            self._log(f"mujou agent: process {launch.name!r} ended (exit code {code})")
            with contextlib.suppress(OSError):
                lifeline.send_bytes(life.frame(life.EXIT, code))
        finally:
            if process.exitcode is None:
                process.kill()
                process.join()
            process.close()
            watch.close()
            lifeline.close()
            if self._once:
                self.stop()


def _beat(lifeline: Connection, beat: float, done: threading.Event) -> None:
    """Heartbeats on ``lifeline`` until ``done``."""
    while not done.wait(beat):
        with contextlib.suppress(OSError):
            lifeline.send_bytes(life.frame(life.ALIVE))


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def new_secret() -> str:
    """A fresh secret for a run, as the command line prints it."""
    return secrets.token_hex(32)
