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
``_encoding.py``'s. See :ref:`record.recorder`. The file is written in a process of its own
(``_sink``, fed through shared memory by ``_feed``: NOTE [ the writer and the GIL ]) by
``_mcapwrite``, which writes byte for byte what ``mcap``'s own writer (the reference
implementation of the format Foxglove and the other viewers read) writes with its defaults:
chunks with their indexes and a summary, so that a reader finds ports, times and keyframes
without a full scan. ``mcap``'s writer spent 4.6 µs of Python on a message of 256 B, the
recorder's bound for small messages; ``_mcapwrite`` spends 0.8 µs. The ``mcap`` package stays
the extra's: Mujou's reader and the tests read with it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import math
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import torch

from .._errors import MujouInternalError
from .._files import file_path, reworded, written
from .._in_run import hooking
from .._messages import cpu_tensor_copy
from .._numbers import shown
from .._state import dumps
from . import _encoding, _feed, _mcapwrite, _sink

if TYPE_CHECKING:
    from .._engine import Engine
    from .._handles import RunProcesses as Processes  # Protocols: the classes' modules import this one
    from .._handles import RunView as Run
    from .._net import Net
    from .._node import Node
    from .._port import Latest, _Port

COMPRESSIONS = ("zstd", "lz4", None)
DEFAULT_CHUNK_SIZE = 1 << 20  # bytes of messages per chunk before compression: mcap's default
DEFAULT_QUEUE = 8192  # messages waiting for the recorder process at most (real-time timer)
DEFAULT_BUFFER = 1 << 26  # bytes of the feed to the recorder process (64 MiB)
_NO_HOLDER = -1  # Engine.crashed's holder of a thread that holds no node
_IDLE_WAIT = 0.05  # real seconds the keyframe thread sleeps at most before it looks at the time
_ROOM_WAIT = 0.0002  # real seconds a tap that waits for room in the feed sleeps before it looks again
_STUCK = 60.0  # real seconds without progress after which the recorder process is taken for stuck
# Real-time timer (NOTE [ the recorder's tap ]): a tensor message is kept by reference until a
# thread is about to wait, which copies _IDLE_CHUNK of them at a time, or fewer where they took
# _IDLE_SECONDS (tens of µs, so an update due meanwhile waits no longer; a port's first message,
# which registers its channel, takes a few hundred); past _DEFERRED_MOST kept a tap copies the
# oldest itself. A port whose copied message was over _DEFERRED_BYTES has its messages copied
# at once from then on.
_DEFERRED_BYTES = 1 << 16
_DEFERRED_MOST = 1024
_IDLE_CHUNK = 16
_IDLE_SECONDS = 0.0001
# A host's thread (one that runs no hooks) copies kept messages only while this many are kept.
_HOST_BACKLOG = _DEFERRED_MOST // 2


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
        outputs: The ports to record: outputs, and inputs without a source (the host's
            writes, :ref:`record.writes`), as ports or their names (``"node.port"``); None
            records all of them.
        state_every: Timer seconds between two keyframes (the run's state tree, as
            ``mujou.save`` writes it), the first at the run's start; None writes none.
        compression: ``"zstd"``, ``"lz4"`` or None: how each chunk is compressed.
        chunk_size: Bytes of messages per chunk.
        queue: Under the real-time timer, the messages waiting for the recorder process at
            most; more are dropped and counted (:attr:`lost`).
        buffer: The bytes of shared memory through which the messages go to the recorder
            process (a power of two, at least 4096; rounded up to one). Under the real-time
            timer a message that finds it full is dropped and counted.
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
        buffer: int = DEFAULT_BUFFER,
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
        self._buffer = max(4096, 1 << (_count("buffer", buffer) - 1).bit_length())
        self._snapshot = snapshot
        self._session: Session | None = None

    @property
    def lost(self) -> int:
        """The messages dropped because the recorder process fell behind (real-time timer)."""
        return 0 if self._session is None else self._session.lost_count()

    @property
    def messages(self) -> int:
        """The messages the recorder process has taken so far (written to the file, or into a
        snapshot recorder's memory)."""
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
    """A recorded output: its names, a channel id for each message structure met, a form for
    each tensor dtype and shape (and structure) met."""

    port: _Port
    name: str  # node.port
    node: str
    attr: str
    metadata: dict[str, str]
    ids: dict[object, int] = field(default_factory=dict)  # structure key -> channel id
    forms: dict[object, int] = field(default_factory=dict)  # form key -> form
    # The form of the last message when it is a CPU tensor small enough for one record:
    # (dtype, shape, its form in the feed: _feed.message_form of the form, its encoding's bytes
    # before the data and the data's bytes); a message like it takes the fast path of the tap.
    current: tuple[torch.dtype, torch.Size, _feed.MessageForm] | None = None
    # Its put (Session._putter) and its tap (the port's watcher), set when it is watched.
    put: _Put | None = None
    watcher: Callable[[Any], None] | None = None
    # Real-time timer: whether its tap keeps its tensors; False once a copy met one over
    # _DEFERRED_BYTES, and its tap copies at once (NOTE [ the recorder's tap ]).
    defers: bool = True
    # Messages dropped: counted only by one thread at a time (under the real-time timer with
    # Session.copy_lock held, else where the port's messages are published: its node's hook
    # thread, or the engine's commit), so a plain int is enough.
    lost: int = 0
    mirrored: bool = False  # its node is in another process: the host sees no microstep


# Copies a message of a channel into the feed: (message, stamp, microstep, wait for room or None).
_Put = Callable[[Any, float, int, Callable[[], None] | None], None]


class _GoneError(Exception):
    """The recorder process is gone: a tap that waits for room gives up."""


class Session:
    """One run's recording: the channels, the feed, the recorder process, the keyframes.

    NOTE [ the recorder's tap ]
    The recorder watches each recorded output as ``run.subscribe`` does (a watcher of the port,
    called where the message is published): a run that records nothing runs no code of it. A
    message is copied into the feed (``_feed``), a shared-memory ring that the recorder process
    (``_sink``) reads and writes to the file, by ``put``: a CPU tensor's encoding is the bytes
    that go before the data, kept for its dtype and shape, then the tensor's own bytes. A
    message of a new dtype, shape or structure first registers its form (and its channel, if
    new) in the feed; a structured message, or a tensor on another device, is encoded (brought
    to the CPU) whole, and its bytes go the same way.

    Under the real-time timer the copy (2-3 µs for a small tensor) is put off: the watcher of a
    tensor only appends its channel and the port's ``Latest`` (the message, its version and
    stamp: a message is not changed after it was sent, ports.send-snapshot and
    ports.send-no-copy) to ``deferred``, one queue for every port in the order sent, and looks
    at no ``muted`` flag (muting removes the watchers). A fleet's nodes due together on one
    worker each paid the copy before the next could start, and the last one waited for all of
    them (99 copies, about 0.3 ms, at N = 100). What the tap costs is measured inside the
    fleet's slot, not in a loop: between two sends of a port the other 99 updates (and, on a
    busy machine, other processes) leave the tap's memory cold, so each object it reads costs
    a cache miss. In a loop the tap cost 0.3 µs; in the slot (N = 100, load 4-8) 1.0 µs with
    a deque per channel, ``message.nbytes`` and the closure's cells, 0.45 µs now: what it uses
    is in its defaults (one tuple, not a cell object each), the pair goes in the one queue
    (its end is in cache: the slot's other taps append there), and the size bound is the
    copy's. The first copy of a tensor over _DEFERRED_BYTES clears the channel's ``defers``
    and gives its port the tap that copies at once, as for a structured message: the large
    tensors kept alive are at most those a port sent before its first one was copied
    (and at most _DEFERRED_MOST messages in all). The copies are made:
    - by the first of the run's threads about to wait (a worker, a dedicated node's thread:
      the engine's ``idle`` callbacks), _IDLE_CHUNK at a time so that an update due
      meanwhile is not held back long;
    - by a host's thread in a wait (one that runs no hooks: ``_in_run.hooking``) only while
      _HOST_BACKLOG or more are kept: it wakes at any time (``run.sleep`` looks every
      ``HOST_POLL_REAL``), often while a worker runs a fleet's slot, and its copies then held
      the GIL the worker needed, when the worker copies them anyway once the slot is done;
    - by the tap itself past _DEFERRED_MOST kept (memory stays bounded and a saturated run
      still records);
    - before any other message (a larger or structured one, copied at once, after those
      kept: one queue, so each port's order is kept);
    - all of them when the run ends, or before a snapshot.
    A kept tensor changed in place since it was sent (against ports.send-no-copy) is dropped
    and counted, never written changed. Under the virtual timer, and for a node in another
    process (whose messages reach the host on a thread of their own), the watcher copies each
    message at once, as before.

    Where the recorded fleet's added lateness came from (N = 100, 2 s runs, load 4-8, base
    against this tap alternated): no idle copy fell inside a slot (0 of about 1,400 calls);
    the slot's sends took 155-191 µs more than plain's (median slot), 77-153 µs with this tap.
    Left: in the steady run the recorded fleet makes about 2 gen0 collections in 2 s where
    the plain one makes none (the idle path's allocations, the same before this tap), and one
    that falls in a slot delays the rest of it; and on a busy machine the copies and the
    recorder process add CPU, so the worker wakes later.

    NOTE [ the writer and the GIL ]
    The writer is a process of its own because a writer thread in the run's process runs
    Python under the run's GIL: the writer spends about a µs of Python per message and
    milliseconds on each chunk's close (``mcap``'s spent a few µs and 8-15 ms), and a hook
    that wanted the GIL meanwhile waited for it (up to the 5 ms switch interval). The run's
    process now spends only the copy into the feed, in the hook that sends; no thread of it
    runs Python for the recording but to start and end it, and to take keyframes.

    Under the real-time timer the watcher never waits: when ``queue`` messages wait for the
    recorder process, or the feed has no room, it drops the message and counts it (``lost``).
    Under the virtual timer it runs where the instant's messages are published, between
    instants: it waits there for room (noticing a recorder process that died), so nothing is
    lost and the instants that follow start later; what runs does not change.
    """

    def __init__(
        self, recorder: Recorder, net: Net, nodes: Sequence[Node], engine: Engine, workers: int, *, seed: int
    ) -> None:
        if recorder._session is not None:
            raise RuntimeError("this mujou.Recorder has recorded a run already; a recorder records one run")
        self.recorder = recorder
        self.engine = engine
        self.virtual = engine.virtual
        self.channels = _channels(recorder, nodes)
        self.dead = False
        self.failure: BaseException | None = None
        self.reported = False  # the failure was made the run's error
        self.closing = False
        self.closed = False
        self.final_messages = 0  # recorder.messages once the recorder process ended
        self.window = None if recorder._snapshot is None else round(recorder._snapshot * 1e9)
        self.kept: tuple[list[_sink.Message], list[_sink.Keyframe]] | None = None  # after close
        self.kept_channels: list[tuple[int, _Channel, _encoding.Plan, dict[str, str]]] = []
        self._muted = False  # while a restore republishes the saved messages: not sent in this run
        self.register_lock = threading.Lock()  # channel ids in the feed's order, as mcap numbers them
        self.next_channel = itertools.count(1)
        self.next_form = itertools.count(_feed.FIRST_FORM)
        self.start_time = engine.time()
        self.keyframe_n = 0
        # The header is written by start(), once the run has seeded its nodes (threads.derived-seed).
        self.header_of = functools.partial(_header, net, nodes, engine, workers, recorder, seed=seed)
        self.header: dict[str, dict[str, str]] = {}
        self.unwatch: list[Callable[[], None]] = []
        # The real-time tap's messages not yet copied, oldest first: each one's channel and Latest.
        self.deferred: collections.deque[tuple[_Channel, Latest | None]] = collections.deque()
        self.copy_lock = threading.Lock()  # one thread copies the deferred messages at a time
        # Under the virtual timer a tap waits for room instead: queue does not count there.
        waiting = sys.maxsize if self.virtual else recorder._queue
        self.feed = _feed.FeedWriter(recorder._buffer, waiting)
        file_fd = None
        try:
            if recorder._path is not None and self.window is None:
                file_fd = _open(recorder._path)
            self.process = self._launch(file_fd)
        except BaseException:
            self.feed.close()
            if file_fd is not None:
                assert recorder._path is not None
                recorder._path.unlink(missing_ok=True)
            raise
        finally:
            if file_fd is not None:
                os.close(file_fd)  # the recorder process has its own
        self.monitor = threading.Thread(target=self._watch_process, name="mujou-record", daemon=True)
        self.monitor.start()
        recorder._session = self

    def _launch(self, file_fd: int | None) -> subprocess.Popen[bytes]:
        """Start the recorder process and send it its Config."""
        from .._version import __version__

        config = _sink.Config(
            feed_fd=self.feed.fd,
            feed_size=self.feed.size,
            wake_fd=self.feed.wake_fd,
            wake_most=_sink.WAKE_MOST,
            file_fd=file_fd,
            chunk_size=self.recorder._chunk_size,
            compression=self.recorder._compression,
            library=f"mujou {__version__}",
            window_ns=self.window,
            real_time=not self.virtual,
        )
        fds = tuple(fd for fd in (self.feed.fd, file_fd, self.feed.wake_fd) if fd is not None)
        process = subprocess.Popen(
            [sys.executable, "-c", _sink.launch_code()],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=fds,
        )
        assert process.stdin is not None
        process.stdin.write(pickle.dumps(config))
        process.stdin.flush()  # kept open: the recorder process takes its end for the run's
        return process

    def _watch_process(self) -> None:
        """The monitor thread: waits for the recorder process; its early end is the run's error."""
        try:
            process = self.process
            assert process.stderr is not None
            with process.stderr:
                errors = process.stderr.read()
            code = process.wait()
            if code == 0 and self.closing:
                return
            text = errors.decode(errors="replace").strip().splitlines()
            why = text[-1] if text else "no message"
            self.failure = MujouInternalError(f"the recorder process ended with exit code {code}: {why}")
            self.dead = True
            if not self.closing and not self.engine.ended:
                self.reported = True  # the run's error: close() need not raise it again
                self.engine.crashed(_NO_HOLDER, self.failure, exits=False)
        except BaseException as exc:
            self.failure, self.dead = exc, True
            if not self.engine.ended:
                self.engine.crashed(_NO_HOLDER, exc, exits=False)

    # -- the tap --------------------------------------------------------------------------

    def begin(self, processes: Processes | None = None) -> None:
        """Write the header and watch every recorded port (before any hook of the host's
        process runs); a port of another process through its mirror (:ref:`record.processes`)."""
        self.start()
        _encoding.tensor_schema()  # made once, now: not in the copy of a port's first message
        for channel in self.channels:
            port = channel.port
            channel.mirrored = processes is not None and processes.group_of(port.node) is not None
            channel.watcher = self._watcher(channel)
            port._add_watcher(channel.watcher)
            self.unwatch.append(functools.partial(self._unwatch, channel))
            if processes is not None and channel.mirrored:
                self.unwatch.append(processes.watch(port))
        if not self.virtual:
            self.engine.idle.append(self.copy_deferred)
            self.unwatch.append(functools.partial(self.engine.idle.remove, self.copy_deferred))

    def started(self, run: Run) -> None:
        """The run started: close the recording when it stops; keyframes under the real-time timer."""
        self.engine.finishers.append(self.close)
        if not self.virtual and self.recorder._state_every is not None:
            self.keyframes_real(run)

    @property
    def muted(self) -> bool:
        """Whether the taps are off: while a restore republishes the saved messages, which are
        not sent in this run. Muting removes the taps from their ports, so that they need not
        look at a flag on each message."""
        return self._muted

    @muted.setter
    def muted(self, muted: bool) -> None:
        if muted == self._muted:
            return
        with self.copy_lock:  # a copy may change a channel's tap (_copy_at_once)
            self._muted = muted
            for channel in self.channels:
                assert channel.watcher is not None  # set before the run started
                if muted:
                    channel.port._remove_watcher(channel.watcher)
                else:
                    channel.port._add_watcher(channel.watcher)

    def _unwatch(self, channel: _Channel) -> None:
        """Stop watching ``channel``'s port."""
        with self.copy_lock:
            assert channel.watcher is not None  # set before the run started
            channel.port._remove_watcher(channel.watcher)

    def _watcher(self, channel: _Channel) -> Callable[[Any], None]:
        """The tap of ``channel`` (NOTE [ the recorder's tap ]): under the real-time timer a
        tensor is kept for :meth:`copy_deferred` (while the channel ``defers``), any other
        message copied now (after those kept); under the virtual timer, or for a node in
        another process, every message is copied now."""
        port = channel.port
        put = channel.put = self._putter(channel)
        if self.virtual or channel.mirrored:
            engine = None if channel.mirrored or not self.virtual else self.engine
            wait = self._wait_room if self.virtual else None

            def watch(message: Any) -> None:
                latest = port._latest
                stamp = latest[3] if latest is not None else 0.0
                put(message, stamp, 0 if engine is None else engine.microstep, wait)

            return watch

        return self._deferring(channel) if channel.defers else self._at_once(channel)

    def _deferring(self, channel: _Channel) -> Callable[[Any], None]:
        """The real-time tap that keeps a tensor for :meth:`copy_deferred`; any other message
        it copies now (after those kept). What it uses is in its defaults, which the call
        makes its locals: a closure's cells are objects of their own, which the fleet's slot
        leaves cold (NOTE [ the recorder's tap ])."""
        at_once, copy = self._at_once(channel), self._copy_oldest

        def defer(
            message: Any,
            channel: _Channel = channel,
            port: _Port = channel.port,
            tensor: type = torch.Tensor,
            deferred: collections.deque[tuple[_Channel, Latest | None]] = self.deferred,
        ) -> None:
            if message.__class__ is not tensor:
                at_once(message)
                return
            deferred.append((channel, port._latest))  # the message, its version and stamp
            if len(deferred) > _DEFERRED_MOST:
                copy(len(deferred) - _DEFERRED_MOST)

        return defer

    def _at_once(self, channel: _Channel) -> Callable[[Any], None]:
        """The real-time tap that copies each message now, after those kept."""
        port, put, deferred = channel.port, channel.put, self.deferred
        assert put is not None  # set by _watcher

        def copy(message: Any) -> None:
            latest = port._latest
            with self.copy_lock:
                self._copy_locked(len(deferred), None)  # the port's earlier messages first
                put(message, latest[3] if latest is not None else 0.0, 0, None)

        return copy

    def copy_deferred(self) -> bool:
        """Copy the oldest messages kept by the real-time tap into the feed (dropped and
        counted where it has no room): _IDLE_CHUNK, or fewer once they took _IDLE_SECONDS;
        whether it did. The engine's ``idle`` callback: a thread calls it before it waits (NOTE
        [ the recorder's tap ]; a host's thread copies only past _HOST_BACKLOG); once none are
        kept, it wakes the recorder process for what was appended (NOTE [ waking the recorder
        ] in ``_feed``)."""
        deferred = self.deferred
        if not deferred:
            self.feed.kick()
            return False
        if len(deferred) < _HOST_BACKLOG and threading.get_ident() not in hooking:
            return False  # a host's thread: the run's threads copy them (NOTE [ the recorder's tap ])
        with self.copy_lock:
            self._copy_locked(_IDLE_CHUNK, None, time.perf_counter() + _IDLE_SECONDS)
        return True

    def _copy_oldest(self, most: int) -> None:
        """Copy the oldest ``most`` kept messages (a tap past _DEFERRED_MOST)."""
        with self.copy_lock:
            self._copy_locked(most, None)

    def _copy_locked(self, most: int, wait: Callable[[], None] | None, until: float = math.inf) -> None:
        """Copy the oldest ``most`` kept messages (``copy_lock`` held), in the order sent; once
        ``until`` (``perf_counter``) passed, no more (one at least)."""
        deferred, append = self.deferred, self.feed.message
        for k in range(min(most, len(deferred))):
            if k and time.perf_counter() > until:
                return
            channel, latest = deferred.popleft()
            assert latest is not None  # set before the port's watchers are called
            message = latest[0]
            if message._version != latest[1]:  # changed in place since it was sent: it is gone
                channel.lost += 1
                continue
            # A tensor (the tap keeps no other message) like the channel's last: its bytes
            # straight, as put's first branch, without put's type check, and its size read
            # from the form (current[2][5], the data bytes) instead of the tensor.
            current = channel.current
            if (
                wait is None
                and current is not None
                and (current[2][5] <= _DEFERRED_BYTES or not channel.defers)
                and message.dtype is current[0]
                and message.shape == current[1]
                and message.is_cpu
                and message.is_contiguous()
            ):
                if not append(current[2], message.data_ptr(), latest[3], 0):
                    channel.lost += 1
                continue
            if channel.defers and message.nbytes > _DEFERRED_BYTES:
                self._copy_at_once(channel)
            assert channel.put is not None  # set before its port is watched
            channel.put(message, latest[3], 0, wait)

    def _copy_at_once(self, channel: _Channel) -> None:
        """Give ``channel``'s port the tap that copies at once (``copy_lock`` held)."""
        channel.defers = False
        old, channel.watcher = channel.watcher, self._at_once(channel)
        if not self._muted:
            assert old is not None  # set before the run started
            channel.port._remove_watcher(old)
            channel.port._add_watcher(channel.watcher)

    def _putter(self, channel: _Channel) -> _Put:
        """What copies a message of ``channel`` into the feed: a CPU tensor like the last
        message straight, any other message by :meth:`_slow`; ``wait`` None: dropped and
        counted where the feed has no room."""
        append, tensor = self.feed.message, torch.Tensor

        def put(message: Any, stamp: float, microstep: int, wait: Callable[[], None] | None) -> None:
            current = channel.current
            if (
                current is None
                or not isinstance(message, tensor)
                or message.dtype is not current[0]
                or message.shape != current[1]
                or not message.is_cpu
                or not message.is_contiguous()
            ):
                self._slow(channel, message, stamp, microstep, wait)
            elif not append(current[2], message.data_ptr(), stamp, microstep):
                if wait is None:
                    channel.lost += 1
                    return
                try:
                    while not append(current[2], message.data_ptr(), stamp, microstep):
                        wait()
                except _GoneError:
                    channel.lost += 1

        return put

    def _slow(
        self, channel: _Channel, message: Any, stamp: float, microstep: int, wait: Callable[[], None] | None
    ) -> None:
        """The tap of a message that is not like the last one: its form first, then its bytes."""
        if isinstance(message, torch.Tensor):
            tensor = message.detach() if message.requires_grad else message
            if not tensor.is_cpu:
                tensor = cpu_tensor_copy(tensor)
            elif not tensor.is_contiguous():
                tensor = tensor.contiguous()
            form_key: object = (tensor.dtype, tensor.shape)
            payload = _encoding.encode_tensor(tensor)
        else:
            form_key = _encoding.structure_key(message)
            payload = b"".join(_encoding.message_parts(message, cpu_tensor_copy)[1])
        try:
            form = channel.forms.get(form_key)
            if form is None:
                form = self._form(channel, form_key, message, wait)
            if form is None or not self.feed.record(form, payload, stamp=stamp, aux=microstep, wait=wait):
                channel.lost += 1
                return
        except _GoneError:
            channel.lost += 1
            return
        if isinstance(message, torch.Tensor) and message.is_cpu and len(payload) <= self.feed.largest():
            head = _encoding.tensor_head(message.dtype, message.shape)
            channel.current = (
                message.dtype,
                message.shape,
                _feed.message_form(form, head, len(payload) - len(head)),
            )
        else:
            channel.current = None

    def _form(
        self, channel: _Channel, form_key: object, message: Any, wait: Callable[[], None] | None
    ) -> int | None:
        """Register the form ``form_key`` of ``channel`` (and its mcap channel, if new) in the
        feed; None where the feed had no room (real-time timer: the message is dropped)."""
        key = _encoding.TENSOR if isinstance(message, torch.Tensor) else form_key
        with self.register_lock:
            channel_id = channel.ids.get(key)
            if channel_id is None:
                channel_id = self._register(channel, key, message, wait)
                if channel_id is None:
                    return None
        form = next(self.next_form)
        if not self.feed.record(_feed.FORM, pickle.dumps((form, channel_id)), wait=wait):
            return None
        channel.forms[form_key] = form
        return form

    def _register(
        self, channel: _Channel, key: object, message: Any, wait: Callable[[], None] | None
    ) -> int | None:
        """Register a channel of ``channel`` for messages of structure ``key`` (lock held)."""
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
        channel_id = len(self.kept_channels) + 1
        record = (channel_id, f"/{channel.node}/{channel.attr}", plan.schema_name, plan.schema_data, metadata)
        if not self.feed.record(_feed.CHANNEL, pickle.dumps(record), wait=wait):
            return None
        channel.ids[key] = channel_id
        self.kept_channels.append((channel_id, channel, plan, metadata))
        return channel_id

    def _wait_room(self) -> None:
        """A virtual-timer tap's wait for room in the feed; _GoneError once the recorder process is."""
        if self.dead:
            raise _GoneError
        self.feed.kick()
        time.sleep(_ROOM_WAIT)

    def lost_count(self) -> int:
        """The messages dropped so far."""
        return sum(channel.lost for channel in self.channels)

    @property
    def messages(self) -> int:
        """The messages the recorder process has written (or kept) so far."""
        return self.final_messages if self.closed else self.feed.messages

    # -- the header -----------------------------------------------------------------------

    def start(self) -> None:
        """Append the header's metadata records, and wait until the recorder process took them."""
        self.header = self.header_of()
        # The outputs chosen, whether or not they send: a replay tells a port left out of the
        # recording from one that sent nothing (replay.mismatch).
        self.header["mujou"]["outputs"] = json.dumps([channel.name for channel in self.channels])
        for name, values in self.header.items():
            self._put(_feed.META, pickle.dumps((name, values)))
        # The recorder process has started and written the file's header before any hook runs:
        # one that cannot start fails the run's start, and the file is an MCAP file from then on.
        self.flush()

    def _put(self, kind: int, payload: bytes, aux: int = 0) -> None:
        """Append a record, waiting for room as long as the recorder process lives."""
        try:
            self.feed.record(kind, payload, aux=aux, wait=self._wait_room)
        except _GoneError:
            raise MujouInternalError("the recorder process failed") from self.failure

    # -- keyframes ------------------------------------------------------------------------

    @property
    def takes_keyframes(self) -> bool:
        """Whether the run stops at keyframe times (virtual timer, ``state_every``)."""
        return self.virtual and self.recorder._state_every is not None

    def next_keyframe(self) -> float:
        every = self.recorder._state_every
        return math.inf if every is None else self.start_time + self.keyframe_n * every

    def take_keyframe(self, tree: dict[str, Any], at: float) -> None:
        """Append the keyframe of ``tree``, the state at timer time ``at``."""
        self.keyframe_n += 1
        self._put(_feed.ATTACH, dumps(tree), aux=round(at * 1e9))

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

    def _wait_process(self, until: Callable[[], bool]) -> None:
        """Wait until ``until()``; MujouInternalError if the recorder process ended or makes no
        progress for _STUCK seconds."""
        last = (time.monotonic(), self.feed.taken)
        self.feed.kick()
        while not until():
            if self.dead:
                raise MujouInternalError("the recorder process failed") from self.failure
            time.sleep(0.001)
            now, taken = time.monotonic(), self.feed.taken
            if taken != last[1]:
                last = (now, taken)
            elif now - last[0] > _STUCK:
                raise MujouInternalError(f"the recorder process made no progress for {_STUCK} s")

    def flush(self) -> None:
        """Wait until the recorder process has taken every record appended before this call."""
        mark = self.feed.written
        self._wait_process(lambda: self.feed.taken >= mark)

    def close(self) -> None:
        """The run has ended: stop watching, write what is queued, and the file's end."""
        if self.closed:
            return
        for undo in reversed(self.unwatch):
            undo()
        if self.keyframe_thread is not None:
            self.keyframe_stop.set()
            self.keyframe_thread.join(_STUCK)
        with self.copy_lock:  # no hook sends any more: wait for room rather than drop
            self._copy_locked(len(self.deferred), self._wait_room)
        self.closing = True
        dump = None
        with contextlib.ExitStack() as stack:
            if self.window is not None:
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="mujou-record-"))
                dump = os.path.join(folder, "kept.pickle")
            try:
                self._put(_feed.END, pickle.dumps((self._end_record(), dump)))
                self._wait_process(lambda: self.process.poll() is not None)
                self.monitor.join(_STUCK)
                self.final_messages = self.feed.messages
                if dump is not None:
                    self.kept = _load_kept(dump)
            finally:
                self.closed = True
                self._release()
        if self.failure is not None and not self.reported:
            raise MujouInternalError("the recorder process failed") from self.failure

    def _release(self) -> None:
        """Let the recorder process go (killed if it still runs) and unmap the feed."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(_STUCK)
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.monitor.join(_STUCK)
        self.feed.close()

    def discard(self) -> None:
        """The run did not start: stop the recorder process, remove the file begun."""
        for undo in reversed(self.unwatch):
            undo()
        self.closed = self.closing = True
        self.recorder._session = None  # the run did not start: the recorder may record another
        self._release()
        if self.recorder._path is not None and self.window is None:
            self.recorder._path.unlink(missing_ok=True)

    def _end_record(self) -> dict[str, str]:
        end = self.engine.end_time if self.engine.ended else self.engine.time()
        return {"lost": str(self.lost_count()), "end_time_ns": str(round(end * 1e9))}

    def write_snapshot(self, target: Path) -> None:
        """Write what a snapshot recorder keeps to ``target``, whole."""
        if self.closed:
            assert self.kept is not None
            messages, keyframes = self.kept
        else:
            with tempfile.TemporaryDirectory(prefix="mujou-record-") as folder:
                dump = os.path.join(folder, "kept.pickle")
                with self.copy_lock:
                    self._copy_locked(len(self.deferred), None)
                self._put(_feed.DUMP, pickle.dumps(dump))
                self.flush()
                messages, keyframes = _load_kept(dump)
        with self.register_lock:
            channels = list(self.kept_channels)
        end = {"lost": str(self.lost_count()), "messages": str(len(messages))}
        end["end_time_ns"] = self._end_record()["end_time_ns"]
        with written(target, f"cannot write the recording {str(target)!r}") as stream:
            writer = _mcapwrite.new_writer(
                stream, self.recorder._chunk_size, self.recorder._compression, _library()
            )
            for name, values in self.header.items():
                writer.add_metadata(name, values)
            ids: dict[int, int] = {}
            schemas: dict[object, int] = {}
            for n, (channel_id, channel, plan, metadata) in enumerate(channels, 1):
                ids[channel_id] = n
                schema_key = (plan.schema_name, plan.schema_data)
                schema_id = schemas.get(schema_key)
                if schema_id is None:
                    schema_id = schemas[schema_key] = writer.register_schema(
                        plan.schema_name, "protobuf", plan.schema_data
                    )
                writer.register_channel(f"/{channel.node}/{channel.attr}", "protobuf", schema_id, metadata)
            for time_ns, data in keyframes:
                writer.add_attachment(
                    time.time_ns(), time_ns, f"state/{time_ns}", _sink.STATE_MEDIA_TYPE, data
                )
            for channel_id, time_ns, microstep, data in messages:
                writer.add_message(ids[channel_id], time_ns, data, time_ns, microstep)
            writer.add_metadata("mujou.end", end)
            writer.finish()


def _load_kept(path: str) -> tuple[list[_sink.Message], list[_sink.Keyframe]]:
    """What a snapshot recorder's process dumped (``_sink.Sink._dump``)."""
    with open(path, "rb") as stream:
        kept: tuple[list[_sink.Message], list[_sink.Keyframe]] = pickle.load(stream)
    return kept


def _library() -> str:
    from .._version import __version__

    return f"mujou {__version__}"


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


def _open(path: Path) -> int:
    """The recording's file, created (or emptied): a descriptor for the recorder process."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise reworded(exc, f"cannot write the recording {str(path)!r}") from exc


def _channels(recorder: Recorder, nodes: Sequence[Node]) -> list[_Channel]:
    """The recorded ports, checked: ValueError naming a port that is neither an output of the
    net nor an input without a source (which the host writes: :ref:`record.writes`)."""
    from .._ports import Input, Output

    outputs: dict[str, _Port] = {}
    for node in nodes:
        for port in node._mujou.ports.values():
            if isinstance(port, Output) or (isinstance(port, Input) and port.source is None):
                outputs[port.name] = port
    if recorder._outputs is None:
        chosen = list(outputs.values())
    else:
        chosen = []
        for item in recorder._outputs:
            name = item.name if isinstance(item, Output | Input) and item._node is not None else item
            if not isinstance(name, str):
                raise TypeError(
                    "outputs must hold Output ports or port names ('node.port'), "
                    f"got {type(item).__name__}: {shown(item)}"
                )
            found = outputs.get(name)
            if found is None or (isinstance(item, Output | Input) and item is not found):
                raise ValueError(
                    f"outputs: {name!r} is not an output of this net, nor an input without a "
                    f"source; those are {', '.join(map(repr, outputs)) or 'none'}"
                )
            if found not in chosen:
                chosen.append(found)
    channels = []
    for port in chosen:
        owner = port.node
        period = owner.period
        channels.append(
            _Channel(
                port=port,
                name=port.name,
                node=owner.name,
                attr=port._attr,
                metadata={
                    "node": owner.name,
                    "port": port._attr,
                    "dtype": "",
                    "shape": "",
                    "period": "" if period is None else repr(period),
                    "device": str(owner.device),
                    "kind": "",
                    "layout": "",
                    "direction": "output" if isinstance(port, Output) else "input",
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
            "torch": str(torch.__version__),  # a TorchVersion would pickle as one
            "python": platform.python_version(),
            "timer": "virtual" if engine.virtual else "real",
            "seed": json.dumps(seeds),
            "run_seed": str(seed),
            "workers": str(workers),
            "state_every": "" if recorder._state_every is None else repr(recorder._state_every),
        },
        "mujou.net": {"structure": json.dumps(structure)},
    }
