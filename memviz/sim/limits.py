"""The numbers memviz.sim and memviz.snapshots accept: one check of every number's type and range.

Every public entry point that takes a byte count, a fraction or an index (``CachingAllocator``,
``malloc``, ``free``, ``set_memory_fraction``, ``replay`` / ``what_if``, ``SnapshotHistory``) checks it
here, so one rule holds everywhere and every refusal reads the same way: the input's name, the rule,
what was given and what to pass instead. An ``int`` subclass or anything with ``__index__`` (a numpy
integer) counts as an int; ``bool`` does not, and neither does a float, even a whole one.

The designed limit is :data:`MAX_DEVICE_BYTES`: the simulator models the driver's 47-bit virtual
address space (``memviz.sim.addresses``), with ``cudaMalloc`` ranges in its upper half and expandable
segments' reservations in its lower half; a device of at most 16 TiB fits either half several times
over, so every address the simulator hands out is positive and below 2**47.
"""

from __future__ import annotations

import math
import operator

from memviz.errors import InputError, InputTypeError

__all__ = ["INT64_MAX", "MAX_DEVICE_BYTES", "check_bytes", "check_fraction", "check_index", "fraction_for_cap"]

MAX_DEVICE_BYTES = 1 << 44  # 16 TiB: the largest simulated device (about 57 H200s)
INT64_MAX = (1 << 63) - 1  # torch's stats and snapshots hold int64


def _as_int(value: object, name: str, unit: str, example: str) -> int:
    if isinstance(value, (bool, float)) or not hasattr(type(value), "__index__"):
        shown = f"{type(value).__name__} {value!r}"
        hint = ("parse text such as '2 GiB' with memviz.units.parse_size first" if isinstance(value, str)
                else f"pass a whole number, e.g. {example}")
        raise InputTypeError(f"{name} must be an int ({unit}), not {shown}: {hint}")
    return operator.index(value)


def check_bytes(value: object, name: str, *, low: int = 0, high: int = INT64_MAX, example: str = "2 << 30",
                why: str = "") -> int:
    """Return ``value`` as an int number of bytes in ``[low, high]``; ``why`` is added to a range error.

    Raises:
        InputTypeError: not an int (a bool, float, str or None).
        InputError: outside ``[low, high]``.

    >>> check_bytes(1 << 30, "cap_bytes", low=1)
    1073741824
    >>> check_bytes(1.5, "cap_bytes", low=1)
    Traceback (most recent call last):
    ...
    memviz.errors.InputTypeError: cap_bytes must be an int (bytes), not float 1.5: pass a whole number, e.g. 2 << 30
    """
    n = _as_int(value, name, "bytes", example)
    if not low <= n <= high:
        raise InputError(f"{name} must be between {low:,} and {high:,} bytes, got {n:,}" + (f": {why}" if why else ""))
    return n


def check_index(value: object, name: str, *, low: int = 0, high: int = INT64_MAX, what: str = "") -> int:
    """Return ``value`` as an int in ``[low, high]`` (an index or a count); ``what`` says what it counts."""
    n = _as_int(value, name, what or "an index", str(low))
    if not low <= n <= high:
        raise InputError(f"{name} must be from {low} to {high}{' ' + what if what else ''}, got {n}")
    return n


def check_fraction(value: object, name: str) -> float:
    """Return ``value`` as a float in ``[0, 1]`` (a memory fraction).

    Raises:
        InputTypeError: not a real number (a bool, str or None).
        InputError: NaN, or outside ``[0, 1]``.
    """
    if isinstance(value, bool) or not hasattr(type(value), "__float__"):
        raise InputTypeError(f"{name} must be a number in [0, 1], not {type(value).__name__} {value!r}")
    f = float(value)  # type: ignore[arg-type]
    if not 0.0 <= f <= 1.0:  # also refuses NaN
        raise InputError(f"{name} must be in [0, 1] (a share of the device's memory), got {value!r}")
    return f


def fraction_for_cap(cap_bytes: int | None, total_bytes: int) -> float | None:
    """The memory fraction ``f`` whose limit ``int(f * total_bytes)`` is ``cap_bytes``, or the nearest below.

    ``set_per_process_memory_fraction(f)`` limits the cache to ``int(f * total)`` bytes; ``cap / total``
    in floating point can land one ulp short (the limit is then a byte below the cap), so it is stepped
    up with ``math.nextafter`` until the limit reaches the cap. For devices above 2**53 bytes no fraction
    below 1 may give the cap exactly; then the largest fraction whose limit stays at or below the cap is
    returned, so a cap always caps (1.0, no cap, only for ``cap_bytes == total_bytes``).

    Returns None for None (no cap).

    Raises:
        InputTypeError / InputError: a cap that is not an int from 1 to ``total_bytes``.

    >>> fraction_for_cap(2 << 30, 80 << 30)
    0.025
    >>> f = fraction_for_cap(2**62 - 1, 2**62); f < 1.0 and int(f * 2**62) <= 2**62 - 1
    True
    """
    if cap_bytes is None:
        return None
    cap = check_bytes(cap_bytes, "cap", low=1, high=total_bytes, example="2 << 30")
    if cap == total_bytes:
        return 1.0
    fraction = cap / total_bytes
    while fraction < 1.0 and int(fraction * total_bytes) < cap:
        fraction = math.nextafter(fraction, 2.0)
    while fraction >= 1.0 or int(fraction * total_bytes) > cap:
        fraction = math.nextafter(fraction, 0.0)
    return fraction
