"""How many CPUs and physical cores the process may use, and the default worker count.

See :ref:`threads.default-workers` and :ref:`settings.oversubscription-warning`.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

_CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
_TOPOLOGY = Path("/sys/devices/system/cpu")


def gil_enabled() -> bool:
    """Whether the GIL is enabled in this process (always on builds without ``_is_gil_enabled``)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def affinity_cpus() -> set[int]:
    """The logical CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def parse_cpu_max(text: str) -> int | None:
    """The CPU count a cgroup v2 ``cpu.max`` line allows ("max 100000" → None, "150000 100000" → 2)."""
    fields = text.split()
    if len(fields) != 2 or not (fields[0].isdigit() and fields[1].isdigit()):
        return None  # "max" (no quota) or a line this parser does not know
    quota, period = int(fields[0]), int(fields[1])
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def quota_cpus() -> int | None:
    """The CPUs a cgroup CPU quota allows (v2, then v1), or None without a quota."""
    try:
        return parse_cpu_max(_CGROUP_V2_MAX.read_text())
    except (OSError, ValueError):
        pass
    try:
        quota = int(_CGROUP_V1_QUOTA.read_text())
        period = int(_CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError):
        return None
    return parse_cpu_max(f"{quota} {period}") if quota > 0 else None


def usable_cpus() -> int:
    """Logical CPUs the process may use: the affinity, limited by a cgroup CPU quota."""
    count = len(affinity_cpus())
    quota = quota_cpus()
    return count if quota is None else max(1, min(count, quota))


def physical_cores() -> int:
    """Physical cores among the usable CPUs (SMT siblings counted once), limited by the quota."""
    cores: set[tuple[str, str]] = set()
    cpus = affinity_cpus()
    for cpu in cpus:
        topology = _TOPOLOGY / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            cores.add(("cpu", str(cpu)))
        else:
            cores.add((package, core))
    count = len(cores) or len(cpus)
    quota = quota_cpus()
    return count if quota is None else max(1, min(count, quota))


def default_workers(nodes_on_workers: int, *, cpus: int, gil: bool) -> int:
    """The default number of workers: ``cpus`` (halved under the GIL), at most the nodes."""
    count = max(1, cpus // 2) if gil else cpus
    return max(0, min(count, nodes_on_workers))
