"""Authenticated TCP connections between the host and an agent (hosts.secret).

Both ends prove they know the run's secret before anything is unpickled: right after the TCP
connection opens, each end sends the other a random challenge and checks its HMAC with the
secret, as ``multiprocessing.connection``'s ``authkey`` does (``deliver_challenge`` and
``answer_challenge``; neither unpickles). Only then is the socket wrapped in a
``multiprocessing`` ``Connection``, the same kind of connection as the pipes between the
processes of one host, so the process layer's protocol runs over it unchanged.

A peer that does not take part in the handshake (a port that accepts and never answers) cannot
hold either end for long: the handshake runs on a helper thread, and a peer that has not
finished it within ``HANDSHAKE_TIMEOUT`` has its socket shut down, which ends the helper.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

HANDSHAKE_TIMEOUT = 10.0  # real seconds a peer has to prove it knows the secret
SECRET_VARIABLE = "MUJOU_SECRET"  # the environment variable that gives the run's secret


class HandshakeError(Exception):
    """The peer did not prove it knows the secret (or did not answer in time)."""


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` as a pair; ValueError naming what is wrong."""
    if not isinstance(address, str):
        raise TypeError(
            f"a host's address must be a str 'HOST:PORT', got {type(address).__name__}: {address!r}"
        )
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"a host's address must be 'HOST:PORT' with a port from 1 to 65535, such as "
            f"'127.0.0.1:29400', got {address!r}"
        )
    return host.strip("[]"), int(port)


def secret_bytes(secret: str | bytes | None, what: str) -> bytes:
    """The run's secret: ``secret``, else the ``MUJOU_SECRET`` environment variable."""
    if secret is None:
        secret = os.environ.get(SECRET_VARIABLE)
        if not secret:
            raise ValueError(
                f"{what} needs the run's secret: give secret= or set the environment variable "
                f"{SECRET_VARIABLE} (the same on every host, such as the output of "
                "'python -c \"import secrets; print(secrets.token_hex(32))\"')"
            )
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes):
        raise TypeError(f"secret must be a str or bytes, got {type(secret).__name__}")
    if len(secret) < 16:
        raise ValueError(f"the run's secret must be at least 16 bytes long, got {len(secret)}")
    return secret


class SilentPeerError(HandshakeError):
    """The peer did not finish the handshake in time."""


def _handshake(
    sock: socket.socket, secret: bytes, *, server: bool, timeout: float = HANDSHAKE_TIMEOUT
) -> Connection:
    """Wrap ``sock`` once both ends proved they know ``secret``, within ``timeout`` seconds."""
    sock.setblocking(True)
    connection = Connection(sock.detach())
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            if server:
                deliver_challenge(connection, secret)
                answer_challenge(connection, secret)
            else:
                answer_challenge(connection, secret)
                deliver_challenge(connection, secret)
            outcome.append(None)
        except BaseException as exc:  # the helper's only job: its outcome is the caller's
            outcome.append(exc)

    helper = threading.Thread(target=run, name="mujou-handshake", daemon=True)
    helper.start()
    helper.join(timeout)
    if helper.is_alive():  # the peer does not answer: end the helper's read
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(connection.fileno())) as duplicate:
            duplicate.shutdown(socket.SHUT_RDWR)
        helper.join(HANDSHAKE_TIMEOUT)
        connection.close()
        raise SilentPeerError(f"the peer did not finish the handshake within {timeout:g} s")
    error = outcome[0] if outcome else None
    if error is not None:
        connection.close()
        if isinstance(error, AuthenticationError):
            raise HandshakeError("the peer does not know the run's secret (authentication failed)") from None
        raise HandshakeError(f"the handshake failed: {type(error).__name__}: {error}") from error
    return connection


def connect(address: tuple[str, int], secret: bytes, timeout: float) -> Connection:
    """An authenticated connection to the agent at ``address`` within ``timeout`` seconds (for
    each of the TCP connection and the handshake); OSError or HandshakeError."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        return _handshake(sock, secret, server=False, timeout=timeout)
    except BaseException:
        sock.close()
        raise


def accepted(sock: socket.socket, secret: bytes) -> Connection:
    """The authenticated connection of a socket an agent accepted; HandshakeError if not."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        return _handshake(sock, secret, server=True)
    except BaseException:
        sock.close()
        raise
