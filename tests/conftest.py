"""Shared setup for the unit tests: the conformance suite's hang guard and its one torch thread
per test (``_support.one_torch_thread``: many cores times torch's threads would warn) apply
here too.

A test that runs past ``TEST_HANG_GUARD`` seconds fails with ``HangError``, with the stacks of
all threads in its captured stderr, and pytest goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))

from _support import TEST_HANG_GUARD, hang_guard, one_torch_thread, sigint_raises  # the path above first

SHARED_FIXTURES = (one_torch_thread, sigint_raises)  # pytest finds them here by name


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    with hang_guard(TEST_HANG_GUARD):
        yield
