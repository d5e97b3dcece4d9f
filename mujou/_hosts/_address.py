"""A host's address and the run's secret, as a run and an agent are given them (hosts.arguments,
hosts.secret). Imported with the package: it imports nothing heavy."""

from __future__ import annotations

import os

SECRET_VARIABLE = "MUJOU_SECRET"  # the environment variable that gives the run's secret


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
