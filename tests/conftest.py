"""Shared setup for the unit tests: the conformance suite's hang guard applies here too.

A test that runs past ``TEST_HANG_GUARD`` seconds fails with ``HangError``, with the stacks of
all threads in its captured stderr, and pytest goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "conformance"))

from _support import TEST_HANG_GUARD, hang_guard  # the path above first


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    with hang_guard(TEST_HANG_GUARD):
        yield
