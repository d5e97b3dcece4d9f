"""A run launched by ``torchrun``: rank 0 runs the user's program, every other rank serves the
groups placed on it (hosts.torchrun).

Every rank calls ``mujou.serve_ranks()`` first. On rank 0 it returns at once, having opened
the rendezvous store of torchrun's ``MASTER_ADDR:MASTER_PORT`` (the default process group's
store when the program already made one). On any other rank it starts an agent
(``_agent.Agent``) on this machine's address on the route to ``MASTER_ADDR``, on a free port,
writes that address in the store under the rank's key, serves until rank 0's program ends (or
its run's process here ended), and ends the rank's program (``SystemExit(0)``).
``mujou.OnHost(group, rank=r)`` on rank 0 takes rank ``r``'s address from the store.
"""

from __future__ import annotations

import atexit
import datetime
import os
import threading
from typing import Any

from ._address import secret_bytes

STORE_TIMEOUT = 120.0  # real seconds a rank waits for the others at the rendezvous store
_KEY = "mujou/agent/{rank}"
_END = "mujou/end"

_STORE: dict[str, Any] = {}  # rank 0's: under "store", where the agents' addresses are read


def torchrun_rank() -> tuple[int, int] | None:
    """This process's rank and the world's size under torchrun, None elsewhere."""
    rank, size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or size is None or "MASTER_ADDR" not in os.environ:
        return None
    return int(rank), int(size)


def serve_ranks() -> None:
    """Under ``torchrun``: on rank 0, return; on the other ranks, serve the groups that rank 0's
    run places there, then end the program. Elsewhere, return. See :ref:`hosts.torchrun`."""
    found = torchrun_rank()
    if found is None:
        return
    rank, _ = found
    store = _open_store(rank)
    if rank == 0:
        _STORE["store"] = store
        atexit.register(store.set, _END, "1")
        return
    from ._agent import Agent
    from ._plane import _route_to

    secret = secret_bytes(None, "mujou.serve_ranks() under torchrun")
    here = _route_to(f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    agent = Agent(f"{here}:0", secret)
    store.set(_KEY.format(rank=rank), agent.address)
    threading.Thread(target=_stop_at_end, args=(store, agent), name="mujou-rank-end", daemon=True).start()
    agent.serve()
    raise SystemExit(0)


def agent_address(rank: int) -> str:
    """Rank ``rank``'s agent (on rank 0, after ``serve_ranks``)."""
    store = _STORE.get("store")
    if store is None:
        raise RuntimeError(
            f"mujou.OnHost(rank={rank}) needs the program to run under torchrun and to call "
            "mujou.serve_ranks() first, on every rank"
        )
    value: bytes = store.get(_KEY.format(rank=rank))
    return value.decode()


def _open_store(rank: int) -> Any:
    from torch import distributed
    from torch._C._distributed_c10d import TCPStore

    if distributed.is_initialized():
        return distributed.distributed_c10d._get_default_store()
    return TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=rank == 0,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=STORE_TIMEOUT),
    )


def _stop_at_end(store: Any, agent: Any) -> None:
    """Stop the agent once rank 0's program ended (or the store is gone with it)."""
    while True:
        try:
            store.wait([_END], datetime.timedelta(seconds=1))
            break
        except Exception as exc:  # the wait's timeout: look again; the store gone: stop
            if "timeout" not in str(exc).lower() and "Wait timeout" not in str(exc):
                break
    agent.stop()
