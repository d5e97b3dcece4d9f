"""Conformance tests for the page "Several machines", through Ray: ``hosts.ray*``.

The cluster is a local Ray instance started once for the module (Ray's start takes seconds,
and each group placed on it starts a Ray worker that imports torch): each test checks several
things in one run. The tests that need Ray skip where it is not installed (``mujou[ray]``);
the one on Ray's absence runs everywhere.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from _agents import chain_run
from _process_nodes import Chain
from _support import HANG_GUARD, checkout_environ, hang_guard, vt, wait_until

import mujou
from mujou.testing import state_difference

RESOURCE = "mujou_conformance"  # a custom resource of the test's node, which a group asks for


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    """A longer guard than conftest's: a group placed by Ray starts a Ray worker and then a
    fork server, each importing torch (seconds each, many on 2 busy cores); every wait in
    the tests is guarded on its own too (``HANG_GUARD``, ``wait_until``)."""
    with hang_guard(180.0):
        yield


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    ray.init(
        address="local", num_cpus=2, resources={RESOURCE: 1}, include_dashboard=False, log_to_driver=False
    )
    yield ray
    ray.shutdown()


def free(ray: Any) -> bool:
    """Whether the test's resource is back: no actor of a group holds it any more."""
    return bool(ray.available_resources().get(RESOURCE, 0) == 1)


@pytest.mark.rule("hosts.ray", "hosts.virtual")
def test_a_group_placed_by_ray_gives_the_bits_of_one_process(ray: Any) -> None:
    alone = chain_run(None, Chain())
    net = Chain()
    placed = chain_run({"g1": mujou.OnRay(net.left, num_cpus=0.5, resources={RESOURCE: 1})}, net)
    difference = state_difference(alone, placed)
    assert difference is None, difference
    assert len(placed["tree"]["back"]["log"]) > 5  # the chain ran, across the Ray group
    # Once the run ended, the actor is gone: its resource is free again.
    wait_until(lambda: free(ray), "the group's actor to give its resource back")
    # A group no node can take is refused within its start_timeout, and leaves no actor.
    absent = mujou.OnRay(net.left, resources={"no_such_resource": 1}, start_timeout=1.0)
    with pytest.raises(
        mujou.HostError, match=r"no node of the Ray cluster took the group within 1 s"
    ) as info:
        mujou.run(net, timer=vt(), processes={"g1": absent})
    assert info.value.process == "g1" and "'no_such_resource': 1.0" in str(info.value)
    wait_until(
        lambda: not [a for a in ray.util.list_named_actors() if a.startswith("mujou-")],
        "the refused group's actor to end",
    )


@pytest.mark.rule("hosts.ray-lost", "hosts.data-plane")
def test_a_killed_actor_stops_the_run_naming_the_host_and_its_nodes(ray: Any) -> None:
    net = Chain()
    where = mujou.OnRay(net.left, num_cpus=0.5, resources={RESOURCE: 1})
    run = mujou.run(net, timer=mujou.RealTimeTimer(), workers=1, processes={"g1": where})
    with pytest.raises(mujou.ProcessError) as info, run:
        # A message that went to the Ray group and back, over the data plane.
        run.wait_for(net.right[0].out, lambda message: True, timeout=HANG_GUARD)
        (name,) = [a for a in ray.util.list_named_actors() if a.startswith("mujou-g1-")]
        ray.kill(ray.get_actor(name))
        wait_until(lambda: not run.running, "the run to stop")
    error = info.value
    message = str(error)
    here = ray.util.get_node_ip_address()
    assert error.process == "g1" and error.exitcode is None, message
    assert f"on host '{here}:" in message and f", Ray actor {name}'" in message, message
    assert "was lost: its agent closed the connection" in message, message
    assert error.nodes == ("left.src_b", "left.relay1", "left.sink") and "'left.relay1'" in message
    wait_until(lambda: free(ray), "the killed actor's resource to be free")


@pytest.mark.rule("hosts.ray", "hosts.ray-extra")
def test_on_ray_refuses_bad_arguments_and_needs_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    net = Chain()
    # Importing mujou never imports Ray.
    program = "import sys, mujou; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=checkout_environ(quiet=True),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    with monkeypatch.context() as absent:
        absent.setitem(sys.modules, "ray", None)  # as where Ray is not installed
        with pytest.raises(
            ImportError, match=r"needs Ray, which is not installed here: pip install mujou\[ray\]"
        ):
            mujou.OnRay(net.left)
    pytest.importorskip("ray")  # the refusals below need Ray; the checks above do not
    with pytest.raises(TypeError, match=r"^num_cpus must be a number, got str"):
        mujou.OnRay(net.left, num_cpus="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^num_gpus must be at least 0 and finite, got -1"):
        mujou.OnRay(net.left, num_gpus=-1)
    with pytest.raises(TypeError, match=r"^resources must be a dict"):
        mujou.OnRay(net.left, resources=["robot"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^give the CPUs as num_cpus=, not in resources"):
        mujou.OnRay(net.left, resources={"CPU": 1})
    with pytest.raises(ValueError, match=r"^timeout must be at least 0.5 seconds"):
        mujou.OnRay(net.left, timeout=0.1)
    with pytest.raises(TypeError, match=r"^processes\['g'\] holds 'x'"):
        mujou.run(net, timer=vt(), processes={"g": mujou.OnRay("x")})
