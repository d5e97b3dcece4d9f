"""The start of a run with groups on other hosts, on the run's host: each group's launch bound
to its part of the data plane (real-time timer), before the processes are spawned."""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from .._processes._child import Setup
from .._processes._member import Member
from .._processes._placement import Placement
from ._ray import OnRay, launch_on_ray
from ._remote import OnHost, RemoteProcess, launch

if TYPE_CHECKING:
    from ._plane import HostPlane, Part


class Bound:
    """A group's ``OnHost`` or ``OnRay`` with its part of this run's data plane (None: no plane)."""

    def __init__(self, where: OnHost | OnRay, part: Part | None, plane: HostPlane | None = None) -> None:
        self.where = where
        self.part = part
        self.plane = plane  # what run.stats() reads the NCCL lanes' counts from (hosts.stats)

    def launch(
        self, name: str, setup: Setup
    ) -> tuple[RemoteProcess, Connection, Connection, Connection | None]:
        if isinstance(self.where, OnRay):
            return launch_on_ray(self.where, name, setup, self.part)
        return launch(self.where, name, setup, self.part)


def prepare_hosts(placement: Placement, member: Member, *, virtual: bool) -> None:
    """Bind each remote group's launch; under the real-time timer, with ports that cross hosts,
    open the data plane's store here and take rank 0 (hosts.data-plane)."""
    hosts: dict[str, OnHost | OnRay] = dict(placement.hosts)
    plane = None
    if not virtual:
        from ._plane import HostPlane, channels

        local = [name for name in placement.groups if name not in hosts]
        if channels(list(hosts), placement.outgoing, local):
            first = next(iter(hosts.values()))
            toward = first._cluster_address() if isinstance(first, OnRay) else first.address
            plane = HostPlane(member, placement, toward, max(where.timeout for where in hosts.values()))
    placement.hosts = {
        name: Bound(where, None if plane is None else plane.part(rank), plane)
        for rank, (name, where) in enumerate(hosts.items(), start=1)
    }
