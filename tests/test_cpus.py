"""Unit tests of the CPU counting behind the default number of workers."""

from __future__ import annotations

import pytest

from mujou._cpus import default_workers, parse_cpu_max, physical_cores, usable_cpus


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


def test_counts_are_positive_and_consistent() -> None:
    assert 1 <= physical_cores() <= usable_cpus()
