"""``Recorder``: a run's messages written to an MCAP file as the run goes (``mujou[record]``).

Making a recording programmatically::

    import mujou
    net = MyNet()
    recorder = mujou.Recorder("run.mcap", state_every=1.0)  # outputs=None: every output
    with mujou.run(net, timer=mujou.VirtualTimer(), record=recorder) as run:
        run.sleep(5.0)  # every message of the 5 s, a keyframe each second
    # the file is complete once the run stopped (the with block's end): recorder.messages,
    # recorder.lost; mujou.run(net, record="run.mcap") records every output, no keyframes.
    # Snapshot mode: mujou.Recorder(snapshot=2.0) keeps the last 2 s; run.snapshot("x.mcap").
    # Reading back: _encoding.decode_message(message.data, channel.metadata["layout"]) gives
    # the message; _state.loads(attachment.data, name) a keyframe's state tree.

The file layout is the page "Record and replay" (:ref:`record.layout`); the message encoding is
``_encoding.py``'s. See :ref:`record.recorder`. The file is written by ``mcap``'s own writer: the
reference implementation of the format Foxglove and the other viewers read, it writes chunks
with their indexes and a summary (a reader finds ports, times and keyframes without a full
scan), and it is pure Python with lz4 and zstandard as its only dependencies. Its cost per
message (a few µs of Python) bounds the recorder's rate for small messages.

NOTE [ the recorder's tap ]
The recorder watches each recorded output as ``run.subscribe`` does (a watcher of the port,
called where the message is published): a run that records nothing runs no code of it. The
watcher puts ``(channel, message, time, microstep)`` on a deque; a writer thread of the run
(``mujou-record``) takes them off, brings tensors to the CPU, encodes and writes them. Messages
are read-only once sent (ports.message-read-only), so the reference is enough.
NOTE [ the writer and the GIL ]
Under the GIL a thread that computes in Python keeps the GIL until another has waited for it
for the switch interval (5 ms): a writer busy for long would make every hook that wants the GIL
meanwhile start up to 5 ms late. Under the real-time timer the writer therefore sleeps briefly
(``_PAUSE``) after each ``_SLICE`` of writing: a sleep lets a waiting thread take the GIL at
once, so a hook waits for the writer about ``_SLICE`` at most. This halves the writer's
throughput at most; under the virtual timer, where lateness means nothing, it writes flat out.
Nor does a hook's message wake an idle writer (a wake-up per message hands the GIL to the
writer and back each time: on the fleet at N=100 that alone took the p99 lateness from 1.9 ms
to 8.6 ms): the idle writer looks at the queue every ``_POLL``, and is woken only when the
queue is half full.

Under the real-time timer the watcher runs in the sending hook: it never waits; past ``queue``
waiting messages it drops the new one and counts it (``lost``). Under the virtual timer it runs
where the instant's messages are published, between instants: it waits there for room, so
nothing is lost and the instants that follow start later; what runs does not change.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import math
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import torch

from .._errors import MujouInternalError
from .._files import file_path, reworded, written
from .._messages import cpu_tensor_copy
from .._numbers import shown
from .._state import dumps
from . import _encoding

if TYPE_CHECKING:
    from .._engine import Engine
    from .._handles import RunProcesses as Processes  # Protocols: the classes' modules import this one
    from .._handles import RunView as Run
    from .._net import Net
    from .._node import Node
    from .._port import _Port

COMPRESSIONS = ("zstd", "lz4", None)
DEFAULT_CHUNK_SIZE = 1 << 20  # bytes of messages per chunk before compression: mcap's default
DEFAULT_QUEUE = 8192  # messages waiting for the writer at most (real-time timer): about 0.1 s at 80k/s
STATE_MEDIA_TYPE = "application/x-mujou-state"
_NO_HOLDER = -1  # Engine.crashed's holder of a thread that holds no node
_IDLE_WAIT = 0.05  # real seconds the writer sleeps on an empty queue before it looks again
_ROOM_WAIT = 0.05  # real seconds a virtual-timer tap waits for room before it looks again
_STUCK = 60.0  # real seconds without progress after which the writer is taken for stuck
_SLICE = 0.0001  # real seconds the writer writes under the real-time timer before a pause
_POLL = 0.002  # real seconds between two looks of an idle writer at the queue (real-time timer)
_PAUSE = 0.00005  # real seconds of that pause (the OS makes it longer: its timer slack)


def _mcap() -> Any:
    """The mcap writer module; ImportError saying how to install it."""
    try:
        from mcap import writer
    except ImportError:
        raise ImportError("recording a run needs the mcap package: pip install 'mujou[record]'") from None
    return writer


@final
class Recorder:
    """How a run is recorded: pass one to ``mujou.run(net, record=...)``. See :ref:`record.recorder`.

    Args:
        path: The MCAP file to write (created when the run starts; an existing one is
            replaced). None with ``snapshot`` (and only then).
        outputs: The outputs to record: Output ports or their names (``"node.port"``); None
            records every output of the net.
        state_every: Timer seconds between two keyframes (the run's state tree, as
            ``mujou.save`` writes it), the first at the run's start; None writes none.
        compression: ``"zstd"``, ``"lz4"`` or None: how each chunk is compressed.
        chunk_size: Bytes of messages per chunk.
        queue: Under the real-time timer, the messages waiting for the writer at most; more
            are dropped and counted (:attr:`lost`).
        snapshot: Keep only the last ``snapshot`` timer seconds in memory, and write them on
            :meth:`snapshot` (rosbag2's snapshot mode); None writes as the run goes.

    A recorder records one run.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        outputs: Iterable[object] | None = None,
        state_every: float | None = None,
        compression: str | None = "zstd",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        queue: int = DEFAULT_QUEUE,
        snapshot: float | None = None,
    ) -> None:
        _mcap()
        if snapshot is not None:
            snapshot = _positive("snapshot", snapshot)
        if path is None and snapshot is None:
            raise ValueError("path must be a file path, or None with snapshot= (a snapshot recorder)")
        if path is not None and snapshot is not None:
            raise ValueError(
                "a snapshot recorder writes only when asked: give it no path, and the path to "
                "recorder.snapshot(path) or run.snapshot(path)"
            )
        self._path = None if path is None else file_path("path", path)
        if outputs is not None and (isinstance(outputs, str) or not isinstance(outputs, Iterable)):
            raise TypeError(
                "outputs must be a list of Output ports or port names ('node.port'), or None "
                f"for every output, got {type(outputs).__name__}: {shown(outputs)}"
            )
        self._outputs = None if outputs is None else list(outputs)
        self._state_every = None if state_every is None else _positive("state_every", state_every)
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be 'zstd', 'lz4' or None, got {compression!r}")
        self._compression = compression
        self._chunk_size = _count("chunk_size", chunk_size)
        self._queue = _count("queue", queue)
        self._snapshot = snapshot
        self._session: Session | None = None

    @property
    def lost(self) -> int:
        """The messages dropped because the writer fell ``queue`` messages behind (real-time timer)."""
        return 0 if self._session is None else self._session.lost_count()

    @property
    def messages(self) -> int:
        """The messages the writer has taken so far (written to the file, or into a snapshot
        recorder's memory)."""
        return 0 if self._session is None else self._session.messages

    def snapshot(self, path: str | os.PathLike[str]) -> None:
        """Write the messages and keyframes kept (the last ``snapshot`` seconds) to ``path``.

        The file is written whole (a temporary file renamed over ``path``). See
        :ref:`record.snapshot`.

        Raises:
            RuntimeError: the recorder was made without ``snapshot=``, or has recorded no run.
            OSError: the file cannot be written.
        """
        target = file_path("path", path)
        if self._snapshot is None:
            raise RuntimeError("snapshot(): this recorder writes as the run goes; make it with snapshot=")
        if self._session is None:
            raise RuntimeError("snapshot(): this recorder has recorded no run yet")
        self._session.write_snapshot(target)

    def __repr__(self) -> str:
        where = "snapshot" if self._path is None else str(self._path)
        return f"<mujou.Recorder {where}: {self.messages} messages, {self.lost} lost>"


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a positive number of seconds, got {type(value).__name__}: {value!r}")
    if not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def recorder_of(record: object) -> Recorder | None:
    """``mujou.run``'s ``record=``: a Recorder, a path (a Recorder of it), or None."""
    if record is None or isinstance(record, Recorder):
        return record
    if isinstance(record, str | os.PathLike):
        return Recorder(record)
    raise TypeError(
        f"record must be a mujou.Recorder, a file path or None, got {type(record).__name__}: {shown(record)}"
    )


@dataclass
class _Channel:
    """A recorded output: its names, and a channel id for each message structure met."""

    port: _Port
    name: str  # node.port
    node: str
    attr: str
    metadata: dict[str, str]
    ids: dict[object, int] = field(default_factory=dict)  # structure key -> channel id
    # Messages dropped: counted only where the port's messages are published (its node's hook
    # thread, or the engine's commit), one thread at a time, so a plain int is enough.
    lost: int = 0
    mirrored: bool = False  # its node is in another process: the host sees no microstep


@dataclass
class _Kept:
    """A snapshot recorder's memory: encoded messages and keyframes, oldest first."""

    messages: collections.deque[tuple[int, int, int, bytes]] = field(default_factory=collections.deque)
    keyframes: list[tuple[int, bytes]] = field(default_factory=list)


_STOP = object()


class _Flush:
    """A marker the writer sets when it reaches it: everything before it is written or kept."""

    def __init__(self) -> None:
        self.done = threading.Event()


class Session:
    """One run's recording: the channels, the queue, the writer thread, the keyframes."""

    def __init__(
        self, recorder: Recorder, net: Net, nodes: Sequence[Node], engine: Engine, workers: int, *, seed: int
    ) -> None:
        if recorder._session is not None:
            raise RuntimeError("this mujou.Recorder has recorded a run already; a recorder records one run")
        self.recorder = recorder
        self.engine = engine
        self.virtual = engine.virtual
        self.channels = _channels(recorder, nodes)
        self.pending: collections.deque[Any] = collections.deque()
        self.limit = recorder._queue
        self.messages = 0
        self.idle = False
        self.wake = threading.Event()
        self.room = threading.Event()
        self.waiting_room = False
        self.dead = False
        self.failure: BaseException | None = None
        self.reported = False  # the failure was made the run's error
        self.closing = False
        self.closed = False
        self.window = None if recorder._snapshot is None else round(recorder._snapshot * 1e9)
        self.kept = _Kept()
        self.kept_lock = threading.Lock()
        self.kept_channels: list[tuple[int, _Channel, _encoding.Plan, dict[str, str]]] = []
        self.muted = False  # while a restore republishes the saved messages: not sent in this run
        self.schemas: dict[object, int] = {}  # (schema name, schema data) -> id, in the file
        self.plans: dict[tuple[int, object], tuple[_encoding.Plan, int]] = {}  # (channel, key) -> plan, id
        self.next_channel = itertools.count(1)
        self.start_time = engine.time()
        self.keyframe_n = 0
        # The header is written by start(), once the run has seeded its nodes (threads.derived-seed).
        self.header_of = functools.partial(_header, net, nodes, engine, workers, recorder, seed=seed)
        self.header: dict[str, dict[str, str]] = {}
        self.unwatch: list[Callable[[], None]] = []
        self.writer: Any = None
        self.stream: _Unbuffered | None = None
        self.last_progress = (time.monotonic(), 0)
        if recorder._path is not None and self.window is None:
            self.stream = _open(recorder._path)
        self.polite = not self.virtual  # NOTE [ the writer and the GIL ]
        self.slice_began = 0.0
        self.thread = threading.Thread(target=self._main, name="mujou-record", daemon=True)
        recorder._session = self

    # -- the tap --------------------------------------------------------------------------

    def begin(self, processes: Processes | None = None) -> None:
        """Start the writer and watch every recorded port (before any hook of the host's
        process runs); a port of another process through its mirror (:ref:`record.processes`)."""
        self.start()
        for channel in self.channels:
            port = channel.port
            channel.mirrored = processes is not None and processes.group_of(port.node) is not None
            watcher = self._real_watcher(channel) if not self.virtual else self._virtual_watcher(channel)
            port._add_watcher(watcher)
            self.unwatch.append(functools.partial(port._remove_watcher, watcher))
            if processes is not None and channel.mirrored:
                self.unwatch.append(processes.watch(port))

    def started(self, run: Run) -> None:
        """The run started: close the recording when it stops; keyframes under the real-time timer."""
        self.engine.finishers.append(self.close)
        if not self.virtual and self.recorder._state_every is not None:
            self.keyframes_real(run)

    def _real_watcher(self, channel: _Channel) -> Callable[[Any], None]:
        port, pending, limit = channel.port, self.pending, self.limit
        wake_at = limit // 2

        def watch(message: Any) -> None:
            if self.muted:
                return
            if len(pending) >= limit:
                channel.lost += 1
                return
            latest = port._latest
            pending.append((channel, message, latest[3] if latest is not None else 0.0, 0))
            if self.idle and len(pending) > wake_at:  # NOTE [ the writer and the GIL ]
                self.wake.set()

        return watch

    def _virtual_watcher(self, channel: _Channel) -> Callable[[Any], None]:
        port, pending, limit = channel.port, self.pending, self.limit
        engine = None if channel.mirrored else self.engine

        def watch(message: Any) -> None:
            if self.muted:
                return
            while len(pending) >= limit and not self.dead:
                self.waiting_room = True
                self.room.wait(_ROOM_WAIT)
                self.room.clear()
            if self.dead:
                channel.lost += 1
                return
            latest = port._latest
            microstep = 0 if engine is None else engine.microstep
            pending.append((channel, message, latest[3] if latest is not None else 0.0, microstep))
            if self.idle:
                self.wake.set()

        return watch

    def lost_count(self) -> int:
        """The messages dropped so far."""
        return sum(channel.lost for channel in self.channels)

    # -- the writer thread ----------------------------------------------------------------

    def start(self) -> None:
        self.header = self.header_of()
        # The outputs chosen, whether or not they send: a replay tells a port left out of the
        # recording from one that sent nothing (replay.mismatch).
        self.header["mujou"]["outputs"] = json.dumps([channel.name for channel in self.channels])
        if self.stream is not None:
            self.writer = self._new_writer(self.stream)
        self.thread.start()

    def _new_writer(self, stream: Any) -> Any:
        """An ``mcap`` writer on ``stream`` with the recorder's chunks and compression, started,
        the header's metadata records written."""
        mcap = _mcap()
        compression = {
            "zstd": mcap.CompressionType.ZSTD,
            "lz4": mcap.CompressionType.LZ4,
            None: mcap.CompressionType.NONE,
        }[self.recorder._compression]
        writer = mcap.Writer(stream, chunk_size=self.recorder._chunk_size, compression=compression)
        writer.start(profile="mujou", library=f"mujou {self.header['mujou']['version']}")
        for name, values in self.header.items():
            writer.add_metadata(name, values)
        return writer

    def _main(self) -> None:
        try:
            while True:
                item = self._next()
                if item is _STOP:
                    break
                if isinstance(item, _Flush):
                    item.done.set()
                    continue
                channel, message, stamp, microstep = item
                if channel is None:
                    self._keyframe(stamp, message)
                else:
                    self._message(channel, message, stamp, microstep)
                del item, message  # the message's memory goes back now, not at the next one
            if self.writer is not None:
                self._finish()
        except BaseException as exc:
            self.failure = exc
            self.dead = True
            self.room.set()
            if not self.closing:
                self.reported = True  # the run's error: close() need not raise it again
                self.engine.crashed(_NO_HOLDER, exc, exits=False)

    def _next(self) -> Any:
        pending = self.pending
        while True:
            if self.polite and time.perf_counter() - self.slice_began > _SLICE:
                time.sleep(_PAUSE)  # NOTE [ the writer and the GIL ]
                self.slice_began = time.perf_counter()
            try:
                item = pending.popleft()
            except IndexError:
                self.idle = True
                if pending:
                    self.idle = False
                    continue
                self.wake.wait(_POLL if self.polite else _IDLE_WAIT)
                self.wake.clear()
                self.idle = False
                self.slice_began = time.perf_counter()
                continue
            # The tap waiting for room is woken once half the queue is free, not at each
            # message taken: a wake-up per message would hand the GIL back and forth each time.
            if self.waiting_room and len(pending) <= self.limit // 2:
                self.waiting_room = False
                self.room.set()
            return item

    def _message(self, channel: _Channel, message: Any, stamp: float, microstep: int) -> None:
        if isinstance(message, torch.Tensor):
            key: object = _encoding.TENSOR
            if not message.is_cpu:
                message = cpu_tensor_copy(message)
        else:
            key = _encoding.structure_key(message)
        channel_id = channel.ids.get(key)
        if channel_id is None:
            channel_id = self._register(channel, key, message)
        if key is _encoding.TENSOR:
            data = _encoding.encode_tensor(message)
        else:
            data = b"".join(_encoding.message_parts(message, cpu_tensor_copy)[1])
        time_ns = round(stamp * 1e9)
        self.messages += 1
        if self.window is not None:
            with self.kept_lock:
                kept = self.kept.messages
                kept.append((channel_id, time_ns, microstep, data))
                oldest = time_ns - self.window
                while kept[0][1] < oldest:
                    kept.popleft()
            return
        self.writer.add_message(channel_id, time_ns, data, time_ns, microstep)

    def _register(self, channel: _Channel, key: object, message: Any) -> int:
        plan = _encoding.plan(message, channel.name)
        metadata = dict(channel.metadata)
        if isinstance(message, torch.Tensor):
            metadata.update(
                dtype=str(message.dtype).removeprefix("torch."),
                shape=json.dumps(list(message.shape)),
                kind="tensor",
            )
        else:
            metadata.update(kind="structured")
        metadata["layout"] = plan.layout
        channel_id = next(self.next_channel)
        self.plans[(channel_id, key)] = (plan, channel_id)
        channel.ids[key] = channel_id
        if self.writer is not None:
            self._write_channel(
                self.writer,
                channel_id=channel_id,
                channel=channel,
                plan=plan,
                metadata=metadata,
                schemas=self.schemas,
            )
        with self.kept_lock:
            self.kept_channels.append((channel_id, channel, plan, metadata))
        return channel_id

    @staticmethod
    def _write_channel(
        writer: Any,
        *,
        channel_id: int,
        channel: _Channel,
        plan: _encoding.Plan,
        metadata: dict[str, str],
        schemas: dict[object, int],
    ) -> None:
        """Register ``channel_id`` in ``writer``: mcap numbers channels itself, in order from 1."""
        schema_key = (plan.schema_name, plan.schema_data)
        schema_id = schemas.get(schema_key)
        if schema_id is None:
            schema_id = schemas[schema_key] = writer.register_schema(
                plan.schema_name, "protobuf", plan.schema_data
            )
        got = writer.register_channel(f"/{channel.node}/{channel.attr}", "protobuf", schema_id, metadata)
        if got != channel_id:
            raise MujouInternalError(f"the recorder's channel {channel_id} became {got} in the file")

    def _keyframe(self, stamp: float, data: bytes) -> None:
        time_ns = round(stamp * 1e9)
        if self.window is not None:
            with self.kept_lock:
                self.kept.keyframes.append((time_ns, data))
                self._trim_keyframes()
            return
        self.writer.add_attachment(
            create_time=time.time_ns(),
            log_time=time_ns,
            name=f"state/{time_ns}",
            media_type=STATE_MEDIA_TYPE,
            data=data,
        )

    def _trim_keyframes(self) -> None:
        _trim(self.kept.keyframes, self.kept.messages)

    def _finish(self) -> None:
        self.writer.add_metadata("mujou.end", self._end_record(self.messages))
        self.writer.finish()
        assert self.stream is not None
        self.stream.close()

    def _end_record(self, messages: int) -> dict[str, str]:
        end = self.engine.end_time if self.engine.ended else self.engine.time()
        return {
            "lost": str(self.lost_count()),
            "messages": str(messages),
            "end_time_ns": str(round(end * 1e9)),
        }

    # -- keyframes ------------------------------------------------------------------------

    @property
    def takes_keyframes(self) -> bool:
        """Whether the run stops at keyframe times (virtual timer, ``state_every``)."""
        return self.virtual and self.recorder._state_every is not None

    def next_keyframe(self) -> float:
        every = self.recorder._state_every
        return math.inf if every is None else self.start_time + self.keyframe_n * every

    def take_keyframe(self, tree: dict[str, Any], at: float) -> None:
        """Queue the keyframe of ``tree``, the state at timer time ``at``."""
        self.keyframe_n += 1
        self._force((None, dumps(tree), at, 0))

    def advance(
        self,
        run: Run,
        advance: Callable[[float | None, Callable[[], bool] | None], bool],
        until: float | None,
        done: Callable[[], bool] | None,
    ) -> bool:
        """Virtual timer: ``advance(until, done)``, stopping at each keyframe's time to take it."""
        while True:
            due = self.next_keyframe()
            if due <= run.time:
                self.take_keyframe(run._state_tree(), run.time)
                continue
            if until is not None and due > until:
                return advance(until, done)
            if advance(due, done):
                return True
            if self.engine.ended or run.time < due:
                return False
            self.take_keyframe(run._state_tree(), due)

    def keyframes_real(self, run: Run) -> None:
        """Real-time timer: a thread that takes a keyframe every ``state_every`` timer seconds."""

        def main() -> None:
            try:
                while not self._over():
                    due = self.next_keyframe()
                    now = run.time
                    if now < due:
                        self.keyframe_stop.wait(min(_IDLE_WAIT, due - now))
                        continue
                    tree = run._state_tree()
                    if self._over():
                        return
                    self.take_keyframe(tree, tree["@mujou"]["time"])
            except BaseException as exc:
                if not self.engine.ended:
                    self.engine.crashed(_NO_HOLDER, exc, exits=False)

        self.keyframe_stop = threading.Event()
        self.keyframe_thread = threading.Thread(target=main, name="mujou-record-state", daemon=True)
        self.keyframe_thread.start()

    keyframe_stop: threading.Event

    def _over(self) -> bool:
        return self.closing or self.engine.ended

    keyframe_thread: threading.Thread | None = None

    # -- ends -----------------------------------------------------------------------------

    def _force(self, item: object) -> None:
        """Queue ``item`` whatever the queue holds (keyframes, flushes, the stop)."""
        self.pending.append(item)
        if self.idle:
            self.wake.set()

    def _wait_writer(self, until: Callable[[], bool]) -> None:
        """Wait until ``until()``; MujouInternalError if the writer failed or makes no progress."""
        last = (time.monotonic(), self.messages)
        while not until():
            if self.dead:
                raise MujouInternalError("the recorder's writer failed") from self.failure
            self.wake.set()
            time.sleep(0.001)
            now = time.monotonic()
            if self.messages != last[1]:
                last = (now, self.messages)
            elif now - last[0] > _STUCK:
                raise MujouInternalError(f"the recorder's writer made no progress for {_STUCK} s")

    def flush(self) -> None:
        """Wait until the writer has taken every message queued before this call."""
        marker = _Flush()
        self._force(marker)
        self._wait_writer(marker.done.is_set)

    def close(self) -> None:
        """The run has ended: stop watching, write what is queued, and the file's end."""
        if self.closed:
            return
        self.closed = True
        for undo in reversed(self.unwatch):
            undo()
        if self.keyframe_thread is not None:
            self.keyframe_stop.set()
            self.keyframe_thread.join(_STUCK)
        self.closing = True
        self._force(_STOP)
        self._wait_writer(lambda: self.dead or not self.thread.is_alive())
        self.thread.join(_STUCK)  # it has ended, or ends now that it failed
        if self.failure is not None and not self.reported:
            raise MujouInternalError("the recorder's writer failed") from self.failure

    def discard(self) -> None:
        """The run did not start: stop the writer, remove the file begun."""
        for undo in reversed(self.unwatch):
            undo()
        self.closed = self.closing = True
        self.recorder._session = None  # the run did not start: the recorder may record another
        if self.thread.is_alive():
            self._force(_STOP)
            self.thread.join(_STUCK)
        if self.stream is not None:
            self.stream.close()
            self.stream.close()
            assert self.recorder._path is not None
            self.recorder._path.unlink(missing_ok=True)

    def write_snapshot(self, target: Path) -> None:
        """Write what a snapshot recorder keeps to ``target``, whole."""
        if not self.closed:
            self.flush()
        with self.kept_lock:
            messages = collections.deque(self.kept.messages)
            keyframes = list(self.kept.keyframes)
            channels = list(self.kept_channels)
        _trim(keyframes, messages)
        with written(target, f"cannot write the recording {str(target)!r}") as stream:
            writer = self._new_writer(stream)
            ids: dict[int, int] = {}
            schemas: dict[object, int] = {}
            for n, (channel_id, channel, plan, metadata) in enumerate(channels, 1):
                ids[channel_id] = n
                self._write_channel(
                    writer, channel_id=n, channel=channel, plan=plan, metadata=metadata, schemas=schemas
                )
            for time_ns, data in keyframes:
                writer.add_attachment(time.time_ns(), time_ns, f"state/{time_ns}", STATE_MEDIA_TYPE, data)
            for channel_id, time_ns, microstep, data in messages:
                writer.add_message(ids[channel_id], time_ns, data, time_ns, microstep)
            writer.add_metadata("mujou.end", self._end_record(len(messages)))
            writer.finish()


def _trim(
    keyframes: list[tuple[int, bytes]], messages: collections.deque[tuple[int, int, int, bytes]]
) -> None:
    """Keep the keyframes of the messages' window, from the last one at or before its first
    message (where a replay of the window starts)."""
    if not messages:
        return
    oldest = messages[0][1]
    while len(keyframes) > 1 and keyframes[1][0] <= oldest:
        del keyframes[0]


def check_outputs(recorder: Recorder, nodes: Sequence[Node]) -> None:
    """Refuse ``recorder``'s outputs= if one is not an output of ``nodes`` (before a start)."""
    _channels(recorder, nodes)


def start_with_processes(
    recorder: Recorder,
    *,
    net: Net,
    nodes: Sequence[Node],
    engine: Engine,
    processes: Processes,
    workers: int,
    seed: int,
) -> Session:
    """The recording of a run with processes, which have started (:ref:`record.processes`)."""
    session = Session(recorder, net, nodes, engine, workers, seed=seed)
    try:
        session.begin(processes)
    except BaseException:
        session.discard()
        raise
    return session


class _Unbuffered:
    """A file written without a buffer: mcap writes each chunk whole, so a run that is killed
    leaves every chunk written before it in the file (a buffer would keep the last ones back).
    Only what mcap's writer calls: write, tell, close."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._position = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        os.close(self._fd)


def _open(path: Path) -> _Unbuffered:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise reworded(exc, f"cannot write the recording {str(path)!r}") from exc
    return _Unbuffered(fd)  # closed by the writer thread at the run's end


def _channels(recorder: Recorder, nodes: Sequence[Node]) -> list[_Channel]:
    """The recorded outputs, checked: ValueError naming a port that is not an output of the net."""
    from .._ports import Output

    outputs: dict[str, _Port] = {}
    for node in nodes:
        for port in node._mujou.ports.values():
            if isinstance(port, Output):
                outputs[port.name] = port
    if recorder._outputs is None:
        chosen = list(outputs.values())
    else:
        chosen = []
        for item in recorder._outputs:
            name = item.name if isinstance(item, Output) and item._node is not None else item
            if not isinstance(name, str):
                raise TypeError(
                    "outputs must hold Output ports or port names ('node.port'), "
                    f"got {type(item).__name__}: {shown(item)}"
                )
            found = outputs.get(name)
            if found is None or (isinstance(item, Output) and item is not found):
                raise ValueError(
                    f"outputs: {name!r} is not an output of this net; its outputs are "
                    f"{', '.join(map(repr, outputs)) or 'none'}"
                )
            if found not in chosen:
                chosen.append(found)
    channels = []
    for port in chosen:
        node = port.node
        core = node._mujou
        period = core.period
        channels.append(
            _Channel(
                port=port,
                name=port.name,
                node=node.name,
                attr=port._attr,
                metadata={
                    "node": node.name,
                    "port": port._attr,
                    "dtype": "",
                    "shape": "",
                    "period": "" if period == math.inf else repr(period),
                    "device": str(node.device),
                    "kind": "",
                    "layout": "",
                },
            )
        )
    return channels


def _header(
    net: Net, nodes: Sequence[Node], engine: Engine, workers: int, recorder: Recorder, *, seed: int
) -> dict[str, dict[str, str]]:
    """The metadata records written first: ``mujou`` and ``mujou.net``."""
    from .._ports import Input, Output
    from .._version import __version__

    structure: dict[str, Any] = {"net": type(net).__qualname__, "nodes": [], "edges": []}
    for node in nodes:
        core = node._mujou
        ports = []
        for port in core.ports.values():
            kind = "output" if isinstance(port, Output) else "input"
            ports.append({"name": port._attr, "kind": kind})
            if isinstance(port, Input) and port.source is not None:
                structure["edges"].append([port.source.name, port.name])
        structure["nodes"].append(
            {
                "name": node.name,
                "class": f"{type(node).__module__}:{type(node).__qualname__}",
                "period": None if core.period == math.inf else core.period,
                "triggered": core.trigger is not None,
                "device": str(node.device),
                "dedicated_thread": node.dedicated_thread,
                "ports": ports,
            }
        )
    seeds = {node.name: node._mujou.seed for node in nodes}
    return {
        "mujou": {
            "version": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "timer": "virtual" if engine.virtual else "real",
            "seed": json.dumps(seeds),
            "run_seed": str(seed),
            "workers": str(workers),
            "state_every": "" if recorder._state_every is None else repr(recorder._state_every),
        },
        "mujou.net": {"structure": json.dumps(structure)},
    }
