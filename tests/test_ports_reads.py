"""Unit tests of the check that a hook did not change a message it read (ports.message-read-only).

The first message a hook reads from an input is noted on the input itself (``Input._read``);
another message it reads from the same input afterwards (one that arrived meanwhile) goes to
the node's list of reads. Each is checked after the hook, and none is left for the next hook.
"""

from __future__ import annotations

import threading

import pytest
import torch

import mujou
from mujou import Input, Net, Node

GUARD = 30.0  # seconds: only a hang reaches this


class TwoReads(Node):
    """Reads its input, waits for the host's next message, reads again, changes one of them."""

    x = Input()

    def __init__(self, change: str) -> None:
        super().__init__(period=0.01, seed=0)
        self.change = change
        self.first_read = threading.Event()
        self.written = threading.Event()
        self.distinct = False
        self.done = False

    def on_update(self, dt: float) -> None:
        if self.done:  # only the first update reads
            return
        self.done = True
        first = self.x.read()
        self.first_read.set()
        assert self.written.wait(GUARD), "the host's write never came"
        second = self.x.read()
        assert first is not None and second is not None
        self.distinct = first is not second
        if self.change == "first":
            first.add_(1.0)
        elif self.change == "second":
            second.add_(1.0)


class One(Net):
    def __init__(self, node: TwoReads) -> None:
        super().__init__()
        self.r = node


def _run(change: str) -> TwoReads:
    node = TwoReads(change)
    net = One(node)
    with mujou.run(net, inputs={node.x: torch.zeros(1)}) as run:
        assert node.first_read.wait(GUARD), "the update never started"
        run.write(node.x, torch.ones(1))
        node.written.set()
        run.sleep(0.2)
    return node


@pytest.mark.parametrize("change", ["first", "second"])
def test_each_of_two_messages_read_from_one_input_is_checked(change: str) -> None:
    with pytest.raises(mujou.HookError) as info:
        _run(change)
    cause = info.value.__cause__
    assert isinstance(cause, RuntimeError)
    assert str(cause).startswith("node 'r' changed in place, in on_update, a message it read from 'r.x'")


def test_two_messages_read_and_left_unchanged_pass() -> None:
    node = _run("none")
    assert node.distinct  # the second read was the host's new message


class ChangesOnItsThread(Node):
    """On a thread of its own (its hooks called by ``Hooks.call``): changes what it read."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.01, seed=0, dedicated_thread=True)

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None:
            message.add_(1.0)


def test_a_dedicated_thread_s_hook_is_checked_too() -> None:
    node = ChangesOnItsThread()
    net = Net()
    net.r = node
    with pytest.raises(mujou.HookError) as info, mujou.run(net, inputs={node.x: torch.zeros(1)}) as run:
        run.sleep(0.5)
    assert str(info.value.__cause__).startswith("node 'r' changed in place, in on_update, a message it read")
