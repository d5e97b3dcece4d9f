"""Unit tests of the shared-memory ring that carries one output's messages across processes."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import platform
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch
from _support import HANG_GUARD

from mujou._processes import _ring
from mujou._processes._ring import Announce, RingReader, RingWriter


def passed(announce: Announce) -> Announce:
    """``announce`` as another process gets it: through ForkingPickler (a shared buffer)."""
    copy = pickle.loads(ForkingPickler.dumps(announce))
    assert isinstance(copy, Announce)
    return copy


def read(reader: RingReader) -> tuple[int, float, list[torch.Tensor]]:
    got = reader.latest()
    assert got is not None, "latest() returned None after a write"
    return got


def assert_same(got: list[torch.Tensor], sent: list[torch.Tensor]) -> None:
    assert len(got) == len(sent)
    for index, (a, b) in enumerate(zip(got, sent, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, (index, a.dtype, a.shape, b.dtype, b.shape)
        assert torch.equal(a, b), (index, a, b)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.linspace(-1, 1, 7, dtype=torch.float32),
        torch.linspace(-1, 1, 7, dtype=torch.float64).reshape(7, 1),
        torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4),
        torch.tensor([True, False, True]),
        torch.linspace(-2, 2, 5, dtype=torch.bfloat16),
        torch.arange(256, dtype=torch.uint8),
        torch.tensor(2.5),  # 0-d
        torch.tensor(7, dtype=torch.int64),  # 0-d
        torch.empty(0),
        torch.empty(3, 0, 2, dtype=torch.float64),
        torch.arange(1 << 20, dtype=torch.uint8),  # 1 MiB
        torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),  # non-contiguous
        torch.arange(40, dtype=torch.int64)[::3],  # non-contiguous, strided
        torch.arange(5.0).expand(3, 5),  # a stride of 0
    ],
    ids=lambda t: f"{t.dtype}-{tuple(t.shape)}-{'c' if t.is_contiguous() else 'nc'}",
)
def test_round_trip_of_one_leaf(tensor: torch.Tensor) -> None:
    writer = RingWriter()
    announce = writer.write([tensor], 0.25, 1)
    assert announce is not None and announce.generation == 1
    assert announce.layout == ((tensor.dtype, tuple(tensor.shape)),)
    number, stamp, got = read(RingReader(passed(announce)))
    assert (number, stamp) == (1, 0.25)
    assert_same(got, [tensor])
    assert got[0].is_contiguous()


def test_round_trip_of_several_leaves_and_of_none() -> None:
    leaves = [
        torch.tensor(3.0),
        torch.ones(3, 5, dtype=torch.bfloat16),
        torch.tensor([[True], [False]]),
        torch.empty(0, dtype=torch.int64),
        torch.arange(17, dtype=torch.uint8),  # 17 bytes: the next leaf still lands aligned
        torch.full((2, 2), -4.5, dtype=torch.float64).t(),
    ]
    writer = RingWriter()
    reader = RingReader(passed(_first(writer.write(leaves, 1.0, 10))))
    assert_same(read(reader)[2], leaves)

    writer_of_none = RingWriter()
    announce = _first(writer_of_none.write([], 2.0, 1))
    assert announce.layout == ()
    assert read(RingReader(passed(announce))) == (1, 2.0, [])


def _first(announce: Announce | None) -> Announce:
    assert announce is not None, "the first write returned no Announce"
    return announce


def test_nothing_written_yet_gives_none() -> None:
    # A reader can only exist after a first write; a ring whose done counter is still 0
    # (between its allocation and the end of its first write) reads as empty.
    writer = RingWriter()
    announce = _first(writer.write([torch.ones(2)], 0.0, 1))
    reader = RingReader(passed(announce))
    _ring._Ring(announce).words[_ring._DONE] = 0
    assert reader.latest() is None


def test_numbers_and_stamps_of_the_newest_write() -> None:
    writer = RingWriter(slots=3)
    reader = RingReader(passed(_first(writer.write([torch.tensor(0)], 0.0, 5))))
    for number in range(6, 20, 3):  # more writes than slots: the ring wraps
        assert writer.write([torch.tensor(number)], number / 8, number) is None
        got_number, stamp, (value,) = read(reader)
        assert (got_number, stamp, int(value)) == (number, number / 8, number)
        assert read(reader)[0] == number  # reading again gives the same, newest, message


def test_numbers_must_increase() -> None:
    writer = RingWriter()
    writer.write([torch.ones(1)], 0.0, 3)
    with pytest.raises(ValueError, match=r"^message numbers must increase: got 3 after 3$"):
        writer.write([torch.ones(1)], 0.0, 3)


def test_latest_returns_copies_the_reader_owns() -> None:
    writer = RingWriter()
    sent = torch.arange(6.0)
    reader = RingReader(passed(_first(writer.write([sent], 0.0, 1))))
    _, _, (first,) = read(reader)
    first.fill_(-1.0)
    _, _, (second,) = read(reader)
    assert torch.equal(second, sent)
    assert second.data_ptr() != first.data_ptr()
    sent.fill_(9.0)  # the writer's input is copied too
    assert torch.equal(read(reader)[2][0], torch.arange(6.0))


def test_a_new_layout_reallocates_and_the_reader_follows_the_reannounce() -> None:
    writer = RingWriter()
    announce = _first(writer.write([torch.zeros(4)], 0.0, 1))
    reader = RingReader(passed(announce))
    changes = [
        [torch.zeros(5)],  # another shape
        [torch.zeros(5, dtype=torch.float64)],  # another dtype
        [torch.zeros(5, dtype=torch.float64), torch.tensor(1)],  # another leaf count
        [],
    ]
    previous = 1
    for generation, leaves in enumerate(changes, start=2):
        number = generation * 10
        again = _first(writer.write(leaves, float(number), number))
        assert again.generation == generation
        assert again.layout == tuple((t.dtype, tuple(t.shape)) for t in leaves)
        assert read(reader)[0] == previous  # the old ring still reads its last message
        reader.reannounce(passed(again))
        assert reader.generation == generation
        got_number, stamp, got = read(reader)
        assert (got_number, stamp) == (number, float(number))
        assert_same(got, leaves)
        assert writer.write(leaves, float(number + 1), number + 1) is None  # same layout: no new ring
        previous = number + 1
    with pytest.raises(ValueError, match=r"^a re-announce must be of a newer generation than 5, "):
        reader.reannounce(passed(announce))


def test_a_structured_ring_is_a_ring_of_its_own() -> None:
    """``structured`` (the last leaf is the writer's data) is part of what makes a ring: the
    same tensors with and without it get a new ring each time (planted: the flag ignored when
    the layout fits, and the reader takes a message's last tensor for its structure)."""
    writer = RingWriter()
    leaves = [torch.zeros(3), torch.arange(16, dtype=torch.uint8)]
    first = _first(writer.write(leaves, 0.0, 1, structured=True))
    reader = RingReader(passed(first))
    before = reader.structured
    assert first.structured and before
    assert writer.write(leaves, 0.5, 2, structured=True) is None  # the same: no new ring
    plain = _first(writer.write(leaves, 1.0, 3))
    assert not plain.structured and plain.generation == 2
    reader.reannounce(passed(plain))
    after = reader.structured
    assert not after
    assert_same(read(reader)[2], leaves)
    assert _first(writer.write(leaves, 2.0, 4, structured=True)).generation == 3


def test_bad_input_is_refused() -> None:
    with pytest.raises(TypeError, match=r"^slots must be an int >= 1, got float: 2.0$"):
        RingWriter(2.0)  # type: ignore[arg-type]  # the wrong type, on purpose
    with pytest.raises(ValueError, match=r"^slots must be an int >= 1, got 0$"):
        RingWriter(0)
    writer = RingWriter()
    with pytest.raises(TypeError, match=r"^leaf 1 of the message is not a tensor: 3$"):
        writer.write([torch.ones(1), 3], 0.0, 1)  # type: ignore[list-item]  # on purpose
    with pytest.raises(TypeError, match=r"^leaf 0 of the message is a torch.sparse_coo tensor; "):
        writer.write([torch.eye(2).to_sparse()], 0.0, 1)
    announce = _first(writer.write([torch.ones(1)], 0.0, 1))
    with pytest.raises(ValueError, match=r"^the announce's buffer is not in shared memory: "):
        RingReader(pickle.loads(pickle.dumps(announce)))  # plain pickle copies the bytes
    writer.close()
    with pytest.raises(RuntimeError, match=r"^the ring writer is closed$"):
        writer.write([torch.ones(1)], 0.0, 2)
    reader = RingReader(announce)
    reader.close()
    with pytest.raises(RuntimeError, match=r"^the ring reader is closed$"):
        reader.latest()


def test_a_leaf_that_requires_grad_is_copied_without_a_graph() -> None:
    # A slot is a dtype view of the buffer, which autograd does not track back to the buffer:
    # a copy_ under grad mode would put the slot's view itself in the message's graph, which
    # would then keep the graph (and its leaf) alive until the slot is written again.
    # The first write makes the ring (the general path), the second takes the plain path
    # (planted: the plain path copying without detach(): the second leaf stayed alive).
    writer = RingWriter()
    readers: list[RingReader] = []
    for number in (1, 2):
        leaf = torch.ones(3, requires_grad=True)
        announce = writer.write([leaf * 2], 0.0, number)
        if number == 1:
            readers.append(RingReader(passed(_first(announce))))
        else:
            assert announce is None and writer._ring is not None and writer._ring.plain is not None
        _, _, (got,) = read(readers[0])
        assert not got.requires_grad and torch.equal(got, torch.full((3,), 2.0))
        alive = weakref.ref(leaf)
        del leaf
        gc.collect()
        assert alive() is None, f"the ring's slot holds message {number}'s autograd graph"


@pytest.fixture
def interleave(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, int, Callable[[], None]], None]]:
    """Run an action just before the ``at``-th leaf copy (0-based) of ``"in"`` or ``"out"``.

    It simulates the other end running in the middle of a copy: a deterministic race.
    """

    def arrange(which: str, at: int, action: Callable[[], None]) -> None:
        name = "_copy_in" if which == "in" else "_copy_out"
        original = getattr(_ring, name)
        calls = [0]

        def copy(*args: torch.Tensor) -> torch.Tensor | None:
            if calls[0] == at:
                action()
            calls[0] += 1
            return original(*args)  # type: ignore[no-any-return]  # _copy_in's None or _copy_out's

        monkeypatch.setattr(_ring, name, copy)

    yield arrange


def test_a_writer_that_laps_the_reader_during_its_copy_makes_it_copy_again(
    interleave: Callable[[str, int, Callable[[], None]], None],
) -> None:
    # Two leaves: the reader copies leaf 0 of write 1, then the writer runs K = 2 whole writes
    # (the second one into the reader's slot), then the reader copies leaf 1: a torn copy,
    # which the re-check of "started" must catch.
    writer = RingWriter(slots=2)
    reader = RingReader(passed(_first(writer.write([torch.full((8,), 1.0)] * 2, 1.0, 1))))

    def lap() -> None:
        for n in (2, 3):
            writer.write([torch.full((8,), float(n))] * 2, float(n), n)

    interleave("out", 1, lap)
    number, stamp, (a, b) = read(reader)
    assert (number, stamp) == (3, 3.0), "the reader returned the torn copy instead of trying again"
    assert torch.equal(a, torch.full((8,), 3.0)) and torch.equal(b, a), (a, b)


def test_a_reader_during_a_write_gets_the_previous_message(
    interleave: Callable[[str, int, Callable[[], None]], None],
) -> None:
    # The reader runs after the writer copied leaf 0 of write 2 (of 2 slots); write 1 is the
    # newest complete one, and slot 0 (write 2's) is half written.
    writer = RingWriter(slots=2)
    reader = RingReader(passed(_first(writer.write([torch.full((8,), 1.0)] * 2, 1.0, 1))))
    seen: list[tuple[int, float, list[torch.Tensor]]] = []
    interleave("in", 1, lambda: seen.append(read(reader)))
    writer.write([torch.full((8,), 2.0)] * 2, 2.0, 2)
    ((number, stamp, (a, b)),) = seen
    assert (number, stamp) == (1, 1.0), (number, stamp, a, b)
    assert torch.equal(a, torch.full((8,), 1.0)) and torch.equal(b, a), (a, b)
    assert read(reader)[0] == 2


def test_a_writer_still_writing_the_reader_s_slot_makes_it_copy_again(
    interleave: Callable[[str, int, Callable[[], None]], None],
) -> None:
    # Before the reader copies write 1 (slot 1 of 2), a writer thread runs write 2 (slot 0)
    # and half of write 3 (slot 1 again: leaf 0 only), then waits. The reader's copy is torn
    # (leaf 0 of write 3, leaf 1 of write 1) while write 3 is not done: only "started",
    # stored before the writer touched the slot, can tell the reader to copy again.
    writer = RingWriter(slots=2)
    reader = RingReader(passed(_first(writer.write([torch.full((8,), 1.0)] * 2, 1.0, 1))))
    midway, resume = threading.Event(), threading.Event()

    def pause_writer() -> None:
        midway.set()
        if not resume.wait(HANG_GUARD):
            raise RuntimeError("the test never let the writer go on")

    def write_on() -> None:
        for n in (2, 3):
            writer.write([torch.full((8,), float(n))] * 2, float(n), n)

    thread = threading.Thread(target=write_on, name="ring-test-writer")

    def start_writer() -> None:
        thread.start()
        if not midway.wait(HANG_GUARD):
            pytest.fail("the writer thread never reached the middle of write 3")

    interleave("in", 3, pause_writer)  # writes 2 and 3 copy leaves 0, 1, 2, 3: before leaf 1 of write 3
    interleave("out", 0, start_writer)
    try:
        number, stamp, (a, b) = read(reader)
    finally:
        resume.set()
        thread.join(HANG_GUARD)
    assert (number, stamp) == (2, 2.0), (number, stamp, a, b)
    assert torch.equal(a, torch.full((8,), 2.0)) and torch.equal(b, a), (a, b)
    assert read(reader)[0] == 3


def test_the_fence_without_libatomic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ring, "_fence_libraries", lambda: iter([("no-such-library.so", "fence")]))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    fence, problem = _ring._find_fence()
    assert problem is None  # x86: a locked instruction
    fence()
    fence()  # the lock was released

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    _, problem = _ring._find_fence()
    assert problem is not None and "'aarch64'" in problem and "libatomic" in problem, problem
    monkeypatch.setattr(_ring, "_NO_FENCE", problem)
    with pytest.raises(RuntimeError, match=r"^the shared-memory ring between processes needs a memory fence"):
        RingWriter().write([torch.ones(1)], 0.0, 1)


# --- across processes --------------------------------------------------------------------------

_BIG = 64 * 1024  # float32 elements: 256 KiB, so that copies overlap
_PATTERNS = 16  # message n holds n % _PATTERNS everywhere; the writer precomputes them
_MESSAGES = 3000


def _write_numbers(conn: Connection, count: int, slots: int, elements: int = _BIG) -> None:
    """The child: write messages 1..count, message n a tensor of ``elements`` holding n % _PATTERNS."""
    torch.set_num_threads(1)
    sources = [torch.full((elements,), float(value)) for value in range(_PATTERNS)]
    writer = RingWriter(slots)
    conn.send(writer.write([sources[1]], 1.0, 1))
    if conn.recv() != "go":
        return
    for number in range(2, count + 1):
        writer.write([sources[number % _PATTERNS]], float(number), number)
    conn.recv()  # "bye": the parent read the last message
    writer.close()
    conn.close()


def _torch_segments() -> set[str]:
    shm = Path("/dev/shm")
    return {entry.name for entry in shm.iterdir() if "torch" in entry.name} if shm.is_dir() else set()


def _recv(conn: Connection, what: str) -> object:
    if not conn.poll(HANG_GUARD):
        pytest.fail(f"timed out waiting for {what} from the writer's process")
    return conn.recv()


# 256 KiB: a writer that fences; 2 KiB: on x86-64 one that does not (_Ring.fenced).
@pytest.mark.parametrize("elements", [_BIG, 512])
def test_reads_across_processes_are_never_torn_and_leave_no_segment(elements: int) -> None:
    before = _torch_segments()
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    child = context.Process(target=_write_numbers, args=(there, _MESSAGES, 2, elements), name="ring-writer")
    child.start()
    there.close()
    try:
        announce = _recv(here, "the announce")
        assert isinstance(announce, Announce)
        reader = RingReader(announce)
        here.send("go")
        last, reads, deadline = 0, 0, time.monotonic() + HANG_GUARD
        while last < _MESSAGES:
            number, stamp, (tensor,) = read(reader)
            reads += 1
            expected = float(number % _PATTERNS)
            if not bool((tensor == expected).all()):
                low, high = float(tensor.min()), float(tensor.max())
                pytest.fail(f"torn read of message {number}: values {low}..{high}, expected {expected}")
            assert stamp == float(number), (number, stamp)
            assert number >= last, f"message {number} read after message {last}"
            last = number
            if time.monotonic() > deadline:  # a hang guard, not a timing assertion
                pytest.fail(f"the writer's process never wrote message {_MESSAGES} (last read {last})")
        here.send("bye")
        child.join(HANG_GUARD)
        assert child.exitcode == 0, f"the writer's process ended with exit code {child.exitcode}"
    finally:
        if child.is_alive():
            child.kill()
            child.join(HANG_GUARD)
        here.close()
    reader.close()
    del reader, announce
    gc.collect()
    ours = (f"_{os.getpid()}_", f"_{child.pid}_")  # torch names a segment torch_<pid>_...
    left = {name for name in _torch_segments() - before if any(pid in name for pid in ours)}
    assert not left, f"shared-memory segments left in /dev/shm: {sorted(left)}"
    assert reads >= 1


def test_a_writer_that_laps_every_copy_makes_the_reader_give_up_not_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review S5: a writer that finishes K writes during each of the reader's copies makes
    ``latest`` return None after ``_TRIES`` copies, instead of spinning for ever; once the
    writer leaves it one copy's time, the reader gets the newest write (planted: no bound on
    the tries: this test hangs, and its hang guard fails it)."""
    writer = RingWriter(slots=2)
    reader = RingReader(passed(_first(writer.write([torch.full((8,), 1.0)], 1.0, 1))))
    original = _ring._copy_out
    written = [1]
    copies = [0]

    def lapping_copy(view: torch.Tensor) -> torch.Tensor:
        copies[0] += 1
        for _ in range(2):  # K = 2 whole writes during the copy: its slot is written again
            written[0] += 1
            writer.write([torch.full((8,), float(written[0]))], float(written[0]), written[0])
        return original(view)

    monkeypatch.setattr(_ring, "_copy_out", lapping_copy)
    assert reader.latest() is None  # the autouse hang guard fails a reader that spins
    assert copies[0] == _ring._TRIES
    monkeypatch.setattr(_ring, "_copy_out", original)
    assert read(reader)[0] == written[0]


# --- the reader's spare tensors (RingReader.prepare) ----------------------------------------------


def test_a_prepared_reader_copies_into_tensors_it_then_hands_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``prepare`` a read copies into tensors made ahead, which become the caller's: a
    later read never writes into them, and a copy the writer laps is made again (planted: the
    spare kept after it was handed out: the second read overwrote the first's message)."""
    writer = RingWriter(slots=2)
    sent = [torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([7], dtype=torch.int64)]
    reader = RingReader(passed(_first(writer.write(sent, 1.0, 1))))
    assert reader.prepare() and not reader.prepare()  # made once, until handed out
    number, stamp, first = read(reader)
    assert (number, stamp) == (1, 1.0)
    assert_same(first, sent)
    assert reader.prepare()
    original = _ring._copy_into
    lapped = [False]

    def lapping(*args: Any) -> None:  # the writer laps this copy once: it is made again
        if not lapped[0]:
            lapped[0] = True
            for n in (3, 4):
                writer.write([sent[0] + n, sent[1] + n], float(n), n)
        original(*args)

    writer.write([sent[0] + 2, sent[1] + 2], 2.0, 2)
    monkeypatch.setattr(_ring, "_copy_into", lapping)
    number, _, second = read(reader)
    assert number == 4 and lapped[0]
    assert_same(second, [sent[0] + 4, sent[1] + 4])
    assert_same(first, sent)  # the first message is still the first
    assert second[0].data_ptr() != first[0].data_ptr()


# --- the plain path (one leaf of the ring's layout, copied with the fewest calls) ---------------


def _plain_cases() -> list[tuple[str, torch.Tensor]]:
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    return [
        ("dense", base + 1),
        ("strided", (base.t().contiguous() + 2).t()),  # (3, 4) in column order: not contiguous
        ("offset", torch.arange(15, dtype=torch.float64)[3:].reshape(3, 4)),  # a view at an offset
        ("negated", torch._neg_view(base + 3)),  # its bytes are not its values
        ("grad", (base + 4).requires_grad_()),
        ("other dtype", base.to(torch.float32)),  # not the ring's layout: a new ring
    ]


def test_the_plain_path_writes_what_torch_would() -> None:
    """Writes into a ring of one float64 leaf: a tensor of the leaf's dtype and shape goes by
    the plain path (strided, at an offset, negated or requiring grad too), another dtype makes a
    new ring; the reader gets the same values either way (planted: the plain path taking a
    tensor of another dtype: the reader got float64 values of a float32 message)."""
    writer = RingWriter(slots=2)
    first = torch.zeros(3, 4, dtype=torch.float64)
    reader = RingReader(passed(_first(writer.write([first], 0.0, 1))))
    assert writer._ring is not None and writer._ring.plain == ((torch.float64, (3, 4)),)
    taken = []
    for number, (name, tensor) in enumerate(_plain_cases(), start=2):
        announce = writer.write([tensor], float(number), number)
        if announce is not None:
            reader.reannounce(passed(announce))
        taken.append(name if _ring._fits_plain(tensor, ((torch.float64, (3, 4)),)) else None)
        if number % 2:
            reader.prepare()  # both ways of copying out
        got_number, stamp, (got,) = read(reader)
        assert (got_number, stamp) == (number, float(number)), name
        assert got.dtype == tensor.dtype and torch.equal(got, tensor.detach().resolve_neg()), name
    assert taken == ["dense", "strided", "offset", "negated", "grad", None]


def test_no_plain_path_for_several_leaves_a_structured_slot_complex_or_empty_tensors() -> None:
    for tensors, structured in (
        ([torch.ones(2), torch.ones(2)], False),
        ([torch.ones(2)], True),
        ([torch.ones(2, dtype=torch.complex64)], False),
        ([torch.ones(0)], False),
    ):
        writer = RingWriter()
        reader = RingReader(passed(_first(writer.write(tensors, 1.0, 1, structured=structured))))
        assert writer._ring is not None and writer._ring.plain is None
        assert_same(read(reader)[2], tensors)
    conjugate = torch.tensor([1 + 2j, 3 - 4j]).conj()  # a conjugate bit its bytes do not show
    writer = RingWriter()
    reader = RingReader(passed(_first(writer.write([torch.zeros(2, dtype=torch.complex64)], 1.0, 1))))
    writer.write([conjugate], 2.0, 2)
    assert torch.equal(read(reader)[2][0], conjugate.resolve_conj())


def test_a_nested_tensor_on_a_plain_ring_is_refused_as_any_tensor_that_is_not_dense() -> None:
    """A nested tensor of the plain ring's dtype (class Tensor, strided layout) is refused with
    the ring's TypeError, not torch's internal error of a nested tensor's shape (planted: the
    plain path asking the shape before ``is_nested``: RuntimeError "Internal error: ...")."""
    writer = RingWriter(slots=2)
    writer.write([torch.zeros(2, dtype=torch.float64)], 1.0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: nested tensors are a prototype
        nested = torch.nested.nested_tensor(
            [torch.zeros(2, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
        )
    assert (
        nested.__class__ is torch.Tensor and nested.layout is torch.strided and nested.dtype is torch.float64
    )
    assert not writer.write_plain(nested, 2.0, 2)
    with pytest.raises(TypeError, match=r"^leaf 0 of the message is a torch.strided nested tensor; "):
        writer.write([nested], 2.0, 2)


def test_a_reader_during_a_plain_write_gets_the_previous_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that runs while the writer copies a plain leaf (after ``started``, before
    ``done``) gets the previous message whole (planted: ``done`` stored before the copy:
    the reader got the slot before write 2 filled it)."""
    writer = RingWriter(slots=2)
    reader = RingReader(passed(_first(writer.write([torch.full((8,), 1.0)], 1.0, 1))))
    seen: list[tuple[int, float, list[torch.Tensor]]] = []
    original = _ring._copy_in

    def midway(view: torch.Tensor, tensor: torch.Tensor) -> None:
        seen.append(read(reader))
        original(view, tensor)

    monkeypatch.setattr(_ring, "_copy_in", midway)
    assert writer.write_plain(torch.full((8,), 2.0), 2.0, 2)
    monkeypatch.setattr(_ring, "_copy_in", original)
    ((number, stamp, (got,)),) = seen
    assert (number, stamp) == (1, 1.0) and torch.equal(got, torch.full((8,), 1.0))
    number, stamp, (got,) = read(reader)
    assert (number, stamp) == (2, 2.0) and torch.equal(got, torch.full((8,), 2.0))


def test_a_reader_woken_before_the_copy_waits_for_the_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ the wake before the copy ]: ``write_plain`` calls ``wake`` after ``started``
    and before its copy; a reader that comes then waits for ``done`` and gets that message
    (planted: ``latest`` not waiting for a write begun: the reader got message 1, and the
    writer's copy waited in vain for it to wait)."""
    writer = RingWriter(slots=2)
    reader = RingReader(passed(_first(writer.write([torch.full((8,), 1.0)], 1.0, 1))))
    waiting = threading.Event()
    settle = _ring._settle

    def observed(words: memoryview, started: int, patience: float) -> bool:
        waiting.set()
        return settle(words, started, patience)

    monkeypatch.setattr(_ring, "_settle", observed)
    got: list[tuple[tuple[int, float, list[torch.Tensor]] | None, bool]] = []
    thread = threading.Thread(
        target=lambda: got.append((reader.latest(HANG_GUARD), reader.unsettled)), daemon=True
    )
    original = _ring._copy_in

    def copy_once_the_reader_waits(view: torch.Tensor, tensor: torch.Tensor) -> None:
        waiting.wait(HANG_GUARD)
        original(view, tensor)

    monkeypatch.setattr(_ring, "_copy_in", copy_once_the_reader_waits)
    assert writer.write_plain(torch.full((8,), 2.0), 2.0, 2, thread.start)
    thread.join(HANG_GUARD)
    assert waiting.is_set(), "the reader did not wait for the write begun"
    ((message, unsettled),) = got
    assert message is not None and not unsettled
    number, stamp, (tensor,) = message
    assert (number, stamp) == (2, 2.0) and torch.equal(tensor, torch.full((8,), 2.0))


def test_a_write_that_does_not_finish_in_the_readers_patience_leaves_it_unsettled() -> None:
    """A reader that finds a write begun which does not finish within its patience (here the
    writer's own thread, in ``wake``) gets the previous message and says it is unsettled; the
    writer, once done, wakes the readers again, and then the reader gets the new one, settled
    (planted: ``unsettled`` not set: the first read said settled; the writer not looking at
    the waiting word: no second wake)."""
    writer = RingWriter(slots=2)
    reader = RingReader(passed(_first(writer.write([torch.full((8,), 1.0)], 1.0, 1))))
    seen: list[tuple[int, bool]] = []

    def wake() -> None:
        got = reader.latest(0.0)
        seen.append((-1 if got is None else got[0], reader.unsettled))

    assert writer.write_plain(torch.full((8,), 2.0), 2.0, 2, wake)
    assert seen == [(1, True), (2, False)]
    assert read(reader)[0] == 2 and not reader.unsettled
    assert not writer.write_plain(torch.full((3,), 2.0), 3.0, 3, wake)  # not written: no wake
    assert writer.write_plain(torch.full((8,), 4.0), 4.0, 4, lambda: seen.append((0, False)))
    assert seen == [(1, True), (2, False), (0, False)]  # nobody waited: one wake
