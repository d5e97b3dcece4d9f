"""Unit tests of the ports' sharing between threads: one reference per message, no lost watcher.

A published message and its version counter at the send are one reference (``_Port._latest``),
so a reader on another thread never pairs one message with another's counter (which reads as
a false "changed in place" error). The watchers of a port are replaced under a lock, so host
threads that subscribe and unsubscribe at once lose none. Free-threaded races cannot be forced
on a build with the GIL; the tests switch threads as often as the interpreter allows
(``sys.setswitchinterval``) to make the races as likely as they can be there, and check the
structure that rules them out.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from mujou import Input, Node, Output
from mujou._messages import Nest, flatten, rebuild
from mujou._port import Watcher, _Port

GUARD = 30.0  # seconds: only a hang reaches this
ROUNDS = 20_000


class Source(Node):
    y = Output()


class Sink(Node):
    x = Input()


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


class Counter:
    """A watcher that counts the messages it gets (each one distinct, compared by identity)."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, message: object) -> None:
        self.seen += 1


def run_together(*targets: Callable[[], None]) -> None:
    """Run each target on its own thread, all released at once; re-raise the first error."""
    start = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def main(target: Callable[[], None]) -> None:
        try:
            start.wait(GUARD)
            target()
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=main, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GUARD)
        assert not thread.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


def two_messages() -> tuple[torch.Tensor, torch.Tensor]:
    """Two messages with different version counters (0 and 1), neither changed after."""
    first = torch.zeros(2)
    second = torch.zeros(2)
    second.add_(1.0)
    assert (first._version, second._version) == (0, 1)
    return first, second


def test_a_published_message_is_one_reference_with_its_version() -> None:
    """_latest holds the message, its version at the send, its stamp and number, and whether it
    is a bare CPU tensor, as one tuple."""
    fresh = Source().y
    assert fresh._latest is None and fresh._message() is None
    port = Source().y
    message = torch.ones(3)
    message.mul_(2.0)
    port._publish(message, message._version, None, 0.5)
    latest = port._latest
    assert isinstance(latest, tuple) and len(latest) == 6, latest
    assert latest[0] is message and latest[1] == message._version == 1
    assert latest[2] is None and latest[3] == 0.5 and latest[4] == 1 and latest[5] is True
    assert port._message() is message and port._peek() is message
    port._publish(message, message._version, None, 0.75)
    assert port._latest is not None and port._latest[3:5] == (0.75, 2), "the stamp and number move with it"
    assert "_latest_version" not in _Port.__slots__, "the version is part of the one reference"
    assert "_stamp" not in _Port.__slots__, "the stamp is part of the one reference"


def test_a_published_nest_is_one_reference_with_what_it_was() -> None:
    """A nest's check (its structure, leaves and versions) is in the same tuple as the nest."""
    port = Source().y
    leaves, spec = flatten({"a": torch.zeros(2), "b": [1.0]})
    message = rebuild(spec, leaves)
    port._publish(message, 0, Nest(spec, leaves), 1.0)
    assert port._message() is message
    message["b"].append(2.0)
    with pytest.raises(RuntimeError, match="changed in place after it was sent"):
        port._message()


def test_a_reader_never_sees_a_message_torn_from_its_version() -> None:
    """Publishing from one thread while another reads never reads as "changed in place"."""
    source, sink = Source(), Sink()
    sink.x._source = source.y
    first, second = two_messages()
    port, reader = source.y, sink.x

    def publish() -> None:
        for _ in range(ROUNDS):
            port._publish(first, first._version, None, 0.0)
            port._publish(second, second._version, None, 0.0)

    def read() -> None:
        for _ in range(2 * ROUNDS):
            message = reader._message()
            assert message is None or message is first or message is second

    run_together(publish, read)


def test_a_message_changed_in_place_is_still_caught() -> None:
    """The one reference still tells a message changed after its send."""
    port = Source().y
    message = torch.zeros(2)
    port._publish(message, message._version, None, 0.0)
    message.add_(1.0)
    with pytest.raises(RuntimeError, match="changed in place after it was sent"):
        port._message()


def test_watchers_added_and_removed_by_two_threads_are_never_lost() -> None:
    """Two threads adding, then removing, watchers of one port at once lose none."""
    port: _Port = Source().y
    count = 2_000
    watchers: list[list[Watcher]] = [[Counter() for _ in range(count)] for _ in range(2)]

    def adder(side: int) -> Callable[[], None]:
        def add() -> None:
            for watcher in watchers[side]:
                port._add_watcher(watcher)

        return add

    def remover(side: int) -> Callable[[], None]:
        def remove() -> None:
            for watcher in watchers[side]:
                port._remove_watcher(watcher)

        return remove

    for _ in range(5):
        run_together(adder(0), adder(1))
        assert len(port._watchers) == 2 * count, f"{2 * count - len(port._watchers)} watcher(s) lost"
        assert set(port._watchers) == set(watchers[0]) | set(watchers[1])
        run_together(remover(0), remover(1))
        assert port._watchers == (), f"{len(port._watchers)} removed watcher(s) came back"
