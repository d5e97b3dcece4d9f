"""Unit tests of the temporary files beside a target (``_files.py``): which stale ones go.

White-box: the names are made here with the machine and run tags of this process, to try the
cases a black-box test cannot make (a restarted process with this PID, another machine, a
process of another user). See NOTE [ temporary files ] in ``mujou/_files.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mujou import _files

POSIX = os.name == "posix"


def dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def name(target: str, machine: str, pid: int, run: str, random: str = "0123abcd") -> str:
    return f".{target}.{machine}-{pid}-{run}-{random}.tmp"


@pytest.mark.skipif(not POSIX, reason="the writer's PID is checked on POSIX only")
def test_which_temporary_files_are_stale(tmp_path: Path) -> None:
    machine, run, me = _files._HOST, _files._RUN, os.getpid()
    other_run = "ffffffff" if run != "ffffffff" else "eeeeeeee"
    other_machine = "00000000" if machine != "00000000" else "11111111"
    gone = dead_pid()
    stale = [
        name("s.pt", machine, gone, other_run),  # a process that ended
        name("s.pt", machine, me, other_run),  # an earlier process with this PID
    ]
    kept = [
        name("s.pt", machine, me, run),  # this process: another thread saving
        name("s.pt", machine, os.getppid(), other_run),  # a live process
        name("s.pt", machine, 1, other_run),  # a live process (init; of another user when not root)
        name("s.pt", other_machine, gone, other_run),  # another machine's process
        name("s.pt.x.pt", machine, gone, other_run),  # the temporary file of another target
        name("other.pt", machine, gone, other_run),
        name("s.pt", machine, 2**32, other_run),  # no such PID
        f".s.pt.{machine}-{gone}-{other_run}.tmp",  # not this naming
        f".s.pt.{machine}-{gone}-{other_run}-0123abcd.tmp.old",
        f"s.pt.{machine}-{gone}-{other_run}-0123abcd.tmp",
        "s.pt",
    ]
    for each in stale + kept:
        (tmp_path / each).write_text("x", encoding="utf-8")
    removed = _files.remove_stale(tmp_path / "s.pt")
    assert sorted(removed) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert _files.remove_stale(tmp_path / "s.pt") == []


def test_a_missing_directory_has_no_stale_file(tmp_path: Path) -> None:
    assert _files.remove_stale(tmp_path / "missing" / "s.pt") == []


def test_the_temporary_file_follows_the_naming_and_is_locked_until_committed(tmp_path: Path) -> None:
    temporary = _files.Temporary(tmp_path / "s.pt")
    os.close(temporary.handle)
    assert temporary.path.parent == tmp_path
    match = _files._TAIL.fullmatch(temporary.path.name, len(".s.pt."))
    assert match is not None, temporary.path.name
    assert (match[1], int(match[2]), match[3]) == (_files._HOST, os.getpid(), _files._RUN)
    assert _files.remove_stale(tmp_path / "s.pt") == [], "this process's own file is stale"
    if POSIX:
        assert not _files._remove_unlocked(temporary.path), "removed while its writer holds it"
    temporary.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pt"]


@pytest.mark.skipif(not POSIX, reason="flock is POSIX")
def test_a_file_whose_writer_holds_its_lock_is_kept_whatever_its_pid(tmp_path: Path) -> None:
    """A writer of another PID namespace: its PID means nothing here, its lock holds."""
    import fcntl

    stale = tmp_path / name("s.pt", _files._HOST, dead_pid(), "ffffffff")
    stale.write_text("x", encoding="utf-8")
    writer = os.open(stale, os.O_RDONLY)
    try:
        fcntl.flock(writer, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _files.remove_stale(tmp_path / "s.pt") == []
        assert stale.exists()
    finally:
        os.close(writer)  # the writer dies: its lock goes
    assert _files.remove_stale(tmp_path / "s.pt") == [stale.name]
    assert not stale.exists()


def test_reworded_keeps_the_class_and_errno() -> None:
    error = _files.reworded(PermissionError(13, "Permission denied", "/x/.s.pt.tmp"), "cannot write 'x'")
    assert type(error) is PermissionError and error.errno == 13
    assert str(error) == "[Errno 13] cannot write 'x': Permission denied"
    bare = _files.reworded(OSError("no errno"), "cannot write 'x'")
    assert type(bare) is OSError and str(bare) == "cannot write 'x': no errno"
