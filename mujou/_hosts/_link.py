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


class HandshakeError(Exception):
    """The peer did not prove it knows the secret (or did not answer in time)."""


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
