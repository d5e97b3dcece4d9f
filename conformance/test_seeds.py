"""Conformance tests for the run's seed and the seeds nodes derive from it
(spec/en/threads-and-devices.md, "Seeds and random numbers"; spec/en/state.md, state.run-seed).

A node made without ``seed=`` is seeded at the start of each run from the run's seed and its
name, so two virtual-timer runs of the same net are equal bit for bit without any seed given.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
from _seed_nodes import Pair
from _support import vt

import mujou
import mujou.testing


def _derived(seed: int, name: str) -> int:
    """threads.derived-seed, as the spec writes it."""
    digest = hashlib.blake2b(seed.to_bytes(8, "little") + name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _tree(net: Pair | None = None, **run_args: Any) -> dict[str, Any]:
    net = Pair() if net is None else net
    with mujou.run(net, timer=vt(), **run_args) as run:
        run.sleep(0.35)
        return run.state_dict()


@pytest.mark.rule("threads.run-seed", "threads.derived-seed", "sched.virtual-deterministic")
def test_two_virtual_runs_without_any_seed_are_equal_bit_for_bit() -> None:
    """> Under the virtual timer, the run's seed is 0 unless seed= gives another."""
    net = Pair()
    with mujou.run(net, timer=vt()) as run:
        assert run.seed == 0
        run.sleep(0.35)
        first = run.state_dict()
    assert net.noise.seed == _derived(0, "noise")
    assert net.quiet.seed == _derived(0, "quiet")
    mujou.testing.assert_states_equal(first, _tree())
    mujou.testing.assert_states_equal(first, _tree(seed=0))
    # The same net run again: each run seeds the nodes without a seed anew (the seeded one's
    # generator goes on from where the first run left it).
    again = _tree(net)
    for name in ("noise", "quiet"):
        mujou.testing.assert_states_equal(first[name], again[name])
    assert not torch.equal(first["noise"]["generator"], first["quiet"]["generator"])  # by name


@pytest.mark.rule("threads.derived-seed", "threads.generator")
def test_the_run_seed_reseeds_only_the_nodes_without_a_seed_of_their_own() -> None:
    """> A node given seed= keeps its generator; the run's seed does not change it."""
    one, two = Pair(), Pair()
    tree_one, tree_two = _tree(one, seed=1), _tree(two, seed=2**64 - 1)
    assert (one.noise.seed, two.noise.seed) == (_derived(1, "noise"), _derived(2**64 - 1, "noise"))
    assert one.seeded.seed == two.seeded.seed == 7
    mujou.testing.assert_states_equal(tree_one["seeded"], tree_two["seeded"])
    for name in ("noise", "quiet"):
        assert not torch.equal(tree_one[name]["generator"], tree_two[name]["generator"]), name
    # on_start drew from the derived seed: the node's first value is that seed's first draw.
    again = Pair()
    with mujou.run(again, timer=vt(), seed=1) as run:
        expected = torch.rand(4, generator=torch.Generator().manual_seed(_derived(1, "noise")))
        assert torch.equal(again.noise.value, expected)
        assert run.seed == 1


@pytest.mark.rule("threads.run-seed")
def test_the_real_time_timer_draws_a_fresh_run_seed_unless_one_is_given() -> None:
    """> Under the real-time timer, a run without seed= gets a seed drawn from fresh entropy."""
    seeds = []
    for _ in range(2):
        net = Pair()
        with mujou.run(net, workers=1) as run:
            seeds.append(run.seed)
            assert net.noise.seed == _derived(run.seed, "noise")
    assert seeds[0] != seeds[1]  # 64 random bits each: equal once in 2**64
    net = Pair()
    with mujou.run(net, workers=1, seed=seeds[0]) as run:
        assert run.seed == seeds[0]
        assert net.noise.seed == _derived(seeds[0], "noise")


@pytest.mark.rule("threads.run-seed", "run.arguments")
@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        ("1", TypeError, r"^seed must be None or an int, got str: '1'$"),
        (True, TypeError, r"^seed must be None or an int, got bool: True$"),
        (1.0, TypeError, r"^seed must be None or an int, got float: 1.0$"),
        (-1, ValueError, r"^seed must be in \[0, 2\*\*64\), got -1$"),
        (2**64, ValueError, r"^seed must be in \[0, 2\*\*64\), got 18446744073709551616$"),
    ],
)
def test_a_bad_run_seed_raises_and_starts_nothing(seed: object, error: type[Exception], message: str) -> None:
    net = Pair()
    before = net.noise.seed
    with pytest.raises(error, match=message):
        mujou.run(net, timer=vt(), seed=seed)  # type: ignore[arg-type]
    assert net.noise.seed == before  # nothing was reseeded
    with mujou.run(net, timer=vt()) as run:  # nothing was started: the net runs
        run.sleep(0.1)


@pytest.mark.rule("state.run-seed", "threads.generator-in-state")
def test_a_resumed_run_goes_on_from_the_saved_generators_whatever_its_seed() -> None:
    """> A resumed run's nodes go on from the generators' states in the tree, whatever seed=."""
    net = Pair()
    with mujou.run(net, timer=vt(), seed=5) as run:
        run.sleep(0.2)
        saved = run.state_dict()
        run.sleep(0.2)
        straight = run.state_dict()
    assert "seed" not in saved["@mujou"]
    for seed in (5, 6, None):
        with mujou.run(Pair(), timer=vt(), state=saved, seed=seed) as run:
            run.sleep(0.2)
            mujou.testing.assert_states_equal(straight, run.state_dict())


@pytest.mark.rule("threads.derived-seed", "proc.copied")
def test_a_node_in_a_process_of_its_own_derives_the_same_seed() -> None:
    """> The same in a process of its own: the node's generator is seeded as in the host's."""
    alone = _tree(seed=9)
    net = Pair()
    with mujou.run(net, timer=vt(), seed=9, processes={"far": [net.noise, net.quiet]}) as run:
        run.sleep(0.35)
        mujou.testing.assert_states_equal(alone, run.state_dict())


@pytest.mark.rule("threads.derived-seed", "run.one-run-per-net")
def test_a_run_refused_for_a_running_node_reseeds_nothing() -> None:
    """> once the run holds its nodes: a run that cannot hold them changes no generator."""
    net = Pair()
    with mujou.run(net, timer=vt()) as run:
        run.sleep(0.2)
        seed, state = net.noise.seed, net.noise.generator.get_state()
        with pytest.raises(RuntimeError, match=r"is in a run that has not ended"):
            mujou.run(net, timer=vt(), seed=3)
        assert net.noise.seed == seed
        assert torch.equal(net.noise.generator.get_state(), state)
