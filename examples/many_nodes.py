"""A net of 10,000 small nodes: heat spreading over a 100 x 100 grid of cells, in real time.

Each cell is a node with a random starting temperature; twice a second it moves towards the
mean of its four neighbours (the grid wraps around at its edges). The nodes share the run's
few worker threads, not a thread each. The host prints how many updates the run makes per
second, how late they start, and how the temperatures even out.

Run it with ``python examples/many_nodes.py``.
"""

from __future__ import annotations

import time

import torch

import mujou
from mujou import Input, Net, Node, NodeList, Output

SIDE = 100  # SIDE x SIDE cells
PERIOD = 0.5  # seconds between two updates of a cell


class Cell(Node):
    west = Input()
    east = Input()
    north = Input()
    south = Input()
    temperature = Output()

    def __init__(self, seed: int) -> None:
        super().__init__(period=PERIOD, seed=seed)
        self.value = torch.rand((), generator=self.generator)

    def on_update(self, dt: float) -> None:
        around = [port.read() for port in (self.west, self.east, self.north, self.south)]
        known = [value for value in around if value is not None]
        if len(known) == 4:
            self.value += 0.2 * (torch.stack(known).sum() - 4 * self.value)
        self.temperature.send(self.value)


class Row(Net):
    def __init__(self, row: int) -> None:
        super().__init__()
        # A NodeList registers its nodes by index: they are named "rows.R.cells.C".
        self.cells = NodeList(Cell(seed=row * SIDE + column) for column in range(SIDE))


class Grid(Net):
    def __init__(self) -> None:
        super().__init__()
        self.rows = NodeList(Row(row) for row in range(SIDE))
        grid = [row.cells for row in self.rows]
        for r in range(SIDE):
            for c in range(SIDE):  # index -1 is the last one: the grid wraps around
                self.connect(grid[r][c - 1].temperature, grid[r][c].west)
                self.connect(grid[r][(c + 1) % SIDE].temperature, grid[r][c].east)
                self.connect(grid[r - 1][c].temperature, grid[r][c].north)
                self.connect(grid[(r + 1) % SIDE][c].temperature, grid[r][c].south)


def main() -> None:
    torch.set_num_threads(1)  # a process-wide setting, made by the host before mujou.run
    began = time.perf_counter()
    net = Grid()
    cells = [cell for row in net.rows for cell in row.cells]
    built = time.perf_counter()
    with mujou.run(net) as run:
        started = time.perf_counter()
        print(f"{len(cells):,} nodes, built in {built - began:.2f} s and started in {started - built:.2f} s")
        print(f"Each updates every {PERIOD} s, on {run.workers} worker thread(s):")
        print("time    updates/s   skipped   worst lateness   workers busy   temperature")
        updates, then = 0, 0.0
        for second in range(1, 5):
            run.sleep(max(0.0, second - run.time))  # until the next whole second
            stats = run.stats()
            nodes = stats.nodes.values()
            total = sum(node.updates for node in nodes)
            rate = (total - updates) / (stats.time - then)
            updates, then = total, stats.time
            late = max(node.lateness_max for node in nodes)
            busy = ", ".join(f"{fraction:.0%}" for fraction in stats.worker_busy)
            values = torch.stack(
                [value for cell in cells if (value := run.read(cell.temperature)) is not None]
            )
            print(
                f"{stats.time:3.1f} s   {rate:9,.0f}   {sum(node.skipped for node in nodes):7d}"
                f"   {late * 1e3:11.0f} ms   {busy:>12}   {values.mean():.3f} ± {values.std():.3f}"
            )
    print("All the cells are due at the same instants: the last of each burst starts later by")
    print("the time the burst takes, which is the worst lateness above.")


if __name__ == "__main__":
    main()
