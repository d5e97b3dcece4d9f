"""Unit tests of the CPU counting behind the default number of workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from mujou import _cpus
from mujou._cpus import affinity_cpus, default_workers, parse_cpu_max, physical_cores, usable_cpus


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("max 100000", None),
        ("100000 100000", 1),
        ("150000 100000", 2),
        ("50000 100000", 1),
        ("400000 100000\n", 4),
        ("garbage", None),
    ],
)
def test_parse_cpu_max(text: str, cpus: int | None) -> None:
    assert parse_cpu_max(text) == cpus


@pytest.mark.parametrize(
    ("nodes", "cpus", "gil", "expected"),
    [
        (10, 8, True, 4),
        (10, 8, False, 8),
        (3, 8, False, 3),
        (10, 1, True, 1),
        (10, 3, True, 1),
        (0, 8, True, 0),
        (1, 16, True, 1),
    ],
)
def test_default_workers(nodes: int, cpus: int, gil: bool, expected: int) -> None:
    assert default_workers(nodes, cpus=cpus, gil=gil) == expected


def test_counts_are_consistent() -> None:
    assert physical_cores() <= usable_cpus() <= len(affinity_cpus())


def fake_cgroup(monkeypatch: pytest.MonkeyPatch, root: Path, membership: str, files: dict[str, str]) -> None:
    """Point the probe at a fake /proc/self/cgroup and cgroup tree, on 8 CPUs of affinity."""
    proc = root / "proc-self-cgroup"
    proc.write_text(membership)
    tree = root / "cgroup"
    for name, text in files.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    tree.mkdir(exist_ok=True)
    monkeypatch.setattr(_cpus, "_PROC_CGROUP", proc)
    monkeypatch.setattr(_cpus, "_CGROUP_ROOT", tree)
    monkeypatch.setattr(_cpus, "affinity_cpus", lambda: set(range(8)))
    monkeypatch.setattr(_cpus, "_TOPOLOGY", root / "no-topology")  # each CPU a core of its own


@pytest.mark.parametrize(
    ("membership", "files", "cpus"),
    [
        # cgroup v2: the tightest quota of the cgroup and its ancestors, rounded up.
        ("0::/a/b\n", {"a/b/cpu.max": "max 100000\n", "a/cpu.max": "150000 100000\n"}, 2),
        ("0::/a/b\n", {"a/b/cpu.max": "300000 100000\n", "cpu.max": "500000 100000\n"}, 3),
        # cgroup v1: the cpu controller's CFS quota.
        (
            "5:cpu,cpuacct:/job\n3:memory:/job\n",
            {"cpu,cpuacct/job/cpu.cfs_quota_us": "250000\n", "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"},
            3,
        ),
        ("0::/a\n", {"a/cpu.max": "max 100000\n"}, 8),  # no quota
        ("0::/a\n", {"a/cpu.max": "1600000 100000\n"}, 8),  # a quota above the affinity
        ("0::/a\n", {}, 8),  # no cpu.max at all
    ],
    ids=["v2-ancestor", "v2-own", "v1", "no-quota", "quota-above-affinity", "no-file"],
)
def test_usable_cpus_are_limited_by_a_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, membership: str, files: dict[str, str], cpus: int
) -> None:
    """threads.default-workers: the CPUs the process may use are fewer when a cgroup CPU quota
    limits them (a fake cgroup tree; the affinity is 8 CPUs)."""
    fake_cgroup(monkeypatch, tmp_path, membership, files)
    assert usable_cpus() == cpus
    assert physical_cores() == cpus
    assert default_workers(100, cpus=usable_cpus(), gil=False) == cpus
