"""``python -m mujou serve``: the agent of a host that runs groups of other hosts' runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._address import SECRET_VARIABLE, secret_bytes


def add_serve_command(commands: Any) -> None:
    """Add ``serve`` to the command line's subcommands."""
    serve = commands.add_parser(
        "serve",
        help="run the groups that runs on other hosts place here (mujou.OnHost)",
        description=(
            "Listen for runs whose groups are placed on this host with mujou.OnHost, and start a "
            "process for each. Only a run that knows the secret (the environment variable "
            f"{SECRET_VARIABLE}, or --secret-file) is served."
        ),
    )
    serve.add_argument(
        "--listen",
        default="127.0.0.1:29400",
        metavar="HOST:PORT",
        help="the address to listen on (default 127.0.0.1:29400; port 0: any free port; "
        "0.0.0.0:PORT to be reached from other machines)",
    )
    serve.add_argument(
        "--secret-file", metavar="PATH", help=f"a file holding the secret (else ${SECRET_VARIABLE})"
    )
    serve.add_argument("--once", action="store_true", help="exit once the first run's process here has ended")


def serve_command(args: argparse.Namespace) -> int:
    """Run the agent until interrupted (or, with --once, until its run ended)."""
    from ._agent import Agent

    try:
        secret = None
        if args.secret_file is not None:
            with open(args.secret_file, "rb") as file:
                secret = file.read().strip()
        key = secret_bytes(secret, "python -m mujou serve")
        agent = Agent(args.listen, key, once=args.once)
    except (OSError, ValueError, TypeError) as exc:
        print(f"python -m mujou serve: {exc}", file=sys.stderr)
        return 2
    print(f"mujou agent listening on {agent.address}", flush=True)
    try:
        agent.serve()
    except KeyboardInterrupt:
        return 130
    return 0
