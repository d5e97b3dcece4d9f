"""Conformance tests for the host's calls from several threads (spec/en/running.md).

Rule ``run.write``: under the virtual timer a write from one host thread while another
advances the time lands between two instants, never in the middle of an update.
"""

from __future__ import annotations

import threading

import pytest
import torch
from _support import HANG_GUARD, Bag, hang_guard, vt

import mujou
from mujou import Input, Node

WAIT_FOR_THE_WRITE = 2.0  # real seconds the update gives a write that lands in its middle


class Reader(Node):
    """Its first update reads ``x``, lets the writer thread write, and reads it again."""

    x = Input(optional=True)

    def __init__(self, inside: threading.Event, written: threading.Event) -> None:
        super().__init__(period=0.01)
        self.inside = inside
        self.written = written
        self.reads: list[tuple[object, object]] = []

    def on_update(self, dt: float) -> None:
        if self.reads:
            return
        first = self.x.read()
        self.inside.set()
        self.written.wait(WAIT_FOR_THE_WRITE)  # a write that lands now is seen by the next read
        self.reads.append((first, self.x.read()))


@pytest.mark.rule("run.write")
def test_a_write_from_another_thread_never_lands_in_an_update_under_the_virtual_timer() -> None:
    """Planted: the write published at once (as before), and the update's second read sees
    it (the update started before the write)."""
    inside, written = threading.Event(), threading.Event()
    reader = Reader(inside, written)
    net = Bag(reader=reader)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            assert inside.wait(HANG_GUARD)
            run.write(reader.x, torch.ones(1))
            written.set()
        except BaseException as exc:
            errors.append(exc)

    with hang_guard(HANG_GUARD), mujou.run(net, timer=vt()) as run:
        writer = threading.Thread(target=write, name="test-writer")
        writer.start()
        run.sleep(0.05)
        writer.join(HANG_GUARD)
        assert not writer.is_alive() and errors == []
        assert reader.reads == [(None, None)]  # the update saw no write in its middle
        seen = run.read(reader.x)
        assert seen is not None and torch.equal(seen, torch.ones(1))  # it landed after the sleep
