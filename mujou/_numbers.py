"""The checks of numeric arguments: periods, scales, sleeps and timeouts.

Every argument that is a duration or a rate takes any real number (``int``, ``float``,
``fractions.Fraction``, NumPy's scalars: whatever is a :class:`numbers.Real`), ``bool``
excluded, and is converted to a ``float`` once, here. A value that is not a real number is a
``TypeError``; one that is not finite, out of range, or too large for a float (``10**400``) is a
``ValueError``. Each message names the argument, the value and what is allowed. See
:ref:`run.number-arguments`.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal

SHOWN = 80  # characters of a value's repr an error message shows at most


def positive(name: str, value: object, *, unit: str = " of seconds", optional: bool = False) -> float:
    """``value`` as a float, for an argument that must be a finite real number > 0.

    ``optional`` only words the error: the caller takes ``None`` itself.
    """
    return _checked(name, value, "> 0", unit, optional=optional)


def non_negative(name: str, value: object, *, optional: bool = False) -> float:
    """``value`` as a float, for a number of seconds that must be finite and >= 0.

    ``optional`` only words the error: the caller takes ``None`` itself.
    """
    return _checked(name, value, ">= 0", " of seconds", optional=optional)


def _checked(name: str, value: object, bound: Literal["> 0", ">= 0"], unit: str, *, optional: bool) -> float:
    if value.__class__ is float and 0.0 < value < math.inf:  # the common case, at once
        return value
    allowed = f"{unit} {bound}" + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number{allowed}, got {type(value).__name__}: {shown(value)}")
    try:
        number = float(value)
    except (OverflowError, ValueError):  # 10**400, Fraction(10**400, 3): beyond a float
        raise ValueError(
            f"{name} must be a finite number{allowed}, got {shown(value)}, which is too large for a float"
        ) from None
    if not math.isfinite(number) or number < 0 or (bound == "> 0" and number == 0):
        rounded = " (0.0 as a float)" if number == 0 and value != 0 else ""
        raise ValueError(f"{name} must be a finite number{allowed}, got {shown(value)}{rounded}")
    return number


def shown(value: object) -> str:
    """``repr(value)`` for an error message: cut to :data:`SHOWN` characters.

    An int too long for ``repr`` (over ``sys.get_int_max_str_digits()`` digits) shows its
    size instead.
    """
    try:
        text = repr(value)
    except ValueError:
        if isinstance(value, int):
            return f"an int of {value.bit_length()} bits"
        raise
    if len(text) <= SHOWN:
        return text
    return f"{text[: SHOWN - 20]}...{text[-10:]} ({len(text)} characters)"
