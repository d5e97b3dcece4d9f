"""The start of a run with processes from the main programs a user writes: a script without the
``if __name__ == "__main__":`` guard, a script read from standard input.

Each test runs a small program in a new interpreter with this checkout first on the path (as a
user runs it), bounded by a timeout, and checks what it printed and its exit status.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _support import checkout_environ

TIMEOUT = 180.0  # seconds; a new interpreter imports torch, the run's process too (busy machine)

NODES = textwrap.dedent(
    """
    import torch
    import mujou
    from mujou import Input, Net, Node, Output

    class Source(Node):
        y = Output()

        def __init__(self):
            super().__init__(period=0.01)

        def on_update(self, dt):
            self.y.send(torch.ones(1))

    class Sink(Node):
        x = Input()

        def __init__(self):
            super().__init__(trigger=mujou.on("x"))
            self.seen = 0

        def on_update(self, dt):
            self.seen += 1

    class Pair(Net):
        def __init__(self):
            super().__init__()
            self.source = Source()
            self.sink = Sink()
            self.connect(self.source.y, self.sink.x)
    """
)

RUN = textwrap.dedent(
    """
    net = Pair()
    with mujou.run(net, timer=mujou.VirtualTimer(), processes={"far": net.sink}, workers=1) as run:
        run.sleep(0.05)
        print("seen", run.state_dict()["sink"]["seen"])
    """
)


def python(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in ``cwd`` with this checkout's mujou; its result."""
    environ = checkout_environ(quiet=True)  # torch's own warnings on import
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=environ,
        cwd=cwd,
        check=False,
    )


@pytest.mark.rule("proc.main-guard")
def test_a_script_without_the_guard_is_told_about_the_guard_in_a_few_lines(tmp_path: Path) -> None:
    """> A `mujou.run` called in a process of a run while that process imports the main script
    [...] starts nothing: the process ends at once, printing nothing, and the host's
    `mujou.run` raises `ProcessError` whose message names the main script, the missing
    `if __name__ == "__main__":` guard and the fix."""
    script = tmp_path / "unguarded.py"
    script.write_text(NODES + RUN)
    result = python([str(script)], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("mujou.ProcessError: process 'far' of the run could not start"), output
    assert 'if __name__ == "__main__":' in last, output
    assert str(script) in last, output
    assert "seen" not in result.stdout, output  # neither the host's run nor the process's ran
    assert "RuntimeError" not in output and "bootstrapping" not in output, output
    assert len(output.splitlines()) < 20, output


@pytest.mark.rule("proc.main-guard")
def test_an_unguarded_run_without_processes_before_a_guarded_one_is_named_too(tmp_path: Path) -> None:
    """> A `mujou.run` called in a process of a run while that process imports the main script
    [...] starts nothing [...]: two programs pasted into one file, the first without the guard
    and without processes, would run the first again in the second's process."""
    first = "first = Pair()\nwith mujou.run(first, timer=mujou.VirtualTimer()) as run:\n    run.sleep(0.05)\n"
    first += "print('first ran')\n"
    guarded = "\nif __name__ == '__main__':\n" + textwrap.indent(RUN, "    ")
    script = tmp_path / "pasted.py"
    script.write_text(NODES + first + guarded)
    result = python([str(script)], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert result.stdout.count("first ran") == 1, output  # in the host only, not in the process
    last = output.strip().splitlines()[-1]
    assert last.startswith("mujou.ProcessError: process 'far' of the run could not start"), output
    assert 'if __name__ == "__main__":' in last, output


@pytest.mark.rule("proc.main-file")
def test_a_node_class_of_a_script_on_stdin_is_refused_with_a_type_error_naming_it(tmp_path: Path) -> None:
    """> A node placed in a process whose class is defined there makes `mujou.run` raise
    `TypeError` before any process starts, naming the node, its class, the kind of main
    program and the fix."""
    for args, kind in ((["-"], "read from standard input"), (["-c", NODES + RUN], "python -c")):
        result = python(args, tmp_path, stdin=NODES + RUN if args == ["-"] else None)
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        last = output.strip().splitlines()[-1]
        assert last.startswith("TypeError: node 'sink' cannot be copied into process 'far'"), output
        assert "its class Sink" in last and kind in last and "module file" in last, output
        assert "FileNotFoundError" not in output, output


@pytest.mark.rule("proc.main-file")
def test_a_script_on_stdin_runs_node_classes_imported_from_a_module(tmp_path: Path) -> None:
    """> Node classes imported from module files run in processes from such a main program as
    from any other."""
    (tmp_path / "pair_nodes.py").write_text(NODES)
    program = "import sys\nsys.path.insert(0, '.')\nimport mujou\nfrom pair_nodes import Pair\n" + RUN
    result = python(["-"], tmp_path, stdin=program)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "FileNotFoundError" not in output, output
    seen = int(result.stdout.split("seen", 1)[1].split()[0])
    assert seen > 0, output  # the sink ran in its process, triggered by the source's messages
