"""Unit tests of mujou._hosts: the versions an agent refuses, the life line's frames."""

from __future__ import annotations

import multiprocessing
import time

import pytest
from _support import HANG_GUARD

from mujou._hosts import _life as life
from mujou._hosts._launch import refusal, versions
from mujou._hosts._remote import RemoteProcess


@pytest.mark.rule("hosts.refused")
def test_an_agent_refuses_other_versions_naming_both() -> None:
    mujou_, torch_, python = versions()
    assert refusal((mujou_, torch_, python)) is None
    text = refusal(("0.0.1", torch_, "3.99"))
    assert text is not None
    assert f"Mujou 0.0.1 on the run's host, {mujou_} here" in text and "Python 3.99" in text
    assert "torch" not in text.split(":")[0] and text.endswith("on every host")


def test_life_frames_round_trip_and_refuse_anything_else() -> None:
    assert life.parse(life.frame(life.EXIT, -9)) == (life.EXIT, -9)
    with pytest.raises(ValueError, match=r"^a life frame has 9 bytes"):
        life.parse(b"\x80\x04pickle")


@pytest.mark.rule("hosts.lost")
def test_the_host_sends_a_heartbeat_once_a_beat_not_in_answer_to_each_frame() -> None:
    """Planted: a heartbeat after every frame received (as both ends did): the agent's side,
    answering each frame, then gets thousands in half a second instead of about five."""
    ours, theirs = multiprocessing.Pipe()
    remote = RemoteProcess("127.0.0.1:1", "g", ours, timeout=1.0)  # a beat of 0.1 s
    received = 0
    began = time.monotonic()
    while time.monotonic() - began < 0.5 or not received:
        assert time.monotonic() - began < HANG_GUARD, "no heartbeat came"
        if theirs.poll(0.05):
            assert life.parse(theirs.recv_bytes()) == (life.ALIVE, 0)
            received += 1
            theirs.send_bytes(life.frame(life.ALIVE))  # an agent answering each frame
    assert received <= 50, received
    theirs.send_bytes(life.frame(life.EXIT, 0))
    remote.join(HANG_GUARD)
    assert remote.exitcode == 0 and not remote.is_alive()
    theirs.close()
