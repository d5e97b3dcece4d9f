"""Run by conformance/test_hosts.py under torchrun: the same program on every rank.

Rank 0 runs :class:`Chain` in one process, then with its ``left`` group on rank 1, and prints
whether the two state trees are identical; rank 1 serves its group and ends.
"""

from __future__ import annotations

import os
from typing import Any

from _process_nodes import Chain

import mujou
from mujou.testing import state_difference


def tree(placed: bool) -> dict[str, Any]:
    net = Chain()
    processes = {"g1": mujou.OnHost(net.left, rank=1)} if placed else None
    with mujou.run(net, timer=mujou.VirtualTimer(), workers=1, processes=processes) as run:
        run.sleep(1.0)
        return run.state_dict()


if __name__ == "__main__":
    mujou.serve_ranks()  # rank 1 serves here, then ends
    alone = tree(placed=False)
    placed = tree(placed=True)
    print(f"rank {os.environ['RANK']}: identical: {state_difference(alone, placed) is None}", flush=True)
