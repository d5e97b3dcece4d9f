"""Groups placed on a Ray cluster: ``mujou.OnRay`` (hosts.ray).

Ray places, starts and stops; it carries no message. For each group placed with ``OnRay``,
the run's host asks Ray for one actor with the group's resources. The actor runs an agent
(``_agent.Agent``, serving one process, then stopping) on its node's address as Ray knows it,
under a secret made for this group by the run's host and given to the actor through Ray. From
then on the group is launched exactly as on a host given by its address (``_remote.launch``):
the agent starts the process from its fork server, the host and the process talk over their own
TCP connections, and the data plane is Gloo's. Once the process has ended (its handle closed),
the host kills the actor with ``ray.kill``, which gives its resources back to the cluster.

Ray is imported when an ``OnRay`` is made, never with ``mujou``: where it is not installed,
that is where the error says how to install it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
import secrets
import sys
import threading
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, final

from ._remote import HostError, OnHost, RemoteProcess, launch

if TYPE_CHECKING:
    from .._processes._child import Setup
    from ._plane import Part

INSTALL = "pip install mujou[ray]"


def ray_module() -> Any:
    """The ``ray`` module; ImportError saying how to install it where it is absent."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise ImportError(
            f"mujou.OnRay places a group on a Ray cluster and needs Ray, which is not installed "
            f"here: {INSTALL}"
        ) from exc


def _amount(value: object, what: str) -> float:
    """A number of at least 0 (a resource's amount, as Ray takes it)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}: {value!r}")
    if not 0 <= value < math.inf:
        raise ValueError(f"{what} must be at least 0 and finite, got {value!r}")
    return float(value)


def _seconds(value: object, what: str, least: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}: {value!r}")
    if not least <= value < math.inf:
        raise ValueError(f"{what} must be at least {least:g} seconds and finite, got {value!r}")
    return float(value)


@final
class OnRay:
    """A group of ``processes=`` placed on a node of a Ray cluster. See :ref:`hosts.ray`.

    Args:
        group: The nodes, as a group of ``processes=`` takes them (a node, a net, a
            container, or a list or tuple of those).
        num_cpus: The CPUs the group's actor asks Ray for.
        num_gpus: The GPUs the group's actor asks Ray for.
        resources: Ray's custom resources the actor asks for, by name (a node offers them
            with ``ray start --resources``).
        timeout: Real seconds of silence after which the group's host is lost and the run stops.
        start_timeout: Real seconds Ray has to place the actor and start its agent.
    """

    _mujou_remote = True  # what mujou._processes recognises a remote group by

    def __init__(
        self,
        group: object,
        *,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: Mapping[str, float] | None = None,
        timeout: float = 10.0,
        start_timeout: float = 120.0,
    ) -> None:
        ray_module()
        self.num_cpus = _amount(num_cpus, "num_cpus")
        self.num_gpus = _amount(num_gpus, "num_gpus")
        given: object = {} if resources is None else resources
        if not isinstance(given, Mapping):
            raise TypeError(
                "resources must be a dict from a Ray resource's name to an amount, such as "
                f"{{'robot': 1}}, got {type(resources).__name__}: {resources!r}"
            )
        self.resources: dict[str, float] = {}
        for name, amount in given.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"a Ray resource's name must be a non-empty str, got {name!r}")
            if name in ("CPU", "GPU"):
                raise ValueError(f"give the {name}s as num_{name.lower()}s=, not in resources")
            self.resources[name] = _amount(amount, f"resources[{name!r}]")
        self.timeout = _seconds(timeout, "timeout", 0.5)
        self.start_timeout = _seconds(start_timeout, "start_timeout", 0.5)
        self.group = group

    def __repr__(self) -> str:
        asked = f"num_cpus={self.num_cpus:g}, num_gpus={self.num_gpus:g}, resources={self.resources!r}"
        return f"mujou.OnRay({self.group!r}, {asked})"

    def _cluster_address(self) -> str:
        """The Ray cluster's head, ``"HOST:PORT"`` (connecting to the cluster if need be)."""
        address: str = _connected().get_runtime_context().gcs_address
        return address


def launch_on_ray(
    where: OnRay, name: str, setup: Setup, plane: Part | None
) -> tuple[RemoteProcess, Connection, Connection, Connection | None]:
    """Place group ``name``'s actor, then launch its process through the actor's agent."""
    ray = _connected()
    secret = secrets.token_hex(32)
    options: dict[str, Any] = {
        "num_cpus": where.num_cpus,
        "num_gpus": where.num_gpus,
        "resources": where.resources,
        "max_restarts": 0,
        "name": f"mujou-{name}-{secrets.token_hex(4)}",
    }
    actor = _actor_class().options(**options).remote(secret)
    try:
        try:
            address: str = ray.get(actor.address.remote(), timeout=where.start_timeout)
        except ray.exceptions.GetTimeoutError:
            raise HostError(
                f"ray:{options['name']}",
                name,
                f"no node of the Ray cluster took the group within {where.start_timeout:g} s "
                f"(num_cpus={where.num_cpus:g}, num_gpus={where.num_gpus:g}, "
                f"resources={where.resources!r}): does a node offer them, and are they free?",
            ) from None
        except ray.exceptions.RayActorError as exc:
            raise HostError(
                f"ray:{options['name']}", name, f"its Ray actor died as it started: {exc}"
            ) from None
        placed = OnHost(where.group, address, secret=secret, timeout=where.timeout)
        process, control, events, tags = launch(placed, name, setup, plane)
    except BaseException:
        _kill(ray, actor)
        raise
    process.host = f"{address}, Ray actor {options['name']}"  # as errors name it (hosts.ray-lost)
    process.on_close = functools.partial(_kill, ray, actor)
    return process, control, events, tags


def _connected() -> Any:
    """Ray, connected to its cluster as Ray itself does on first use (``ray.init()``: the
    cluster of ``RAY_ADDRESS`` or of this machine, else a new one here)."""
    ray = ray_module()
    if not ray.is_initialized():
        ray.init()
    return ray


def _kill(ray: Any, actor: Any) -> None:
    """End the actor (its resources go back to the cluster); a Ray already shut down has."""
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


@functools.cache
def _actor_class() -> Any:
    return ray_module().remote(RayAgent)


class RayAgent:
    """The Ray actor of one group: an agent that serves one process on the actor's node."""

    def __init__(self, secret: str) -> None:
        from ._agent import Agent

        here = ray_module().util.get_node_ip_address()
        self._agent = Agent(f"{here}:0", secret.encode(), once=True)
        threading.Thread(target=self._serve, name="mujou-ray-agent", daemon=True).start()

    def address(self) -> str:
        """Where the agent listens, ``"HOST:PORT"``."""
        return self._agent.address

    def _serve(self) -> None:
        try:
            self._agent.serve()
        except BaseException as exc:  # the agent is gone: end the actor, and so the life line
            print(f"mujou: the agent of a Ray actor failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            os._exit(1)
