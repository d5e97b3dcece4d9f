"""Files written whole: a temporary file beside the target, renamed over it when complete.

``mujou.save`` and the trace of a run (``trace=``) write this way, so their target is the old
file or the new one, never a part (see :ref:`state.save-load` and :ref:`observe.trace`).

NOTE [ temporary files ]: the temporary file of target ``DIR/NAME`` is
``DIR/.NAME.HOST-PID-RUN-RANDOM.tmp``: HOST tags this machine (a hash of its host name), PID is
the writing process, RUN a random tag of that process (a later process that gets the same PID
has another), RANDOM tells apart the files of one process. Where the OS has ``flock`` (POSIX),
the writer also holds an exclusive lock on the file until it is renamed or removed; the kernel
drops it when the writer dies, however it dies.

A writer that is killed leaves its temporary file; the next writer of the same target removes
it once it can tell that the writer is gone: a file of this host whose PID no process has (or
whose PID is this process's under another RUN tag: an earlier process that had this PID, as a
restarted container's process often does), and whose lock it can take. The PID alone would not
do: a process of another PID namespace on this host (another container) has PIDs that mean
nothing here, but its lock holds. Files of a live writer (another process, or another thread of
this one) are never removed, nor those of other hosts (on a shared file system), whose
processes cannot be seen from here, nor any file that does not follow this naming. A file's age
tells nothing: a large save on a slow disk writes for minutes, and a trace's temporary file may
go hours without a write while its run is alive. See :ref:`state.save-temporary`.

New files get the mode ``open(path, "w")`` gives them: ``0o666`` less the umask, or the mode of
the file they replace (see :ref:`state.file-mode`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import re
import secrets
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from ._numbers import shown

if sys.platform != "win32":  # Windows has no flock, but an open file cannot be removed there
    import fcntl

_RUN = secrets.token_hex(4)  # this process's tag (NOTE [ temporary files ])
_TAIL = re.compile(r"([0-9a-f]{8})-([0-9]{1,10})-([0-9a-f]{8})-[0-9a-f]{8}\.tmp")  # after ".NAME."
_NEW_FILE_MODE = 0o666  # what open(path, "w") asks for; the umask takes its bits off


def _host_tag() -> str:
    """8 hex digits naming this host: where a PID may name a process."""
    name = ""
    with contextlib.suppress(OSError):
        name = socket.gethostname()
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]


_HOST = _host_tag()


def file_path(name: str, value: object) -> Path:
    """The path argument ``name`` as a Path: a ``str`` or ``os.PathLike`` naming a file.

    Raises:
        TypeError: ``value`` is not a str or an os.PathLike of str.
        ValueError: it is empty or ends in a separator, so names no file.
    """
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        raise TypeError(
            f"{name} must be a file path (a str or an os.PathLike), got {type(value).__name__}: "
            f"{shown(value)}"
        )
    target = Path(path)
    if not path or not target.name or path.endswith(("/", os.sep)):
        raise ValueError(f"{name} must name a file, got {path!r}")
    return target


def reworded(exc: OSError, text: str) -> OSError:
    """An OSError of the same class (by its errno) reading ``[Errno N] TEXT: REASON``."""
    reason = exc.strerror or str(exc)
    if exc.errno is None:
        return type(exc)(f"{text}: {reason}")
    return OSError(exc.errno, f"{text}: {reason}")


@contextlib.contextmanager
def written(target: Path, where: str) -> Iterator[io.BufferedWriter]:
    """A binary file that becomes ``target`` whole when the block ends, flushed to the disk, or
    is removed when the block raises (an OSError then reads ``[Errno N] WHERE: REASON``)."""
    try:
        temporary = Temporary(target)
    except OSError as exc:
        raise reworded(exc, where) from exc
    try:
        with os.fdopen(temporary.handle, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        temporary.commit()
    except BaseException as exc:
        temporary.discard()
        if isinstance(exc, OSError):
            raise reworded(exc, where) from exc
        raise


class Temporary:
    """The temporary file of a target: created beside it, then renamed over it or removed.

    Creating it removes the stale temporary files of the target first (NOTE [ temporary
    files ]); the new file has the mode ``open(target, "w")`` would give it, and is locked
    until :meth:`commit` or :meth:`discard`. Write to :attr:`handle` (and close it).

    Raises:
        OSError: as ``os.open`` does; IsADirectoryError when the target is a directory.
    """

    def __init__(self, target: Path) -> None:
        self.target = target
        try:
            existing = os.stat(target)
        except FileNotFoundError:
            mode = None
        else:
            if stat.S_ISDIR(existing.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
            mode = stat.S_IMODE(existing.st_mode) & 0o777 if stat.S_ISREG(existing.st_mode) else None
        remove_stale(target)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        while True:
            self.path = target.with_name(
                f".{target.name}.{_HOST}-{os.getpid()}-{_RUN}-{secrets.token_hex(4)}.tmp"
            )
            try:
                self.handle = os.open(self.path, flags, _NEW_FILE_MODE)
            except FileExistsError:  # pragma: no cover - a 1 in 2**32 clash of RANDOM: draw again
                continue
            break
        self._lock: int | None = None  # a duplicate of handle that keeps the lock to the end
        try:
            if sys.platform != "win32":
                self._lock = os.dup(self.handle)
                with contextlib.suppress(OSError):  # a file system without locks: the PID says
                    fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if mode is not None:  # as open(target, "w") would: the file replaced keeps its mode
                os.chmod(self.path, mode)
        except BaseException:
            os.close(self.handle)
            self.discard()
            raise

    def commit(self) -> None:
        """Rename the file (written and closed) over the target; then unlock it."""
        try:
            os.replace(self.path, self.target)
        finally:
            self._unlock()

    def discard(self) -> None:
        """Remove the file (its handle closed); then unlock it."""
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def remove_stale(target: Path) -> list[str]:
    """Remove the temporary files of ``target`` whose writer is gone; return their names.

    NOTE [ temporary files ] says which are; a file that cannot be removed is left.
    """
    prefix = f".{target.name}."
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.startswith(prefix):
            continue
        match = _TAIL.fullmatch(name, len(prefix))
        if match is None or match[1] != _HOST:
            continue
        pid, run = int(match[2]), match[3]
        # With this process's PID, only an earlier process that had it: another RUN tag.
        if not (run != _RUN if pid == os.getpid() else _gone(pid)):
            continue
        if _remove_unlocked(target.parent / name):
            removed.append(name)
    return removed


def _remove_unlocked(path: Path) -> bool:
    """Remove ``path`` unless its writer holds its lock; whether it was removed."""
    if sys.platform == "win32":  # a file its writer holds open is not removed
        try:
            path.unlink()
        except OSError:
            return False
        return True
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:  # removed by another writer meanwhile, or not ours to read
        return False
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its writer is alive (in another PID namespace)
            return False
        except OSError:  # a file system without locks: the PID said it is gone
            pass
        try:
            path.unlink()
        except OSError:  # removed by another writer meanwhile, or not ours to remove
            return False
        return True
    finally:
        os.close(handle)


def _gone(pid: int) -> bool:
    """Whether no process of this machine has the ID ``pid``."""
    if os.name != "posix":  # pragma: no cover - Windows' os.kill(pid, 0) would end the process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # PermissionError: another user's process; or no such PID
        return False
    return False
