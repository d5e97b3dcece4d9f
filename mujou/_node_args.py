"""The checks of ``Node``'s arguments: period (or none, with a trigger), seed, min_interval, delay.

See threads.argument-errors, trigger.arguments and run.number-arguments.
"""

from __future__ import annotations

import math

from ._numbers import non_negative, positive, shown
from ._trigger import Trigger

SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds in [0, 2**64)


class _DefaultPeriod(float):
    """The default ``period``, 0.01, told apart from a period the caller gave: with a
    trigger, a node given no period is triggered only (trigger.period-none)."""


DEFAULT_PERIOD = _DefaultPeriod(0.01)


def check_period(period: object, trigger: Trigger | None) -> float:
    """The node's period in seconds; inf for a node that is triggered only."""
    if period is None or (period is DEFAULT_PERIOD and trigger is not None):
        if trigger is None:
            raise ValueError(
                "period must be a finite number of seconds > 0, or None for a node with a "
                "trigger; got None, and this node has no trigger: give it a period, or a "
                "trigger (trigger=mujou.on('x'))"
            )
        return math.inf
    return positive("period", period)  # run.number-arguments


def period_from_rate(period: object, rate: object) -> object:
    """The period to check: ``period``, or ``1 / rate`` when the node gives ``rate=`` (Hz) instead.

    See threads.rate.
    """
    if rate is None:
        return period
    if period is not DEFAULT_PERIOD:
        raise TypeError(
            f"give period= (seconds between updates) or rate= (updates per second, Hz), not "
            f"both; got period={shown(period)} and rate={shown(rate)}"
        )
    hertz = positive("rate", rate, unit=" of hertz")
    if not math.isfinite(1.0 / hertz):
        raise ValueError(f"rate must be a number of hertz whose period 1/rate is finite, got {shown(rate)}")
    return 1.0 / hertz


def check_trigger_timing(name: str, value: object, trigger: Trigger | None) -> float:
    seconds = non_negative(name, value)
    if seconds and trigger is None:
        raise ValueError(
            f"{name}={seconds!r} applies to triggered updates, and this node has no trigger: "
            "give it a trigger (trigger=mujou.on('x')) or leave out "
            f"{name}"
        )
    return seconds


def check_seed(seed: object) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be None or an int, got {type(seed).__name__}: {seed!r}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64), got {seed!r}")
    return seed
