"""``mujou.Recording``: a recording file opened for reading.

See :ref:`record.read-open` and the rules after it. What the file holds is found by
``_mcapfile.py``, from the MCAP summary; this module turns it into ports, times, keyframes and
messages, and checks that the file is a Mujou recording.
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import os
import threading
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, final

from .._errors import RecordingVersionWarning, TruncatedRecordingWarning
from .._files import file_path

if TYPE_CHECKING:
    from .._net import Net
    from .._node import Node
    from ._mcapfile import Chunk, Contents

STATE_PREFIX = "state/"
STATE_MEDIA_TYPE = "application/x-mujou-state"
INSTALL = "pip install 'mujou[record]'"
_NS = 1_000_000_000


def require_mcap() -> None:
    """Import ``mcap``, or say how to install it.

    Raises:
        ImportError: ``mcap`` is not installed; the message gives the command that installs it.
    """
    try:
        import mcap  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"reading a recording needs the mcap package: {INSTALL}") from exc


class RecordedMessage(NamedTuple):
    """A message of a recording: its port, its tag (time and microstep) and its value.

    See :ref:`record.read-messages`.

    Attributes:
        port: The port that sent it, ``"node.port"``.
        time: The timer time it was sent at, in seconds.
        microstep: Its microstep under the virtual timer (0 under the real-time timer).
        value: The message: a tensor, or a nest of tensors, as the port sent it.
    """

    port: str
    time: float
    microstep: int
    value: Any


@dataclass(frozen=True)
class RecordedPort:
    """A port a recording holds, with what its channel says of it. See :ref:`record.read-ports`.

    Attributes:
        name: ``"node.port"``: the node's name in the net, a dot, the port's name.
        node: The node's name in the net.
        port: The port's name on its node.
        kind: ``"tensor"`` (each message a tensor) or ``"structured"`` (a nest of tensors).
        dtype: The dtype of its tensors as recorded (``"float32"``), or ``""`` when it varies.
        shape: The shape of its tensors, or ``None`` when it varies.
        period: The node's period in seconds, or ``None`` for a node that is only triggered.
        device: The device the node ran on (``"cpu"``, ``"cuda:0"``).
        messages: How many messages of the port the file holds.
        topic: The MCAP topic of its channel, ``"/node/port"``.
        direction: ``"output"``, or ``"input"`` for an input without a source whose messages
            the host wrote (:ref:`record.writes`).
    """

    name: str
    node: str
    port: str
    kind: str
    dtype: str
    shape: tuple[int, ...] | None
    period: float | None
    device: str
    messages: int
    topic: str
    direction: str = "output"


@final
class Recording:
    """A recording file opened for reading: its ports, times, keyframes and messages.

    ``Recording(path)`` reads the file's summary (an index MCAP files end with): no message is
    read until :meth:`messages` asks for it, and a time is found through the chunk index. Use
    it as a context manager, or call :meth:`close`. See :ref:`record.read-open`.

    A file that a killed run left (no summary, its last chunk cut) opens with a
    :class:`TruncatedRecordingWarning`, and :attr:`cut` says what was lost
    (:ref:`record.read-cut`); a file another Mujou version wrote opens with a
    :class:`RecordingVersionWarning` (:ref:`record.read-version`).

    Raises:
        ImportError: ``mcap`` is not installed (``pip install mujou[record]``).
        OSError: the file cannot be opened.
        ValueError: the file is not a Mujou recording; the message says why.
        TypeError: ``path`` is not a file path.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        require_mcap()
        from ._mcapfile import NotMcapError, read_contents

        self._path = file_path("path", path)
        self._name = os.fspath(path)
        self._lock = threading.Lock()  # one seek and read at a time on the shared file
        self._file: BufferedReader | None = None
        file = open(self._path, "rb")  # noqa: SIM115 (closed by close(), or below)
        try:
            size = os.fstat(file.fileno()).st_size
            try:
                contents = read_contents(file, size)
            except NotMcapError as exc:
                raise ValueError(f"{self._name!r} is not a Mujou recording: {exc}") from None
            self._contents = contents
            self._check(contents)
        except BaseException:
            file.close()
            raise
        self._file = file
        self._size = size
        self._ports = self._read_ports(contents)
        self._layouts = {
            channel_id: json.loads(channel.metadata.get("layout") or '"tensor"')
            for channel_id, channel in contents.channels.items()
        }
        self._keyframes = sorted(
            (attachment.log_time, index)
            for index, attachment in enumerate(contents.attachments)
            if attachment.media_type == STATE_MEDIA_TYPE and attachment.name.startswith(STATE_PREFIX)
        )
        self._warn()

    def _check(self, contents: Contents) -> None:
        """Refuse a file that is not a Mujou recording, naming what it lacks."""
        not_one = f"{self._name!r} is not a Mujou recording"
        if "mujou" not in contents.metadata:
            if contents.cut is not None and not contents.metadata:
                raise ValueError(
                    f"{not_one}, or was cut before its first record: it has no 'mujou' metadata "
                    f"record ({contents.cut})"
                )
            raise ValueError(f"{not_one}: it is an MCAP file, but has no 'mujou' metadata record")
        if contents.unindexed:
            raise ValueError(
                f"{not_one}: {contents.unindexed} of its messages lie outside chunks "
                "(a Mujou recording is chunked)"
            )
        for channel in contents.channels.values():
            keys = ("node", "port", "kind")
            missing = [key for key in keys if key not in channel.metadata]
            if missing or channel.encoding != "protobuf":
                raise ValueError(
                    f"{not_one}: its channel {channel.topic!r} is not a recorded port "
                    f"(message encoding {channel.encoding!r}, metadata {sorted(channel.metadata)}; "
                    "a recorded port's channel has encoding 'protobuf' and metadata 'node', 'port', "
                    "'kind', ...)"
                )

    def _read_ports(self, contents: Contents) -> dict[str, RecordedPort]:
        """The ports, each from its channels: one, or one per structure its messages had."""
        channels: dict[str, list[int]] = {}
        for channel_id, channel in sorted(contents.channels.items()):
            channels.setdefault(f"{channel.metadata['node']}.{channel.metadata['port']}", []).append(
                channel_id
            )
        self._channels_of = {name: frozenset(ids) for name, ids in channels.items()}
        self._by_channel = {channel_id: name for name, ids in channels.items() for channel_id in ids}
        ports = {}
        for name, ids in channels.items():
            metas = [contents.channels[channel_id].metadata for channel_id in ids]
            first, topic = metas[0], contents.channels[ids[0]].topic
            shapes = {meta.get("shape", "") for meta in metas}
            ports[name] = RecordedPort(
                name=name,
                node=first["node"],
                port=first["port"],
                kind=_common(meta["kind"] for meta in metas) or "mixed",
                dtype=_common(meta.get("dtype", "") for meta in metas),
                shape=_shape(shapes.pop(), topic) if len(shapes) == 1 else None,
                period=_period(first.get("period", ""), topic),
                device=first.get("device", ""),
                messages=sum(contents.counts.get(channel_id, 0) for channel_id in ids),
                topic=topic,
                direction=first.get("direction", "output"),
            )
        return ports

    def _warn(self) -> None:
        if self.cut is not None:
            warnings.warn(
                f"the recording {self._name!r} was cut (its run did not close it, or its end is lost): "
                f"it is read up to its last whole chunk; {self.cut}",
                TruncatedRecordingWarning,
                stacklevel=3,
            )
        from .._version import __version__

        version = self.metadata.get("version", "")
        if version != __version__:
            warnings.warn(
                f"the recording {self._name!r} was written by Mujou {version or '(unknown version)'}, "
                f"and is read by Mujou {__version__}: it is read with this version's layout",
                RecordingVersionWarning,
                stacklevel=3,
            )

    # --- What the summary says -----------------------------------------------------------

    @property
    def path(self) -> Path:
        """The file's path."""
        return self._path

    @property
    def ports(self) -> dict[str, RecordedPort]:
        """The recorded ports by name (``"node.port"``), in the order of their channels."""
        return dict(self._ports)

    @property
    def metadata(self) -> dict[str, str]:
        """The ``mujou`` metadata record: ``version``, ``torch``, ``python``, ``timer``, ``seed``, ...."""
        return dict(self._contents.metadata["mujou"])

    @property
    def net(self) -> dict[str, Any]:
        """The net's structure as recorded (the ``mujou.net`` metadata record's JSON), or ``{}``."""
        text = self._contents.metadata.get("mujou.net", {}).get("structure", "")
        structure = json.loads(text) if text else {}
        return structure if isinstance(structure, dict) else {"structure": structure}

    @property
    def cut(self) -> str | None:
        """``None`` for a whole file; for a file the run did not close, or whose end cannot be
        read, what was lost.

        See :ref:`record.read-cut`.
        """
        notes = [] if "mujou.end" in self._contents.metadata else ["it has no 'mujou.end' record"]
        if self._contents.cut is not None:
            notes.append(self._contents.cut)
        if not notes:
            return None
        note = ", and ".join(notes)
        last = max((chunk.end_ns for chunk in self._contents.chunks), default=None)
        if last is not None:
            note += f"; the last message kept is at t={last / _NS:.9g}"
        return note

    @property
    def lost(self) -> int | None:
        """The messages the recorder dropped (under the real-time timer), or ``None`` when cut."""
        end = self._contents.metadata.get("mujou.end")
        return None if end is None else int(end.get("lost", "0"))

    @property
    def message_count(self) -> int:
        """How many messages the file holds; of a cut file, those in its whole chunks."""
        return sum(port.messages for port in self._ports.values())

    @property
    def start(self) -> float:
        """The timer time of the first message or keyframe, in seconds (0.0 for an empty file)."""
        times = [chunk.start_ns for chunk in self._contents.chunks]
        times += [time for time, _ in self._keyframes[:1]]
        return min(times, default=0) / _NS

    @property
    def end(self) -> float:
        """The run's end time written at close, in seconds; for a cut file, the last message or
        keyframe kept."""
        times = [chunk.end_ns for chunk in self._contents.chunks]
        times += [time for time, _ in self._keyframes[-1:]]
        end = self._contents.metadata.get("mujou.end", {}).get("end_time_ns")
        if end is not None:
            times.append(int(end))
        return max(times, default=0) / _NS

    @property
    def keyframes(self) -> tuple[float, ...]:
        """The times of the state keyframes, in seconds, in order. See :ref:`record.read-state`."""
        return tuple(time / _NS for time, _ in self._keyframes)

    # --- Reading ---------------------------------------------------------------------------

    def state_at(self, time: float) -> dict[str, Any]:
        """The state tree of the last keyframe at or before ``time``, as :func:`mujou.load` reads it.

        See :ref:`record.read-state`.

        Raises:
            ValueError: the recording has no keyframe at or before ``time``.
            StateFileError: the keyframe's bytes are damaged.
        """
        target = _time_ns("time", time)
        file = self._open_file()
        found = bisect.bisect_right(self._keyframes, (target, len(self._contents.attachments)))
        if found == 0:
            if not self._keyframes:
                raise ValueError(
                    f"the recording {self._name!r} has no keyframes (a run records them with state_every=)"
                )
            raise ValueError(
                f"the recording {self._name!r} has no keyframe at or before t={time!r}: "
                f"its first is at t={self._keyframes[0][0] / _NS:.9g}"
            )
        from .. import _state
        from ._mcapfile import read_attachment_data

        attachment = self._contents.attachments[self._keyframes[found - 1][1]]
        with self._lock:
            data = read_attachment_data(file, attachment)
        return _state.loads(data, f"{self._name} (keyframe {attachment.name!r})")

    def messages(
        self,
        ports: str | Iterable[str] | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> Iterator[RecordedMessage]:
        """The messages of ``ports`` (default: all) with ``start <= time <= end``, in tag order.

        Tag order is by time, then microstep, then the order they were written in. Only the
        chunks that hold such messages are read; each tensor is a view of the buffer its chunk
        was read into (no second copy). See :ref:`record.read-messages`.

        Raises:
            ValueError: a port is not in the recording, or ``start`` is after ``end``.
            TypeError: ``ports`` is not a port name or names, or a time is not a number.
        """
        wanted = self._wanted(ports)
        low = None if start is None else _time_ns("start", start)
        high = None if end is None else _time_ns("end", end)
        if low is not None and high is not None and low > high:
            raise ValueError(f"start must not be after end, got start={start!r}, end={end!r}")
        self._open_file()
        return self._iterate(wanted, low, high)

    def _wanted(self, ports: str | Iterable[str] | None) -> frozenset[int] | None:
        if ports is None:
            return None
        names = [ports] if isinstance(ports, str) else list(ports)
        unknown = []
        for name in names:
            if not isinstance(name, str):
                raise TypeError(
                    f"ports must be port names ('node.port'), got {type(name).__name__}: {name!r}"
                )
            if name not in self._channels_of:
                unknown.append(name)
        if unknown:
            raise ValueError(
                f"the recording {self._name!r} has no port {', '.join(map(repr, unknown))}; "
                f"it holds {', '.join(map(repr, self._channels_of)) or 'no ports'}"
            )
        return frozenset().union(*(self._channels_of[name] for name in names))

    def _iterate(
        self, wanted: frozenset[int] | None, low: int | None, high: int | None
    ) -> Iterator[RecordedMessage]:
        """Merge the chunks' messages in tag order, opening a chunk only when its turn may come."""
        chunks = sorted(
            (
                chunk
                for chunk in self._contents.chunks
                if (low is None or chunk.end_ns >= low)
                and (high is None or chunk.start_ns <= high)
                and (wanted is None or chunk.channels is None or not wanted.isdisjoint(chunk.channels))
            ),
            key=lambda chunk: (chunk.start_ns, chunk.offset),
        )
        heap: list[tuple[int, int, int, int, list[tuple[int, int, int, int, Any]]]] = []
        following = 0
        while heap or following < len(chunks):
            while following < len(chunks) and (not heap or chunks[following].start_ns <= heap[0][0]):
                found = self._read_chunk(chunks[following], wanted, low, high)
                if found:
                    heapq.heappush(heap, (*found[0][:4], found))
                following += 1
            if not heap:
                continue
            time, microstep, _, position, found = heapq.heappop(heap)
            channel, payload = found[position][4]
            if position + 1 < len(found):
                heapq.heappush(heap, (*found[position + 1][:4], found))
            yield RecordedMessage(
                self._by_channel[channel], time / _NS, microstep, self._decode(channel, payload)
            )

    def _read_chunk(
        self, chunk: Chunk, wanted: frozenset[int] | None, low: int | None, high: int | None
    ) -> list[tuple[int, int, int, int, Any]]:
        """A chunk's messages in range, in tag order.

        Each is ``(time, microstep, chunk offset, position in the list, (channel, payload))``.
        """
        from ._mcapfile import MESSAGE_DATA, message_fields, read_records

        file = self._open_file()
        found = []
        with self._lock:
            records = list(read_records(file, chunk))
        for index, (opcode, body, begin, stop) in enumerate(records):
            if opcode != 5:  # a message (schemas and channels in a chunk are in the summary too)
                continue
            channel, microstep, time = message_fields(body, begin)
            if (wanted is not None and channel not in wanted) or (low is not None and time < low):
                continue
            if high is not None and time > high:
                continue
            found.append((time, microstep, chunk.offset, index, (channel, body[begin + MESSAGE_DATA : stop])))
        found.sort(key=lambda entry: entry[:4])
        for position, entry in enumerate(found):
            found[position] = (*entry[:3], position, entry[4])
        return found

    def _decode(self, channel_id: int, payload: memoryview) -> Any:
        from ._encoding import decode_message, decode_tensor

        layout = self._layouts[channel_id]
        return decode_tensor(payload) if layout == "tensor" else decode_message(payload, layout)

    # --- Checks against a net --------------------------------------------------------------

    def check_net(self, net: Net, nodes: Iterable[Node] | None = None) -> None:
        """Check that the recording holds every output port of ``nodes`` (default: every node of
        ``net``) as those ports are declared: same node, port, kind, dtype, shape and period.

        Replay calls it before a run (:ref:`record.read-check-net`).

        Raises:
            ValueError: names each port that does not match, and how.
            TypeError: ``net`` is not a Net, or ``nodes`` holds something that is not a node of it.
        """
        from ._check import mismatches

        problems = mismatches(self, net, nodes)
        if problems:
            shown = "; ".join(problems)
            raise ValueError(f"the recording {self._name!r} does not match the net: {shown}")

    # --- Lifetime ----------------------------------------------------------------------------

    def _open_file(self) -> BufferedReader:
        if self._file is None:
            raise ValueError(f"the recording {self._name!r} is closed")
        return self._file

    def close(self) -> None:
        """Close the file. Tensors read from it stay valid; reading more raises ``ValueError``."""
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()

    def __enter__(self) -> Recording:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"{len(self._ports)} ports"
        return f"<mujou.Recording {self._name!r}: {state}, t={self.start:.9g}..{self.end:.9g}>"


def _time_ns(name: str, value: object) -> int:
    """A time argument in timer seconds as nanoseconds (the recorder's ``round(t * 1e9)``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a time in seconds (a number), got {type(value).__name__}: {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite time in seconds, got {value!r}")
    return round(value * 1e9)


def _common(values: Iterable[str]) -> str:
    """The value all channels of a port share, or ""."""
    found = set(values)
    return found.pop() if len(found) == 1 else ""


def _shape(text: str, topic: str) -> tuple[int, ...] | None:
    if text == "":
        return None
    shape = json.loads(text)
    if not isinstance(shape, list) or not all(isinstance(size, int) for size in shape):
        raise ValueError(f"the channel {topic!r} has a shape that is not a list of sizes: {text!r}")
    return tuple(shape)


def _period(text: str, topic: str) -> float | None:
    if text in ("", "None"):
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"the channel {topic!r} has a period that is not a number: {text!r}") from None
