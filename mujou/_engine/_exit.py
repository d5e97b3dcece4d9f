"""Runs the program left running: stopped at interpreter exit, their unheard errors printed.

See run.exit-stops.
"""

from __future__ import annotations

import atexit
import sys
import threading
import traceback
from typing import Protocol


class Engine(Protocol):
    """What the exit uses of a run's engine (``_lifecycle.Engine``, which registers itself:
    a Protocol, so that this module does not import it)."""

    ended: bool
    error_reported: bool

    @property
    def error(self) -> BaseException | None: ...
    def stop(self) -> None: ...


EXIT_GRACE = 10.0  # real seconds a run is given to stop at interpreter exit
# Runs started and not yet done with: not ended, or ended with an error no call reported. A
# plain set, left by the engine itself (``_lifecycle.Engine._leave_live``): a WeakSet's
# callback, run by the garbage collector in whatever the main thread was doing, would swallow
# a KeyboardInterrupt that reached it there (run.interrupt).
live: set[Engine] = set()


@atexit.register
def _stop_live_runs() -> None:
    """At interpreter exit: stop every run the program left running, report unheard errors."""
    for engine in list(live):
        if not engine.ended:
            stopper = threading.Thread(target=_stop_quietly, args=(engine,), daemon=True)
            stopper.start()
            stopper.join(EXIT_GRACE)
        error = engine.error
        if error is not None and not engine.error_reported:
            engine.error_reported = True
            print(
                "mujou: a run ended with an error that no call on the run reported:",
                file=sys.stderr,
            )
            traceback.print_exception(error, file=sys.stderr)


def _stop_quietly(engine: Engine) -> None:
    try:
        engine.stop()
    except BaseException as exc:  # at exit: say it, do not raise it
        print(f"mujou: stopping a run at exit failed: {exc!r}", file=sys.stderr)
