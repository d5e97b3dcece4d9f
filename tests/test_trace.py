"""Unit tests of the trace recorder's streaming: bounded memory, a complete file at the end.

White-box: the slices a recorder holds are its threads' buffers (``_Track.slices``) and the
chunks waiting for its writer (``_pending``); the file grows beside the target while the run
runs and is renamed to it at the end (observe.trace: written atomically).
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

import mujou
from mujou import _trace
from mujou._trace import CHUNK, MAX_PENDING, Slice, TraceRecorder

GUARD = 30.0  # seconds: only a hang reaches this


def held(recorder: TraceRecorder) -> int:
    """The slices the recorder holds in memory now."""
    with recorder._lock:
        return sum(len(track.slices) for track in recorder._tracks) + sum(
            len(slices) for _, _, slices in recorder._pending
        )


def wait_written(recorder: TraceRecorder, events: int) -> None:
    """Wait until the writer has written ``events`` events (polling; fails on a hang)."""
    pause = threading.Event()
    for _ in range(int(GUARD / 0.001)):
        with recorder._lock:
            if recorder._written >= events and not recorder._pending:
                return
        pause.wait(0.001)
    pytest.fail(f"the writer did not write {events} events")


def load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as file:
        document = json.load(file)
    assert isinstance(document, dict)
    return document


def slices_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in document["traceEvents"] if e["ph"] == "X"]


def test_a_long_recording_holds_at_most_a_chunk_and_streams_to_a_temporary_file(tmp_path: Path) -> None:
    """Memory stays under a chunk per thread; the events are in a file beside the target."""
    path = tmp_path / "t.json"
    recorder = TraceRecorder(path)
    total = 20 * CHUNK + 7
    for i in range(total):
        recorder.record("n", "on_update", float(i), float(i) + 0.5, (float(i), 1.0, 0.0, None))
        assert len(recorder._tracks[0].slices) < CHUNK, f"the thread kept a chunk after {i + 1} records"
        assert held(recorder) <= CHUNK, f"{held(recorder)} slices held after {i + 1} records"
        if (i + 1) % CHUNK == 0:
            wait_written(recorder, i + 1)
    assert not path.exists(), "the target is written when the run ends, not before"
    (temporary,) = tmp_path.iterdir()
    assert temporary.name.startswith(".t.json.") and temporary.stat().st_size > 0
    recorder.write()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"], "a temporary file was left"
    document = load(path)
    slices = slices_of(document)
    assert len(slices) == total and document["otherData"]["dropped_slices"] == 0
    assert [e["args"]["t"] for e in slices] == [float(i) for i in range(total)]
    assert {e["tid"] for e in slices} == {1}
    assert [e for e in document["traceEvents"] if e["name"] == "thread_name"] == [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "MainThread"}}
    ]


def test_a_thread_waits_for_a_writer_that_falls_behind_and_nothing_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the file cannot keep up, at most MAX_PENDING chunks wait; the recording waits."""
    path = tmp_path / "t.json"
    recorder = TraceRecorder(path)
    writing, release = threading.Event(), threading.Event()
    events = recorder._events

    def slow_events(pid: int, tid: int, slices: list[Slice]) -> list[dict[str, Any]]:
        writing.set()
        assert release.wait(GUARD), "the test never released the writer"
        return events(pid, tid, slices)

    monkeypatch.setattr(recorder, "_events", slow_events)
    total = (MAX_PENDING + 4) * CHUNK
    errors: list[BaseException] = []

    def records() -> None:
        try:
            for i in range(total):
                recorder.record("n", "on_update", float(i), float(i), None)
                assert len(recorder._pending) <= MAX_PENDING, f"{len(recorder._pending)} chunks wait"
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=records)
    thread.start()
    assert writing.wait(GUARD), "the writer took no chunk"  # it holds the first one now

    def full() -> bool:
        with recorder._lock:
            return len(recorder._pending) == MAX_PENDING

    pause = threading.Event()
    for _ in range(int(GUARD / 0.001)):
        if full() or not thread.is_alive():
            break
        pause.wait(0.001)
    assert full(), errors
    # With one chunk in the writer and MAX_PENDING waiting, the rest cannot be recorded yet.
    assert thread.is_alive(), f"all {total} slices recorded past a stuck writer: {errors}"
    release.set()
    thread.join(GUARD)
    assert not thread.is_alive() and not errors, errors
    recorder.write()
    document = load(path)
    assert len(slices_of(document)) == total
    assert document["otherData"]["dropped_slices"] == recorder.dropped == 0


def test_threads_record_on_their_own_tracks_and_every_slice_is_written(tmp_path: Path) -> None:
    """Threads recording at once, past several chunks each: every slice, on its thread's track."""
    path = tmp_path / "t.json"
    recorder = TraceRecorder(path)
    per_thread = 3 * CHUNK + 11
    start = threading.Barrier(3)

    def records(name: str) -> None:
        start.wait(GUARD)
        for i in range(per_thread):
            recorder.record(name, "on_update", float(i), float(i), None)

    threads = [threading.Thread(target=records, args=(f"n{k}",), name=f"rec-{k}") for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GUARD)
        assert not thread.is_alive()
    recorder.write()
    document = load(path)
    dropped = document["otherData"]["dropped_slices"]
    tracks = {e["tid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    by_node: dict[str, list[dict[str, Any]]] = {}
    for event in slices_of(document):
        by_node.setdefault(event["name"], []).append(event)
    assert dropped == 0 and sum(map(len, by_node.values())) == 3 * per_thread
    for node, events in by_node.items():
        assert {tracks[e["tid"]] for e in events} == {f"rec-{node[1:]}"}, node


def test_a_run_with_many_hook_calls_writes_each_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a real run (virtual timer), past many chunks: one slice per hook call."""
    monkeypatch.setattr(_trace, "CHUNK", 64)  # many hand-overs in a short run

    class Fast(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.001, seed=0)
            self.updates = 0

        def on_update(self, dt: float) -> None:
            self.updates += 1

    class One(mujou.Net):
        def __init__(self) -> None:
            super().__init__()
            self.fast = Fast()

    net = One()
    path = tmp_path / "t.json"
    with mujou.run(net, workers=1, timer=mujou.VirtualTimer(), trace=path) as run:
        run.sleep(2.0)
        assert not path.exists()
    document = load(path)
    updates = [e for e in slices_of(document) if e["cat"] == "on_update"]
    assert len(updates) == net.fast.updates >= 2000
    assert document["otherData"]["dropped_slices"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


class _FullDisk(io.StringIO):
    """A file whose every write fails as a full disk's does."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_file_that_cannot_be_written_fails_at_the_end_and_the_hooks_go_on(tmp_path: Path) -> None:
    """An error of the file stops the writing, never the recording; write() raises it, naming
    trace= and the path, and leaves no file."""
    recorder = TraceRecorder(tmp_path / "t.json")
    recorder._file.close()
    recorder._file = _FullDisk()  # the disk fills up after the start
    total = (MAX_PENDING + 3) * CHUNK  # more than the writer could hold if it waited for room

    def records() -> None:
        for i in range(total):
            recorder.record("n", "on_update", float(i), float(i), None)

    thread = threading.Thread(target=records)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive(), "the recording waits for a writer that cannot write"
    where = re.escape(f"trace={str(tmp_path / 't.json')!r}")
    with pytest.raises(OSError, match=rf"^\[Errno {errno.ENOSPC}\] {where} could not be written: ") as info:
        recorder.write()
    assert isinstance(info.value.__cause__, OSError)
    assert recorder.dropped == total
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_cannot_be_written_fails_when_the_recorder_is_made(tmp_path: Path) -> None:
    """The temporary file is created at once (observe.trace-start): an error names trace=."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    where = re.escape(f"trace={str(blocker / 't.json')!r}")
    with pytest.raises(NotADirectoryError, match=rf"^\[Errno \d+\] {where} cannot be written: "):
        TraceRecorder(blocker / "t.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_discard_leaves_no_file(tmp_path: Path) -> None:
    """A recorder discarded (its run refused before any hook ran) leaves nothing behind."""
    recorder = TraceRecorder(tmp_path / "t.json")
    assert len(list(tmp_path.iterdir())) == 1
    recorder.discard()
    assert list(tmp_path.iterdir()) == []
