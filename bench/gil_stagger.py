"""Under the GIL, how far apart updates due together start when their hooks wait outside it.

    python bench/gil_stagger.py [--workers 8] [--seconds 2]

Eight nodes of period 20 ms each sleep 2 ms in ``on_update`` (a hook blocked in I/O); on
eight workers they should all start at once. Prints the median and p90, over the ticks, of
the spread between the first and the last start of one tick (defect 10 of the engine issue:
8.3 ms with the first engine, where a free worker left due work to one in its hook for 1 ms).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import mujou


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # more workers than CPUs: the point here
    torch.set_num_threads(1)
    starts: dict[int, list[float]] = {}

    class Waits(mujou.Node):
        def __init__(self) -> None:
            super().__init__(period=0.02, seed=0)
            self.updates = 0

        def on_update(self, dt: float) -> None:
            starts.setdefault(self.updates, []).append(time.perf_counter())
            self.updates += 1
            time.sleep(0.002)

    class Net(mujou.Net):
        def __init__(self) -> None:
            super().__init__()
            for i in range(args.workers):
                setattr(self, f"n{i}", Waits())

    with mujou.run(Net(), workers=args.workers) as run:
        run.sleep(args.seconds)
    spreads = sorted((max(v) - min(v)) * 1e3 for k, v in starts.items() if len(v) == args.workers and k > 2)
    p90 = spreads[int(0.9 * len(spreads))]
    print(
        f"{args.workers} updates due together, each hook waiting 2 ms outside the GIL: start "
        f"spread median {statistics.median(spreads):.2f} ms, p90 {p90:.2f} ms over {len(spreads)} ticks"
    )


if __name__ == "__main__":
    main()
