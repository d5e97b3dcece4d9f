"""Shared setup for the conformance suite.

The suite runs under ``pytest -n auto`` on small machines, so every run keeps torch to one
intra-op thread (a process-wide setting the host makes, as the spec asks), and the
oversubscription warning is silenced (``pytest.warns`` in the tests that check it still sees it).

Every test is also guarded against hangs: one that runs past ``TEST_HANG_GUARD`` seconds fails
with ``HangError``, with the stacks of all threads in its captured stderr, and pytest goes on.
"""

from __future__ import annotations

import signal
import warnings
from collections.abc import Iterator

import pytest
import torch
from _support import TEST_HANG_GUARD, hang_guard

import mujou


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    with hang_guard(TEST_HANG_GUARD):
        yield


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        # pytest.warns() inside a test still sees it: it resets the filters it needs.
        warnings.simplefilter("ignore", mujou.OversubscriptionWarning)
        yield
    torch.set_num_threads(before)


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread (_thread.interrupt_main needs a handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
