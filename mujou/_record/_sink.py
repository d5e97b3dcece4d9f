"""The recorder process: takes the run's records from the feed and writes the MCAP file.

Started by the recorder of a run (``_recorder.Session``) with :data:`LAUNCH`, which imports this
module and ``_feed`` without Mujou's package (so without torch: the process starts in the time
it takes to start Python). It reads its :class:`Config` from its standard input, then the
feed, until an ``END`` record: then it writes ``mujou.end`` and the file's summary, and exits 0.
Any error ends it with its traceback on its standard error and exit code 1, which the run's
process reports. Its standard input reaches its end when the run's process is gone (killed):
it then writes the summary of what it took, without ``mujou.end`` (the file says it was cut).

A snapshot recorder's process writes no file as it goes: it keeps the messages and keyframes of
the last ``window_ns`` of timer time, and writes them (pickled) to the path of a ``DUMP`` record,
or of the ``END`` record, for the run's process to write the snapshot file from.

The recorder process does what the recording costs but the copy of the bytes into the feed:
the MCAP writer (``_mcapwrite``; the run's process puts each message in the feed encoded, as
its bytes go in), about a µs of Python per message, on another interpreter, so that the hooks
never wait for the GIL it holds (NOTE [ the writer and the GIL ] in ``_recorder``). Under the
real-time timer it runs at a lower priority (``nice``) than the run, so that on a busy machine
the run's threads get the CPU first; the feed holds what it has not yet taken meanwhile.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import select
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from . import _feed, _mcapwrite

STATE_MEDIA_TYPE = "application/x-mujou-state"
_IDLE_FIRST = 0.0002  # real seconds of the first sleep on an empty feed; it doubles up to _IDLE_MOST
_IDLE_MOST = 0.005
# Real-time timer: the real seconds the process sleeps at most on an empty feed without a kick
# from the run's process (NOTE [ waking the recorder ] in _feed); Config.wake_most.
WAKE_MOST = 0.25
_NICE = 10  # the process's niceness under the real-time timer

LAUNCH = """
import sys, types
sys.path[:0] = {paths!r}
for name, path in (("mujou", {root!r}), ("mujou._record", {here!r})):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from mujou._record import _sink
_sink.main()
"""
"""The recorder process's ``python -c`` program: ``mujou`` and ``mujou._record`` as bare packages
(their ``__init__`` would import torch), then :func:`main`. Formatted by :func:`launch_code`."""


def launch_code() -> str:
    """:data:`LAUNCH` for this Mujou and this ``sys.path``."""
    here = os.path.dirname(os.path.abspath(__file__))
    return LAUNCH.format(paths=[p for p in sys.path if p], root=os.path.dirname(here), here=here)


@dataclass(frozen=True)
class Config:
    """What the recorder process is told first (pickled on its standard input)."""

    feed_fd: int
    feed_size: int
    wake_fd: int | None  # the pipe's read end on which it sleeps (NOTE [ waking the recorder ])
    wake_most: float  # real-time timer: real seconds it sleeps at most without a kick
    file_fd: int | None  # the recording, opened by the run's process; None: a snapshot recorder
    chunk_size: int
    compression: str | None
    library: str
    window_ns: int | None  # a snapshot recorder's window
    real_time: bool


class Unbuffered:
    """A file written without a buffer: the writer writes each chunk whole, so a run that is
    killed leaves every chunk written before it in the file (a buffer would keep the last ones
    back). Only what the writer calls: write, tell, close."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._position = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        os.close(self._fd)


Message = tuple[int, int, int, bytes]  # channel id, time in ns, microstep, the encoded message
Keyframe = tuple[int, bytes]  # time in ns, mujou.save's bytes


def trim(keyframes: list[Keyframe], messages: collections.deque[Message]) -> None:
    """Keep the keyframes of the messages' window, from the last one at or before its first
    message (where a replay of the window starts)."""
    if not messages:
        return
    oldest = messages[0][1]
    while len(keyframes) > 1 and keyframes[1][0] <= oldest:
        del keyframes[0]


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain values only (str, bytes, numbers, tuples, lists, dicts): a record that
    names a class would import its module here (a ``torch.TorchVersion`` imported torch, two
    seconds of CPU at each recording's start, while the run waited for the header)."""

    def find_class(self, module: str, name: str) -> Any:
        raise ValueError(
            f"a feed record holds a {module}.{name}: only plain values (str, bytes, numbers, "
            "tuples, lists, dicts) go to the recorder process"
        )


def plain_loads(payload: bytes | memoryview) -> Any:
    """The plain values a record of the feed was pickled from (:class:`_PlainUnpickler`)."""
    return _PlainUnpickler(io.BytesIO(payload)).load()


class Sink:
    """What the records are written to: the MCAP file, or a snapshot recorder's memory."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.forms: dict[int, int] = {}  # form -> channel id
        self.messages = 0
        self.kept: collections.deque[Message] = collections.deque()
        self.keyframes: list[Keyframe] = []
        self.stream: Unbuffered | None = None
        self.writer: Any = None
        self.schemas: dict[tuple[str, bytes], int] = {}
        if config.file_fd is not None:
            self.stream = Unbuffered(config.file_fd)
            self.writer = _mcapwrite.new_writer(
                self.stream, config.chunk_size, config.compression, config.library
            )

    def take(self, kind: int, stamp: float, aux: int, payload: memoryview) -> bool:
        """Write (or keep) one record; True at the END record (the file is complete)."""
        if kind >= _feed.FIRST_FORM:
            channel_id = self.forms[kind]
            time_ns = round(stamp * 1e9)
            self.messages += 1
            if self.writer is not None:
                self.writer.add_message(channel_id, time_ns, payload, time_ns, aux)  # copied there
            else:
                self._keep((channel_id, time_ns, aux, bytes(payload)))
        elif kind == _feed.FORM:
            form, channel_id = plain_loads(payload)
            self.forms[form] = channel_id
        elif kind == _feed.ATTACH:
            if self.writer is not None:
                self.writer.add_attachment(
                    create_time=time.time_ns(),
                    log_time=aux,
                    name=f"state/{aux}",
                    media_type=STATE_MEDIA_TYPE,
                    data=bytes(payload),
                )
            else:
                self.keyframes.append((aux, bytes(payload)))
                trim(self.keyframes, self.kept)
        elif kind == _feed.CHANNEL:
            self._channel(*plain_loads(payload))
        elif kind == _feed.META:
            if self.writer is not None:
                self.writer.add_metadata(*plain_loads(payload))
        elif kind == _feed.DUMP:
            self._dump(plain_loads(payload))
        elif kind == _feed.END:
            end, path = plain_loads(payload)
            self._end(end, path)
            return True
        else:
            raise ValueError(f"a feed record of unknown kind {kind}")
        return False

    def _channel(
        self, channel_id: int, topic: str, schema_name: str, schema_data: bytes, metadata: dict[str, str]
    ) -> None:
        if self.writer is None:
            return
        schema_id = self.schemas.get((schema_name, schema_data))
        if schema_id is None:
            schema_id = self.writer.register_schema(schema_name, "protobuf", schema_data)
            self.schemas[(schema_name, schema_data)] = schema_id
        got = self.writer.register_channel(topic, "protobuf", schema_id, metadata)
        if got != channel_id:
            raise RuntimeError(f"the recorder's channel {channel_id} became {got} in the file")

    def _keep(self, message: Message) -> None:
        kept = self.kept
        kept.append(message)
        assert self.config.window_ns is not None
        oldest = message[1] - self.config.window_ns
        while kept[0][1] < oldest:
            kept.popleft()

    def _dump(self, path: str) -> None:
        trim(self.keyframes, self.kept)
        with open(path, "wb") as stream:
            pickle.dump((list(self.kept), list(self.keyframes)), stream)

    def _end(self, end: dict[str, str], path: str | None) -> None:
        if path is not None:
            self._dump(path)
        if self.writer is not None:
            record = {"lost": end["lost"], "messages": str(self.messages), "end_time_ns": end["end_time_ns"]}
            self.writer.add_metadata("mujou.end", record)
            self.writer.finish()
        if self.stream is not None:
            self.stream.close()

    def cut(self) -> None:
        """The run's process is gone: end the file without ``mujou.end`` (it was cut)."""
        if self.writer is not None:
            self.writer.finish()
        if self.stream is not None:
            self.stream.close()


def _yield_to_the_run() -> None:
    """Run after the run's threads when both want the CPU: the normal policy if the run's
    process had a real-time one (``chrt``), which a child inherits, and ``nice`` 10."""
    if hasattr(os, "sched_setscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    if hasattr(os, "nice"):
        os.nice(_NICE)


def serve(config: Config, gone: threading.Event) -> None:
    """Take the feed's records until its END record (or until ``gone``: the run's process is)."""
    if config.real_time:
        _yield_to_the_run()
    reader = _feed.FeedReader(config.feed_fd, config.feed_size)
    wake = config.wake_fd
    if wake is not None:
        os.set_blocking(wake, False)
    sink = Sink(config)
    forms, first_form = sink.forms, _feed.FIRST_FORM
    add = None if sink.writer is None else sink.writer.add_message
    idle = _IDLE_FIRST
    while True:
        took = False
        for kind, stamp, aux, payload in reader.records():
            took = True
            if kind >= first_form and add is not None:  # the most of them: Sink.take's first case
                time_ns = round(stamp * 1e9)
                add(forms[kind], time_ns, payload, time_ns, aux)  # the writer copies the payload
                sink.messages += 1
            elif sink.take(kind, stamp, aux, payload):
                reader.count(sink.messages)
                return
        if took:
            reader.count(sink.messages)
            idle = _IDLE_FIRST
            continue
        if gone.is_set():
            if not reader.ready():
                sink.cut()
                return
            continue
        if config.real_time:
            _sleep(reader, wake, config.wake_most, gone)  # until a thread of the run is about to wait
        else:
            _sleep(reader, wake, idle, gone)
            idle = min(2 * idle, _IDLE_MOST)


def _sleep(reader: _feed.FeedReader, wake: int | None, most: float, gone: threading.Event) -> None:
    """Wait until the run's process kicks (``FeedWriter.kick``), its end closes our standard
    input (then ``gone`` is set), or ``most`` seconds passed. The kicks that came are read:
    records appended before a kick are ready once this returns. Without a pipe (``wake``
    None: the standard input is watched by a thread), sleep ``most`` seconds."""
    if wake is None:  # pragma: no cover (no Windows in CI)
        time.sleep(most)
        return
    if reader.ready():
        return
    readable = select.select([wake, 0], [], [], most)[0]
    if wake in readable:
        with contextlib.suppress(BlockingIOError):  # read by a wake-up that came before
            os.read(wake, 4096)
    if 0 in readable and not os.read(0, 4096):  # the end of the input: the run's process is gone
        gone.set()


def main() -> None:
    """The recorder process: its Config from standard input, then :func:`serve`."""
    try:
        config = pickle.load(sys.stdin.buffer)
        gone = threading.Event()

        def watch_stdin() -> None:
            while os.read(0, 4096):  # empty at the end: the run's process closed it, or is gone
                pass
            gone.set()

        if config.wake_fd is None:  # pragma: no cover (no Windows in CI); else _sleep watches it
            threading.Thread(target=watch_stdin, name="mujou-record-stdin", daemon=True).start()
        serve(config, gone)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # not through the interpreter's end, which waits for the stdin thread's read
