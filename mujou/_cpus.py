"""How many CPUs and physical cores the process may use, and the default worker count.

See :ref:`threads.default-workers` and :ref:`settings.oversubscription-warning`.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

_PROC_CGROUP = Path("/proc/self/cgroup")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
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


def _cgroup_dirs() -> list[Path]:
    """The process's cgroup folders (v2 and v1 cpu), each followed by its ancestors."""
    try:
        lines = _PROC_CGROUP.read_text().splitlines()
    except OSError:
        lines = []
    found: list[Path] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base = _CGROUP_ROOT
        elif "cpu" in controllers.split(","):
            base = _CGROUP_ROOT / controllers
            if not base.exists():
                base = _CGROUP_ROOT / "cpu"
        else:
            continue
        parts = [part for part in path.strip("/").split("/") if part]
        found += [base.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return found


def _quota_in(folder: Path) -> int | None:
    try:
        return parse_cpu_max((folder / "cpu.max").read_text())
    except (OSError, ValueError):
        pass
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return parse_cpu_max(f"{quota} {period}")


def quota_cpus() -> int | None:
    """The CPUs the tightest cgroup CPU quota over this process allows, or None without one."""
    quotas = [quota for folder in _cgroup_dirs() if (quota := _quota_in(folder)) is not None]
    return min(quotas) if quotas else None


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
