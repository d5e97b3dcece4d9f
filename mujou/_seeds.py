"""The run's seed, and the seeds the nodes without one derive from it by their names.

A node given ``seed=`` keeps its generator; every other node's generator is seeded at the start
of each run from the run's seed and the node's name, so that a run is reproducible from one
number (threads.run-seed, threads.derived-seed).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

from ._node import Node
from ._node_args import check_seed
from ._timer import Timer, VirtualTimer

VIRTUAL_SEED = 0  # the run seed under the virtual timer when none is given (threads.run-seed)


def run_seed(seed: object, timer: Timer) -> int:
    """The run's seed: ``seed`` checked, else 0 under the virtual timer, else fresh entropy."""
    checked = check_seed(seed)
    if checked is not None:
        return checked
    return VIRTUAL_SEED if isinstance(timer, VirtualTimer) else secrets.randbits(64)


def derived_seed(seed: int, name: str) -> int:
    """The seed of the node named ``name`` that has none of its own, in a run seeded ``seed``.

    The 8-byte BLAKE2b digest of the run seed as 8 little-endian bytes followed by the node's
    name in UTF-8, read as a little-endian integer: the same in every process, on every machine
    and Python version (``hash()`` is salted per process). See threads.derived-seed.
    """
    data = seed.to_bytes(8, "little") + name.encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def seed_nodes(nodes: Iterable[Node], seed: int) -> None:
    """Seed the generator of each node made without ``seed=`` from the run's ``seed``.

    Called once the run owns the nodes and before any hook runs, so that ``on_start`` draws
    from the derived seed; a restored state then replaces the generator's state.
    """
    for node in nodes:
        core = node._mujou
        if not core.own_seed:
            core.seed = derived_seed(seed, node.name)
            core.generator.manual_seed(core.seed)
