"""Argument checks for the strategies: every message names the argument, its value and the fix."""

from __future__ import annotations

import math


class InvalidArgument(ValueError):
    """A strategy was called with arguments that cannot describe any input."""


def check_int(name, value, *, low=None):
    """value is an int (not a bool) and at least `low`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if low is not None and value < low:
        raise InvalidArgument(f"{name}={value!r} must be at least {low}")


def check_float(name, value, *, low=None, positive=False):
    """value is a finite real number, positive if asked, at least `low` if given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{name}={value!r} must be a finite number")
    if positive and value <= 0:
        raise InvalidArgument(f"{name}={value!r} must be positive")
    if low is not None and value < low:
        raise InvalidArgument(f"{name}={value!r} must be at least {low}")


def check_order(min_name, min_value, max_name, max_value):
    """min_value <= max_value, else a message that names both."""
    if min_value > max_value:
        raise InvalidArgument(f"{min_name}={min_value!r} is larger than {max_name}={max_value!r}; lower {min_name} or raise {max_name}")


def check_int_range(prefix, min_value, max_value, *, low):
    """min_<prefix> and max_<prefix> are ints >= low with min <= max."""
    check_int(f"min_{prefix}", min_value, low=low)
    check_int(f"max_{prefix}", max_value, low=low)
    check_order(f"min_{prefix}", min_value, f"max_{prefix}", max_value)


def check_choice(name, value, choices):
    if value not in choices:
        raise InvalidArgument(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")
