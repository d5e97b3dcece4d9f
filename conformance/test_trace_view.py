"""Looking at a run offline: ``python -m mujou trace`` and ``mujou.plot_trace``.

A trace is recorded once per module (a virtual-timer run of a chain with a triggered node, so
that it has flows); the command runs in a child process as a user runs it, with this checkout
first on the path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from _support import HANG_GUARD, checkout_environ, hang_guard

import mujou
from mujou import Input, Net, Node, Output

REPO_ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 55.0  # seconds: a child imports torch (and matplotlib) on a busy machine
NAMES = ("camera_a", "policy_b", "motor_c")  # in no word of the page but their own


class Camera(Node):
    frame = Output()

    def __init__(self) -> None:
        super().__init__(period=0.02)

    def on_update(self, dt: float) -> None:
        self.frame.send(torch.ones(2))


class Policy(Node):
    frame = Input()
    command = Output()

    def __init__(self) -> None:
        super().__init__(trigger=mujou.on("frame"))

    def on_update(self, dt: float) -> None:
        frame = self.frame.read()
        assert frame is not None
        self.command.send(frame * 2)


class Motor(Node):
    command = Input()

    def __init__(self) -> None:
        super().__init__(period=0.005)

    def on_update(self, dt: float) -> None:
        self.command.read()


class Robot(Net):
    def __init__(self) -> None:
        super().__init__()
        self.camera_a = Camera()
        self.policy_b = Policy()
        self.motor_c = Motor()
        self.connect(self.camera_a.frame, self.policy_b.frame)
        self.connect(self.policy_b.command, self.motor_c.command)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """A trace of one second of ``Robot`` under the virtual timer, and each node's updates."""
    path = tmp_path_factory.mktemp("trace") / "robot.json"
    # A module's fixture runs before conftest's per-test one that keeps torch to one thread: on
    # a machine of many cores, torch's threads times the default workers would warn.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with hang_guard(HANG_GUARD), mujou.run(Robot(), timer=mujou.VirtualTimer(), trace=path) as run:
            run.sleep(1.0)
    finally:
        torch.set_num_threads(threads)
    return path, {name: node.updates for name, node in run.stats().nodes.items()}


CHILD = """
import contextlib, io, json, runpy, sys
blocked, argvs = json.loads(sys.argv[1])
if blocked is not None:
    sys.modules[blocked] = None  # importing it raises ImportError
results = []
for argv in argvs:
    sys.argv = ["mujou", *argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("mujou", run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code
    results.append((code, out.getvalue(), err.getvalue()))
print(json.dumps(results))
"""


def commands(*argvs: list[str], blocked: str | None = None) -> list[tuple[int, str, str]]:
    """Run ``python -m mujou ARGV`` for each ``ARGV``, in one child process with this checkout
    (and ``blocked`` made unimportable), as a user runs it: (exit status, stdout, stderr) each."""
    environ = checkout_environ(quiet=True)  # torch's own warnings on import
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([blocked, argvs])],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=environ,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [(code, out, err) for code, out, err in json.loads(done.stdout)]


def run_python(code: str) -> str:
    """The standard output of ``python -c CODE`` with this checkout; it must succeed."""
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env=environ,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def check_page(page: str, updates: dict[str, int]) -> None:
    """A self-contained page: each node named, no script, nothing fetched, its SVG well formed."""
    assert page.startswith("<!DOCTYPE html>"), page[:200]
    for name in NAMES:
        assert name in page, f"{name} not on the page"
    assert re.search(r"<script|<link|<img|<iframe|@import|url\(", page, re.IGNORECASE) is None
    assert re.search(r"\b(src|href)=", page) is None, "the page refers to another file"
    svgs = re.findall(r"<svg.*?</svg>", page, re.DOTALL)
    assert len(svgs) >= 3, len(svgs)  # the timeline, the histograms, the busy share
    for svg in svgs:
        ET.fromstring(svg)  # well formed
    for name in updates:  # each node's hook calls are drawn on the timeline
        assert re.search(rf"<rect [^>]*><title>{name}: ", svgs[0]), f"no hook call of {name} drawn"
    lines = svgs[0].count("<line") - svgs[0].count('stroke="#333"')  # less the axis' ticks
    assert lines == updates["camera_a"], "a line per flow: each frame wakes the policy"
    for name, count in updates.items():  # the lateness table: the node, then its updates
        assert re.search(rf"{name}</td><td>{count}</td>", page), (name, count)


@pytest.mark.rule("observe.trace-view")
def test_the_command_prints_a_summary_and_writes_a_self_contained_page(
    recorded: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """> `python -m mujou trace FILE` [...] prints a summary to stdout: [...] per node its updates
    and the p50, p99 and maximum of their lateness, and per thread its busy share [...].
    `--html OUT` also writes a page [...] one self-contained HTML file [...] no script, nothing
    fetched."""
    path, updates = recorded
    page = tmp_path / "robot.html"
    [(code, stdout, stderr)] = commands(["trace", str(path), "--html", str(page)])
    assert code == 0, stderr
    assert stderr == "", stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("robot.json: "), lines[0]
    assert "3 node(s)" in lines[0] and f"{updates['camera_a']} flow(s)" in lines[0], lines[0]
    for name, count in updates.items():
        row = next(line for line in lines if line.startswith(name + " "))
        assert row.split()[1] == str(count), (row, count)
        assert len(re.findall(r"\d+\.\d+ ms", row)) == 3, row  # p50, p99, max
    assert any(re.match(r"mujou-\S+ +\d+\.\d%$", line) for line in lines), stdout
    assert lines[-1] == f"wrote {page}", lines[-1]
    check_page(page.read_text(encoding="utf-8"), updates)


@pytest.mark.rule("observe.trace-view")
def test_plot_trace_writes_the_page_and_refuses_other_suffixes(
    recorded: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """> `mujou.plot_trace(trace, out)` writes the same from a program, the page for `out`
    ending in `.html` (or `.htm`) [...]; another suffix raises `ValueError` naming those
    allowed."""
    path, updates = recorded
    for name in ("a.html", "b.HTM"):
        mujou.plot_trace(path, tmp_path / name)
        check_page((tmp_path / name).read_text(encoding="utf-8"), updates)
    with pytest.raises(ValueError, match=r"out must end in \.html, \.htm, \.png, \.svg, \.pdf .*c\.txt'"):
        mujou.plot_trace(path, tmp_path / "c.txt")
    with pytest.raises(TypeError, match="trace must be a file path, got int"):
        mujou.plot_trace(3, tmp_path / "d.html")  # type: ignore[arg-type]  # the wrong type, on purpose
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "b.HTM"]


@pytest.mark.rule("observe.trace-view")
def test_a_file_that_is_not_a_trace_is_an_error_naming_it(tmp_path: Path) -> None:
    """> A `FILE` that cannot be read or is not such a trace makes the command print an error
    naming it to stderr and exit with status 1 (`plot_trace` raises `OSError` or `ValueError`)."""
    not_json, no_events = tmp_path / "a.json", tmp_path / "b.json"
    not_json.write_text("{", encoding="utf-8")
    no_events.write_text('{"events": []}', encoding="utf-8")
    paths = (not_json, no_events, tmp_path / "missing.json")
    results = commands(*(["trace", str(path), "--html", str(tmp_path / "out.html")] for path in paths))
    for path, (code, stdout, stderr) in zip(paths, results, strict=True):
        assert code == 1, (stdout, stderr)
        assert stderr.startswith("python -m mujou trace: error: "), stderr
        assert path.name in stderr, stderr
    with pytest.raises(ValueError, match="is not a trace"):
        mujou.plot_trace(no_events, tmp_path / "out.html")
    with pytest.raises(OSError):
        mujou.plot_trace(tmp_path / "missing.json", tmp_path / "out.html")
    assert not (tmp_path / "out.html").exists()


@pytest.mark.rule("observe.trace-view")
def test_the_picture_is_a_png_of_the_trace(recorded: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    """> `--plot OUT` [writes] a picture (`.png`, `.svg` or `.pdf`) [...]. `mujou.plot_trace(trace,
    out)` writes the same from a program [...] the picture for `.png`, `.svg` or `.pdf`."""
    image = pytest.importorskip("matplotlib.image")
    path, _ = recorded
    png, svg = tmp_path / "robot.png", tmp_path / "robot.svg"
    [(code, stdout, stderr)] = commands(["trace", str(path), "--plot", str(png)])
    assert code == 0, stderr
    assert stdout.splitlines()[-1] == f"wrote {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = image.imread(png).shape
    assert width > 800 and height > 300, (width, height)
    mujou.plot_trace(path, svg)
    ET.parse(svg)  # a well-formed SVG


@pytest.mark.rule("observe.trace-view-extra")
def test_without_matplotlib_the_picture_names_the_extra_and_the_page_works(
    recorded: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """> Without it, `--plot` prints an error naming `pip install mujou[plot]` and exits with
    status 1 before reading the trace [...]; neither writes a file. `import mujou` never
    imports matplotlib."""
    path, _ = recorded
    png, page = tmp_path / "robot.png", tmp_path / "robot.html"
    alone = tmp_path / "alone.html"
    both = ["trace", str(path), "--html", str(page), "--plot", str(png)]
    only_html = ["trace", str(path), "--html", str(alone)]
    (code, stdout, stderr), (html_code, _, html_err) = commands(both, only_html, blocked="matplotlib")
    assert code == 1, (stdout, stderr)
    assert "pip install mujou[plot]" in stderr, stderr
    assert stdout == "", stdout  # refused before the trace was read
    assert not png.exists() and not page.exists()
    assert html_code == 0 and alone.stat().st_size > 0, html_err  # the page needs nothing
    out = run_python(
        "import sys; sys.modules['matplotlib'] = None\n"
        "import mujou\n"
        f"mujou.plot_trace({str(path)!r}, {str(tmp_path / 'p.html')!r})\n"
        "try:\n"
        f"    mujou.plot_trace({str(path)!r}, {str(png)!r})\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
        "print(sorted(m for m in sys.modules if m.startswith('matplotlib') and sys.modules[m] is not None))\n"
    )
    assert out.startswith("ImportError: ") and "pip install mujou[plot]" in out, out
    assert out.splitlines()[-1] == "[]", out
    assert not png.exists()
    assert (
        run_python("import sys, mujou; print(sorted(m for m in sys.modules if 'matplotlib' in m))") == "[]\n"
    )
