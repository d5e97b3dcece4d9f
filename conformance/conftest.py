"""Shared setup for the conformance suite.

The suite runs under ``pytest -n auto`` on small machines, so every run keeps torch to one
intra-op thread (a process-wide setting the host makes, as the spec asks), and the
oversubscription warning is silenced (``pytest.warns`` in the tests that check it still sees it).

Every test is also guarded against hangs: one that runs past ``TEST_HANG_GUARD`` seconds fails
with ``HangError``, with the stacks of all threads in its captured stderr, and pytest goes on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _support import TEST_HANG_GUARD, hang_guard, one_torch_thread, sigint_raises

SHARED_FIXTURES = (one_torch_thread, sigint_raises)  # pytest finds them here by name


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    with hang_guard(TEST_HANG_GUARD):
        yield
