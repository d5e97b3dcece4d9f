"""The chaos suite: seeded trials, each a random small net with processes and triggers under
the real-time or the virtual timer, into which one fault is injected at a random moment
(``_chaos.py`` says which faults and what each trial checks).

Each trial runs in a fresh interpreter with a hard timeout, so that a hang or a crash fails the
trial, with its seed and every thread's stack, and never the test run. The trials are
``MUJOU_CHAOS_TRIALS`` seeds from ``MUJOU_CHAOS_SEED`` on (12 from 0 by default: every fault
once, a few minutes on two cores); ``nox -s chaos -- --trials N`` runs more. A failed trial is
rerun alone with::

    PYTHONPATH=.:conformance python -c \
        'import _chaos, sys; sys.exit(_chaos.main(sys.argv[1:]))' SEED /tmp/chaos
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import _chaos
import pytest
from _support import hang_guard

TRIALS = int(os.environ.get("MUJOU_CHAOS_TRIALS", str(len(_chaos.FAULTS))))
BASE_SEED = int(os.environ.get("MUJOU_CHAOS_SEED", "0"))
HERE = Path(__file__).resolve().parent
# Past TRIAL_BOUND the trial's faulthandler dumps its stacks and ends it; this is for a trial
# that cannot even do that.
HARD_TIMEOUT = _chaos.TRIAL_BOUND + 10.0
RUNNER = "import sys, _chaos; sys.exit(_chaos.main(sys.argv[1:]))"


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    """The suite's hang guard (conftest.py), longer here: a trial starts two runs with their
    processes, and is bounded by its own timeouts first."""
    with hang_guard(HARD_TIMEOUT + 20.0):
        yield


def run_trial(seed: int, workdir: Path) -> tuple[int | None, dict[str, object] | None, str]:
    """Trial ``seed`` in a new interpreter: its exit status (None if it was killed at the hard
    timeout), its result, and its stderr."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")])
    with subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(seed), str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: a hard timeout kills its processes too
    ) as process:
        try:
            out, err = process.communicate(timeout=HARD_TIMEOUT)
            status: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate(timeout=10.0)
            status = None
    results = [line for line in out.splitlines() if line.startswith("CHAOS-RESULT ")]
    result = json.loads(results[-1].removeprefix("CHAOS-RESULT ")) if results else None
    return status, result, err


@pytest.mark.rule(
    "proc.died",
    "proc.cleanup",
    "proc.hook-error",
    "run.hook-error",
    "run.start-error",
    "run.start-undone",
    "run.interrupt",
    "run.internal-error",
)
@pytest.mark.parametrize("seed", range(BASE_SEED, BASE_SEED + TRIALS))
def test_a_run_survives_one_fault(seed: int, tmp_path: Path) -> None:
    """> When a process of the run ends while the run runs ... the run stops: the started
    > nodes of the other processes get their on_stop, and the host's next call that waits or
    > writes raises mujou.ProcessError ... (proc.died)
    > ... every process the run started has exited and none of the shared-memory segments it
    > made is left. (proc.cleanup)

    One trial: the host's calls return or raise the error the fault's rule names, within a
    bound; every node that started in a process that lived got on_stop exactly once; no
    process, /dev/shm entry or descriptor of the run is left; the net runs again cleanly."""
    status, result, err = run_trial(seed, tmp_path)
    rerun = f"rerun: PYTHONPATH=.:conformance python -c '{RUNNER}' {seed} /tmp/chaos-{seed}"
    if status is None or result is None:
        pytest.fail(f"trial {seed} hung or crashed (status {status}); {rerun}\nits stderr:\n{err[-6000:]}")
    problems = result["problems"]
    assert isinstance(problems, list)
    assert status == 0 and not problems, (
        f"trial {seed}: {json.dumps(result['plan'])}\noutcome: {result['outcome']}\n"
        + "\n".join(f"PROBLEM: {problem}" for problem in problems)
        + f"\n{rerun}\nits stderr:\n{err[-3000:]}"
    )
