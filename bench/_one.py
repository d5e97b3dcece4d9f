"""Run one workload of one system in this process and print its metrics as the last line.

``python -m bench._one SYSTEM WORKLOAD '{"param": value, ...}'``; bench/run.py starts one
such process per measurement, so that no run inherits the threads, caches or garbage of
another.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
import warnings
from typing import Any

MARKER = "BENCH-RESULT "

SYSTEMS = {
    "mujou": "bench.mujou_system",
    "mujou_processes": "bench.mujou_processes",
    "mujou_record": "bench.mujou_record",
    "mujou_record_read": "bench.record_read",
    "mujou_replay": "bench.mujou_replay",
    "mujou_hosts": "bench.mujou_hosts",
    "torch_mp": "bench.baselines.torch_mp_peer",
    "asyncio": "bench.baselines.asyncio_tasks",
    "threads": "bench.baselines.thread_per_node",
    "heap_pool": "bench.baselines.heap_pool",
    "ezmsg": "bench.baselines.ezmsg_peer",
    "floor": "bench.baselines.floor",
    "holoscan": "bench.baselines.holoscan_peer",
}


def main(argv: list[str]) -> int:
    system, workload, params = argv[0], argv[1], json.loads(argv[2])
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    began = time.perf_counter()
    result: dict[str, Any]
    try:
        from ._common import setup_torch

        setup_torch()
        module = importlib.import_module(SYSTEMS[system])
        metrics = getattr(module, workload)(**params)
        result = {"ok": True, "metrics": metrics}
    except Exception as exc:
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["process_seconds"] = time.perf_counter() - began
    print(MARKER + json.dumps(result), flush=True)
    sys.stderr.flush()
    # Leave at once: the threads of some systems (a thread per node at N=10,000) take
    # minutes to wind down, and nothing is measured after this point.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
