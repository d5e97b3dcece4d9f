"""Conformance tests of the thread that runs the tags of a run with processes under the
virtual timer (proc.lockstep-thread). The nodes are in ``_lockstep_nodes.py``."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _lockstep_nodes import Volley
from _support import HANG_GUARD, hang_guard, vt

import mujou


@pytest.mark.rule("proc.lockstep-thread")
def test_the_thread_that_runs_the_tags_runs_the_host_process_updates() -> None:
    """With one worker, the tags of ``run.sleep`` run the host's process's updates on
    ``mujou-lockstep``, those of ``run.wait_for`` on the host's thread; a hook there is refused
    the run's calls that wait, sees a new thread's settings at each tag, and its leaked grad mode
    is put back after the tag; the reads are the same as in one process.
    Planted: ``Member.instant`` not lending its thread (``lends = False``): the updates ran on
    ``mujou-worker-0`` and this fails."""
    net, alone = Volley(), Volley()
    refused: list[str] = []

    def wait_in_the_hook() -> None:
        try:
            run.sleep(0.0)
        except RuntimeError as exc:
            refused.append(str(exc))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mujou.LeakedSettingWarning)
        with hang_guard(HANG_GUARD), mujou.run(alone, workers=1, timer=vt()) as run_alone:
            run_alone.sleep(0.05)
            run_alone.wait_for(alone.near.y, lambda _: run_alone.time >= 0.1)
            expected = run_alone.read(alone.near.y), run_alone.read(alone.far.y)
        with hang_guard(HANG_GUARD), mujou.run(net, workers=1, timer=vt(), processes={"far": net.far}) as run:
            net.near.action = wait_in_the_hook
            run.sleep(0.05)
            net.near.action = None
            on_sleep = list(net.near.threads)
            run.wait_for(net.near.y, lambda _: run.time >= 0.1)
            on_wait = net.near.threads[len(on_sleep) :]
            got = run.read(net.near.y), run.read(net.far.y)
    assert len(on_sleep) == 5 and set(on_sleep) == {"mujou-lockstep"}, on_sleep
    assert len(on_wait) == 5 and set(on_wait) == {threading.current_thread().name}, on_wait
    assert net.near.grad == [True] * len(net.near.grad)  # put back after each tag
    assert len(refused) == len(on_sleep) and refused[0].startswith(
        "run.sleep() cannot be called from a hook of node 'near'"
    ), refused[:1]
    assert expected[0] is not None and got[0] is not None and expected[1] is not None and got[1] is not None
    assert float(got[0]) == float(expected[0]) and float(got[1]) == float(expected[1])


class Passing(torch.overrides.TorchFunctionMode):
    """A torch function mode that changes nothing: each function as it is."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return func(*args, **(kwargs or {}))


@pytest.mark.rule("proc.lockstep-thread")
@pytest.mark.rule("threads.host-thread-settings")
def test_a_setting_a_hook_leaves_on_the_lockstep_thread_ends_its_lending() -> None:
    """``mujou-lockstep`` runs the host's process's updates only while its settings are a new
    thread's, checked before each tag of a sleep, though it lends itself once for all of them:
    a torch function mode that ``near``'s first update enters and never leaves (it is not put
    back) leaves the later updates to the worker.
    Planted: ``Lender._run_taken`` not ending the span's lending on a setting left (the
    ``self.span = False`` there dropped): every update ran on ``mujou-lockstep`` and this fails."""
    net = Volley()
    left: list[Passing] = []

    def leave_a_mode() -> None:
        if not left:
            left.append(Passing())
            left[0].__enter__()  # type: ignore[no-untyped-call]  # torch's, untyped; never left

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mujou.LeakedSettingWarning)
        with hang_guard(HANG_GUARD), mujou.run(net, workers=1, timer=vt(), processes={"far": net.far}) as run:
            net.near.action = leave_a_mode
            run.sleep(0.05)
    assert net.near.threads == ["mujou-lockstep"] + ["mujou-worker-0"] * 4, net.near.threads
