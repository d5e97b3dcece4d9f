"""``examples/two_machines.py --ray``: the example's filter placed by Ray, on a local cluster."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from _support import hang_guard

from tests.test_examples import run_example

#: Seconds: a local Ray cluster starts first, then a Ray worker and the group's process, each
#: importing torch (tens of seconds on 2 busy cores).
SLOW = 170.0


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    """A longer guard than conftest's, for the cluster's start; the example's own run is
    bounded by ``run_example``'s timeout."""
    with hang_guard(SLOW + 10.0):
        yield


def test_two_machines_placed_by_ray() -> None:
    pytest.importorskip("ray")
    out = run_example("two_machines.py", "--ray", timeout=SLOW)
    assert re.search(r"the controller sent [1-9]\d* commands; the filter ran on a Ray actor", out), out
    assert out.rstrip().endswith("identical: True"), out
