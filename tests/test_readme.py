"""What a reader of README.md types works as written there.

- CI (``.ci/run``) runs the README's two commands, the code of the blocks marked
  ``<!-- ci: demo -->`` and ``<!-- ci: test -->``, read from the README; the test command
  runs the sessions that nox runs by default (``nox.options.sessions`` in noxfile.py).
- Each python block of the README is a whole program whose run is under
  ``if __name__ == "__main__":``, so that pasting the blocks together, or importing one from
  another, runs no program twice (a process started with ``spawn`` imports the main script).
- The processes example, saved beside the first net as the README says, runs and runs the
  first net's program nowhere (conformance/meta/test_docs_agree.py runs the first net).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
#: A marked fenced block: the marker line, then the block.
MARKED = re.compile(r"^<!-- ci: (\w+) -->\n```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
TIMEOUT = 120  # seconds, for the processes example (two processes that import torch)


def python_blocks() -> list[str]:
    return PYTHON_BLOCK.findall(README.read_text(encoding="utf-8"))


def test_ci_runs_the_readme_commands_as_written() -> None:
    marked = dict(MARKED.findall(README.read_text(encoding="utf-8")))
    assert sorted(marked) == ["demo", "test"], f"README.md marks {sorted(marked)}, not demo and test"
    printed = subprocess.run(
        ["bash", str(REPO / ".ci" / "run"), "--print"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert printed == marked["demo"] + marked["test"], printed
    assert marked["demo"].split() == ["./nox", "-s", "demo"], marked["demo"]
    default = re.search(r"^nox\.options\.sessions = (\[.*\])$", (REPO / "noxfile.py").read_text(), re.M)
    assert default is not None, "noxfile.py sets no nox.options.sessions"
    assert marked["test"].split() == ["./nox", "-s", *ast.literal_eval(default.group(1))], marked["test"]


def test_ci_refuses_a_readme_without_its_commands(tmp_path: Path) -> None:
    """A README that lost a marker or its block fails CI, naming the marker."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_bytes((REPO / ".ci" / "run").read_bytes())
    text = README.read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(text.replace("<!-- ci: test -->\n```sh", "```sh"), encoding="utf-8")
    done = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run"), "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "<!-- ci: test -->" in done.stderr, done


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_each_python_block_runs_only_under_its_main_guard(index: int) -> None:
    """At the top level: imports, classes, functions and the ``__main__`` guard, nothing else."""
    tree = ast.parse(python_blocks()[index])
    guards = 0
    for statement in tree.body:
        if isinstance(statement, ast.Import | ast.ImportFrom | ast.ClassDef | ast.FunctionDef):
            continue
        is_guard = isinstance(statement, ast.If) and ast.unparse(statement.test) in {
            "__name__ == '__main__'",
            "'__main__' == __name__",
        }
        assert is_guard, (
            f"README.md, python block {index + 1}, line {statement.lineno}: "
            f"{ast.unparse(statement).splitlines()[0]!r} runs on import; put it under "
            'if __name__ == "__main__":'
        )
        guards += 1
    assert guards == 1, f"README.md, python block {index + 1}: {guards} __main__ guards, not 1"


def test_the_processes_example_runs_beside_the_first_net(tmp_path: Path) -> None:
    """robot_processes.py, beside robot.py, runs; the first net's program runs in no process."""
    first, processes = python_blocks()
    assert "from robot import Robot" in processes
    (tmp_path / "robot.py").write_text(first, encoding="utf-8")
    (tmp_path / "robot_processes.py").write_text(processes, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-W", "error", "-W", "ignore:Failed to initialize NumPy", "robot_processes.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", done
    assert [line for line in done.stdout.splitlines() if line.startswith("tensor(")] == [
        done.stdout.splitlines()[0]
    ], done.stdout
    assert not (tmp_path / "robot.pt").exists(), "the first net's program ran (it wrote robot.pt)"
