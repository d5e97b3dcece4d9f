"""Each example runs to completion as ``python examples/NAME.py`` and prints what it promises.

The examples run as child processes, as a user runs them. Their real-time parts depend on
how busy the machine is, so only what does not depend on it is checked: exit status, the
lines a user looks for, results under the virtual timer, and a trace's format. Each test
prints the example's command line and output, which ``pytest -rA`` (``nox -s examples``) shows.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TIMEOUT = 60  # seconds; each example takes well under 15 s on 2 cores


def run_example(name: str, *args: str, timeout: float = TIMEOUT) -> str:
    """Run ``examples/NAME.py``; print and check its output (no failure, no warning); return it."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    print(f"$ python examples/{' '.join([name, *args])}\n{done.stdout}{done.stderr}", end="")
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    # Without numpy, importing torch warns about it: the nox session installs numpy.
    problems = [
        line
        for line in done.stderr.splitlines()
        if line.strip() and "NumPy" not in line and "_conversion_method_template" not in line
    ]
    assert not problems, f"{name} wrote to stderr:\n{done.stderr}"
    return done.stdout


def numbers(line: str) -> list[float]:
    return [float(value) for value in re.findall(r"[-+]?\d+\.\d+", line)]


def test_demo(tmp_path: Path) -> None:
    out = run_example("demo.py", "--out", str(tmp_path))
    assert "Both resumed runs ended in the same state, bit for bit: True" in out
    page = tmp_path / "demo-trace.html"
    assert f"look at it in a browser: {page}" in out, out  # the demo says where its picture is
    text = page.read_text(encoding="utf-8")
    assert all(name in text for name in ("camera", "policy", "controller")), text[:500]


def test_robot_loop_and_its_trace(tmp_path: Path) -> None:
    trace = tmp_path / "robot.json"
    out = run_example("robot_loop.py", "--trace", str(trace))
    assert "First command at t=" in out
    assert len(re.findall(r"^\d\.\d\d s ", out, re.MULTILINE)) == 6
    updates = {name: int(count) for name, count in re.findall(r"^(\w+) +(\d+) +\d+ ", out, re.MULTILINE)}
    assert set(updates) == {"camera", "policy", "controller"}
    assert all(count > 0 for count in updates.values())

    # The trace is in the Chrome trace event format, with one slice per hook call.
    events = json.loads(trace.read_text())["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    for event in slices:
        assert {"name", "cat", "ts", "dur", "pid", "tid"} <= event.keys()
        assert event["dur"] >= 0 and event["tid"] in threads
        if event["cat"] == "on_update":
            assert {"t", "dt", "lateness"} <= event["args"].keys()
    calls = Counter((e["name"], e["cat"]) for e in slices)
    for name, count in updates.items():
        assert calls[name, "on_start"] == calls[name, "on_stop"] == 1
        assert calls[name, "on_update"] == count
    assert {threads[e["tid"]] for e in slices if e["name"] == "camera"} == {"mujou-node-camera"}
    # An update may run on the waiting host's thread (threads.host-runs-updates), no other hook.
    assert all(
        threads[e["tid"]].startswith("mujou-worker-")
        or (e["cat"] == "on_update" and threads[e["tid"]] == "MainThread")
        for e in slices
        if e["name"] != "camera"
    )


def test_online_learner() -> None:
    out = run_example("online_learner.py")
    rows = [numbers(line) for line in out.splitlines() if re.match(r" *\d\.\d s ", line)]
    assert len(rows) == 6
    errors = [row[-1] for row in rows if len(row) == 2]  # time and error ("nan" has no digits)
    assert len(errors) >= 2 and errors[-1] < errors[0], out


def test_sensor_fusion() -> None:
    out = run_example("sensor_fusion.py")
    assert "Run again with 2 workers: the same state tree, bit for bit: True" in out
    *_, last = (numbers(line) for line in out.splitlines() if line.strip().endswith(" m"))
    gps, fused = last
    assert fused < gps


def test_checkpoint_resume() -> None:
    out = run_example("checkpoint_resume.py")
    assert "[child] saved the state at t=2.00 s" in out
    assert "Resumed from the file at t=2.00 s" in out
    rows = [numbers(line) for line in out.splitlines() if re.match(r" +\d\.\d\d +\[", line)]
    assert len(rows) == 4 and all(row[1:3] == row[3:5] for row in rows)
    # A plain int of the default state resumes: 200 positions in 4 s at 50 updates a second.
    assert "The tracker counted 200 positions without a break, and 200 resumed" in out
    assert "Both runs ended in the same state tree, bit for bit: True" in out


def test_many_nodes() -> None:
    out = run_example("many_nodes.py")
    assert out.startswith("10,000 nodes")
    rows = [line for line in out.splitlines() if re.match(r"\d\.\d s ", line)]
    assert len(rows) == 4
    assert int(rows[-1].split()[2].replace(",", "")) > 0  # updates per second


def test_ask_and_answer() -> None:
    out = run_example("ask_and_answer.py")
    assert "Virtual timer, 1 worker(s): 20 round trips at t=0.000 s" in out
    assert "Virtual timer, 2 worker(s): 20 round trips at t=0.000 s" in out
    assert "The answers on 1 and 2 workers are the same, bit for bit: True" in out
    # Each question makes one update of the model: 5 to warm up and 20 timed.
    assert re.search(r"Real-time timer: 20 round trips .* the model ran 25 times", out), out


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda path: path.name)
def test_every_example_is_tested(path: Path) -> None:
    tested = {
        "ask_and_answer",
        "demo",
        "robot_loop",
        "online_learner",
        "sensor_fusion",
        "checkpoint_resume",
        "many_nodes",
        "two_processes",
        "test_sensor_fusion",
        "record_replay",
        "two_machines",
    }
    assert path.stem in tested, f"add a test for examples/{path.name}"


def test_two_processes() -> None:
    out = run_example("two_processes.py", "--seconds", "0.5")
    runs = re.findall(r"(\d+) plans in 0.5 s .* the right planner in (.*); the sink saw (\d+)", out)
    assert [where for _, where, _ in runs] == ["the host's process", "a process of its own"], out
    assert all(int(made) > 0 and int(seen) > 0 for made, _, seen in runs), out
    assert re.search(r"Speed-up with the right planner in a process of its own: \d+\.\d\dx", out), out


def test_the_tests_of_the_sensor_fusion_nodes() -> None:
    """examples/test_sensor_fusion.py: pytest idioms with mujou.testing.Harness, run as a script."""
    out = run_example("test_sensor_fusion.py")
    assert re.search(r"^6 passed in ", out, re.MULTILINE), out


def test_record_replay(tmp_path: Path) -> None:
    pytest.importorskip("mcap")
    path = tmp_path / "run.mcap"
    out = run_example("record_replay.py", str(path))
    assert path.exists()
    assert "Recorded 2.0 s to " in out
    assert "The recording holds camera.frame, detector.spot, tracker.estimate;" in out
    assert re.search(r"^identical: True$", out, re.MULTILINE), out
    assert "Replayed from the keyframe at 1.0 s: identical: True" in out


def test_two_machines() -> None:
    out = run_example("two_machines.py")
    assert re.search(r"the controller sent [1-9]\d* commands; the filter ran on 127\.0\.0\.1:\d+", out), out
    assert out.rstrip().endswith("identical: True"), out
