"""Unit tests of mujou._hosts: the versions an agent refuses, the life line's frames."""

from __future__ import annotations

import pytest

from mujou._hosts import _life as life
from mujou._hosts._launch import refusal, versions


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
