"""Instructions of one virtual tag's instant on one side of a span, under callgrind, without
processes: ``Member.instant`` (the tag's start, its worker updates, its commit and the next
due time) over a net of one periodic node, run as the host's ``mujou-lockstep`` runs it (the
calling thread lent to the instants) or as a process's command thread does (worker 0 while it
waits), the instrumentation on around the measured tags only.

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT/cg.%p \\
      python -m bench.instant_callgrind host|process [--general] [--empty] [TAGS]

prints the instructions a tag (the ``totals:`` of the one file, divided by TAGS: 300 unless
given). ``--general``: the instant's general way (NOTE [ an instant run alone ] in
``mujou/_engine/_instants.py``), for the comparison; ``--empty``: the node's ``on_update`` does
nothing (else it reads its own last message and sends the next, as tags-virtual-2p's nodes).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch

import mujou
from bench._callgrind import helper
from mujou import Input, Net, Node, Output
from mujou._engine import Engine, HookThread
from mujou._processes._member import Member

WARM = 100  # tags before the measured ones: CPython specializes a function after 8 calls


class Counter(Node):
    """Periodic: sends its count, read back from its own output (``--empty``: nothing)."""

    x = Input()
    y = Output()

    def __init__(self, empty: bool) -> None:
        super().__init__(period=0.01, seed=0)
        self.empty = empty

    def on_update(self, dt: float) -> None:
        if self.empty:
            return
        x = self.x.read()
        self.y.send(torch.tensor(1.0 if x is None else float(x) + 1.0))


class Loop(Net):
    def __init__(self, empty: bool) -> None:
        super().__init__()
        self.node = Counter(empty)
        self.connect(self.node.y, self.node.x)


def _tags(lent: bool, empty: bool, tags: int, callgrind: Any) -> None:
    net = Loop(empty)
    engine = Engine(list(net.nodes()), 1, mujou.VirtualTimer(), None, lent=lent)
    engine.claim()
    member = Member(engine, list(net.nodes()), {}, [])
    member.connect_standins()
    member.start(None)
    member.go(None, {}, [])
    if not lent:
        member.lend()  # as the host's lockstep thread does for a span
    member.begin_advance()
    due = member.next_due()
    for _ in range(WARM):
        due = member.instant(due)[2]
    callgrind.cg_instrument()
    for _ in range(tags):
        due = member.instant(due)[2]
    callgrind.cg_instrument_off()
    if not lent:
        member.unlend()
    member.stop()


def main(argv: list[str]) -> None:
    side = argv[0]
    if "--general" in argv:
        Member._alone = lambda self, lends: None  # type: ignore[method-assign]  # the general way
    numbers = [int(arg) for arg in argv if re.fullmatch(r"\d+", arg)]
    tags = numbers[0] if numbers else 300
    torch.set_num_threads(1)
    callgrind = helper()
    empty = "--empty" in argv
    if side == "process":  # the command thread: a HookThread named as worker 0
        thread = HookThread(target=_tags, args=(True, empty, tags, callgrind), name="mujou-worker-0")
        thread.start()
        thread.join()
    else:
        _tags(False, empty, tags, callgrind)
    print("TAGS", tags)


if __name__ == "__main__":
    main(sys.argv[1:])
