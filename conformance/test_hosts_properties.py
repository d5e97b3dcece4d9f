"""A property test of the page "Several machines" (hosts.virtual): any net gives the same bits
on one, two and three hosts.

The nets are those of test_trigger_properties.py (2 to 8 periodic and triggered nodes, joins,
delays, cycles, host writes), each run three times under the virtual timer: in one process,
with the nodes spread over the run's host and one other host, and over the run's host and two
others, each node's host drawn at random (every other host gets at least one node). The state
trees, the host's reads of every output, the statistics and the time must be equal, bit for
bit. The "hosts" are two agents on loopback, shared by every example (an agent's start imports
torch). The cost: each example starts three remote processes (about a second each on 2 busy
cores), so the examples are few (``max_examples`` below; about 30 s in all).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from _agents import SECRET, LocalHost, two_local_hosts
from _support import HANG_GUARD, hang_guard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_trigger_properties import Scenario, build, differences, do, scenarios

import mujou

HOSTS = settings(
    max_examples=8,
    deadline=None,  # a run's time is the machine's: 2 busy cores under -n auto
    derandomize=True,  # the same examples on every machine
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
)


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    """A longer guard than conftest's: the property runs many nets (and more while hypothesis
    shrinks a failure); each run is guarded on its own too (``HANG_GUARD``)."""
    with hang_guard(600.0):
        yield


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalHost, LocalHost]]:
    yield from two_local_hosts(tmp_path_factory.mktemp("agents"))


Placed = tuple[Scenario, list[int], list[int]]  # a net, and each node's host for 2 and 3 hosts


@st.composite
def placed_scenarios(draw: st.DrawFn) -> Placed:
    """A random net, and each node's host (0: the run's host) on two hosts and on three; every
    host but the run's has a node."""
    scenario = draw(scenarios())
    count = len(scenario.cells)
    two = draw(st.lists(st.integers(0, 1), min_size=count, max_size=count))
    three = draw(st.lists(st.integers(0, 2), min_size=count, max_size=count))
    first, second, *_ = draw(st.permutations(range(count)))
    two[first] = 1
    three[first], three[second] = 1, 2
    return scenario, two, three


def run_on(scenario: Scenario, hosts: Sequence[int] | None, agents: Sequence[LocalHost]) -> dict[str, Any]:
    """Run ``scenario`` with node ``i`` on host ``hosts[i]`` (None: all in one process)."""
    net, nodes = build(scenario.cells)
    processes: dict[str, object] | None = None
    if hosts is not None:
        processes = {
            f"h{k}": mujou.OnHost(
                [node for node, host in zip(nodes, hosts, strict=True) if host == k],
                agents[k - 1].address,
                secret=SECRET,
            )
            for k in sorted(set(hosts) - {0})
        }
    with hang_guard(HANG_GUARD), mujou.run(net, timer=mujou.VirtualTimer(), processes=processes) as run:
        for step in scenario.steps:
            do(run, nodes, step)
        stats = run.stats().nodes
        return {
            "tree": run.state_dict(),
            "reads": [run.read(node.y) for node in nodes],
            "updates": {name: stats[name].updates for name in stats},
            "coalesced": {name: dict(stats[name].coalesced) for name in stats},
            "time": run.time,
        }


@pytest.mark.rule("hosts.virtual", "hosts.placement", "hosts.host-api", "hosts.cleanup")
@HOSTS
@given(placed_scenarios())
def test_any_net_gives_the_same_bits_on_one_two_and_three_hosts(
    agents: tuple[LocalHost, LocalHost], placed: Placed
) -> None:
    scenario, two, three = placed
    alone = run_on(scenario, None, agents)
    assert alone["updates"]["n0"] > 0  # node 0 is periodic: the net ran
    for hosts in (two, three):
        found = differences(alone, run_on(scenario, hosts, agents))
        assert not found, f"nodes on hosts {hosts} changed the run:\n" + "\n".join(found[:10])
    for agent in agents:  # every process the runs started on the agents has ended (hosts.cleanup)
        agent.wait_no_group_process()
