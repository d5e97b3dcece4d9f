"""``python -m mujou``: ``info`` (what Mujou's defaults will be on this machine, and why),
``--version`` and ``--help``.

See :ref:`observe.info`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import sysconfig
from typing import Any

import torch

from ._cpus import affinity_cpus, default_workers, gil_enabled, physical_cores, quota_cpus, usable_cpus
from ._engine import _update
from ._hosts._cli import add_serve_command, serve_command
from ._record import _cli as record_cli
from ._trace_view import add_trace_command, trace_command
from ._version import __version__

PROG = "python -m mujou"


def compiled_engine() -> bool:
    """Whether the engine's per-update path was loaded from an extension module that mypyc built
    (``MUJOU_COMPILE=1`` at install, see setup.py) rather than from its Python source."""
    return not (_update.__file__ or "").endswith(".py")


def machine_info() -> dict[str, Any]:
    """The facts ``info`` prints, as a JSON-ready dict."""
    gil = gil_enabled()
    usable = usable_cpus()
    cores = physical_cores()
    workers = default_workers(sys.maxsize, cpus=usable, gil=gil)
    reason = f"{usable} usable CPU(s)" + (", halved while the GIL is enabled" if gil else "")
    threads = torch.get_num_threads()
    if workers * threads > cores:
        advice = (
            f"{workers} worker(s) x {threads} torch thread(s) exceed the {cores} physical core(s): "
            "call torch.set_num_threads(1) before mujou.run"
        )
    else:
        advice = (
            f"{workers} worker(s) x {threads} torch thread(s) fit the {cores} physical core(s); "
            "count each dedicated_thread node as one more worker"
        )
    devices = (
        [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "mujou": __version__,
        "compiled_engine": compiled_engine(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "gil_enabled": gil,
        "affinity_cpus": len(affinity_cpus()),
        "quota_cpus": quota_cpus(),
        "usable_cpus": usable,
        "physical_cores": cores,
        "default_workers": workers,
        "default_workers_reason": reason,
        "torch": torch.__version__,
        "torch_threads": threads,
        "advice": advice,
        "cuda_devices": devices,
    }


def render(info: dict[str, Any]) -> str:
    """The facts as the lines a person reads."""
    build = "free-threaded build" if info["free_threaded_build"] else "build with the GIL"
    quota = "no CPU quota" if info["quota_cpus"] is None else f"a CPU quota of {info['quota_cpus']}"
    cuda = ", ".join(info["cuda_devices"]) or "none"
    gil = "enabled" if info["gil_enabled"] else "disabled"
    engine = "compiled with mypyc (MUJOU_COMPILE=1)" if info["compiled_engine"] else "pure Python"
    return "\n".join(
        [
            f"Mujou           {info['mujou']}",
            f"engine          {engine}",
            f"Python          {info['python']} ({build}); GIL {gil}",
            f"CPUs            {info['usable_cpus']} usable: {info['affinity_cpus']} in the affinity, {quota}",
            f"physical cores  {info['physical_cores']}",
            f"default workers {info['default_workers']} ({info['default_workers_reason']}; "
            "never more than the nodes on workers)",
            f"torch           {info['torch']}, {info['torch_threads']} intra-op thread(s)",
            f"advice          {info['advice']}",
            f"CUDA devices    {cuda}",
        ]
    )


def parser() -> argparse.ArgumentParser:
    """The command line: ``--help`` and ``--version`` exit 0; a wrong argument exits 2."""
    top = argparse.ArgumentParser(
        prog=PROG,
        description="Mujou: nets of PyTorch nodes that update asynchronously, each at its own period.",
    )
    top.add_argument("--version", action="version", version=f"mujou {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    info = commands.add_parser(
        "info",
        help="what Mujou will do on this machine, and why",
        description=(
            "Print Mujou's version, the Python build and whether the GIL is enabled, the CPUs "
            "the process may use, the physical cores, the default number of workers and why, "
            "torch's intra-op threads with advice, and the CUDA devices."
        ),
    )
    info.add_argument("--json", action="store_true", help="print the same as one JSON object, for scripts")
    add_trace_command(commands)
    record_cli.add_commands(commands)
    add_serve_command(commands)
    return top


def main(argv: list[str]) -> int:
    """Run the command line; return the exit status."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as stop:  # --help, --version (0) or a wrong argument (2, after the usage)
        return 0 if stop.code is None else int(stop.code)
    if args.command == "trace":
        return trace_command(args)
    if args.command == "record":
        return record_cli.run(args)
    if args.command == "serve":
        return serve_command(args)
    info = machine_info()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0
