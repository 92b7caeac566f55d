"""Sizes in bytes: parse what a user types, and print bytes the way PyTorch does.

Accepted sizes (:func:`parse_size`):

- a positive ``int`` of bytes: ``40_000``;
- a string with a unit: ``"512 MiB"``, ``"1.5GB"``, ``"4096 B"``, ``"2 gib"``. Binary units
  (``KiB MiB GiB TiB``) are powers of 1024, decimal units (``KB MB GB TB``) powers of 1000; the
  unit is case-insensitive. A bare number in a string is bytes.
- digits may be grouped: ``"1_000_000"`` (Python's underscores) or ``"1,000,000"`` (commas between
  groups of exactly three digits): ``"1,000"`` is one thousand bytes and ``"1,024"`` 1024 bytes, in
  the lab's API and in the dashboard's size box alike (a shape there needs brackets or ``x``:
  ``"(1, 24)"``, ``"1x24"``; see :func:`memviz.shapes.read_size`). ``"1,00"`` is refused.

Anything else — zero, negative, NaN, infinite, a float, a fraction of a byte, an unknown unit, a
digit that is not ASCII — raises :class:`~memviz.errors.SizeError` (an :class:`~memviz.errors.InputError`, so a
``ValueError``) whose message names the input, the rule and an example to follow.
"""

from __future__ import annotations

import math
import re
from numbers import Integral

from memviz.errors import SizeError
from memviz.sim import format_size  # bytes as PyTorch's OOM message prints them
from memviz.sim.constants import MiB

__all__ = ["MAX_BYTES", "GiB", "KiB", "MiB", "TiB", "format_bytes", "format_size", "parse_size"]

MAX_BYTES = (1 << 63) - 1  # a size must fit in int64, as it does for torch

KiB = MiB >> 10  # bytes in a kibibyte (MiB is the allocator's kMB, memviz.sim.constants)
GiB = MiB << 10  # bytes in a gibibyte
TiB = GiB << 10  # bytes in a tebibyte

_DECIMAL_UNITS = (("KB", 10**3), ("MB", 10**6), ("GB", 10**9), ("TB", 10**12))
_BINARY_UNITS = (("KiB", KiB), ("MiB", MiB), ("GiB", GiB), ("TiB", TiB))
_UNITS = {"b": 1, "byte": 1, "bytes": 1, **{unit.lower(): scale for unit, scale in _DECIMAL_UNITS + _BINARY_UNITS}}
_KNOWN_UNITS = ", ".join(["B", *(unit for unit, _ in _DECIMAL_UNITS + _BINARY_UNITS)])  # for error messages
_DIGITS = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+(?:_[0-9]+)*)"  # 1,000,000 or 1_000_000 or 1000000
_SIZE_RE = re.compile(rf"^\s*({_DIGITS}(?:\.[0-9]+)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")


def parse_size(size: int | str) -> int:
    """Return ``size`` as a positive whole number of bytes.

    Args:
        size: bytes as an ``int``, or a string such as ``"512 MiB"`` or ``"1.5GB"``.

    Raises:
        SizeError: zero, negative, non-integer, NaN, unknown unit, or more than ``MAX_BYTES``.
    """
    if isinstance(size, bool):
        raise SizeError(f"size must be a number of bytes or a string like '512 MiB', not {size!r}")
    if isinstance(size, Integral):
        nbytes = int(size)
    elif isinstance(size, str):
        nbytes = _parse_size_string(size)
    elif isinstance(size, float):
        if math.isnan(size) or math.isinf(size):
            raise SizeError(f"size must be a finite number of bytes, not {size!r}")
        raise SizeError(
            f"size {size!r} is a float; give whole bytes as an int, or a string with a unit like '1.5 GiB'"
        )
    else:
        raise SizeError(f"size must be an int of bytes or a string like '512 MiB', not {type(size).__name__}")
    if nbytes <= 0:
        raise SizeError(f"size must be positive, got {nbytes} bytes")
    if nbytes > MAX_BYTES:
        raise SizeError(f"size {nbytes} bytes does not fit in int64 (max {MAX_BYTES})")
    return nbytes


def _parse_size_string(text: str) -> int:
    match = _SIZE_RE.match(text)
    if match is None:
        shown = repr(text) if len(text) <= 40 else repr(text[:37]) + "..."
        if "," in text:
            parts = [p.strip() for p in text.split(",")]
            digits = all(p.isascii() and p.isdigit() for p in parts) and len(text) < 40
            shape = f"({', '.join(parts)})" if digits else ""
            raise SizeError(f"cannot read {shown} as a size: a comma separates thousands, in groups of three "
                            f"digits ('1,000', '1,048,576 B'); write a shape in brackets, e.g. {shape or '(1, 24)'}")
        raise SizeError(f"cannot read {shown} as a size; write e.g. '512 MiB', '1.5GB', '40000' or '1,000'")
    number, exponent, unit = match.groups()
    unit_key = unit.lower() or "b"
    if unit_key not in _UNITS:
        raise SizeError(f"unknown unit {unit!r} in {text!r}; known units: {_KNOWN_UNITS}")
    # Exact decimal arithmetic: "1.5GB" is exactly 1_500_000_000 bytes.
    whole, _, frac = number.replace("_", "").replace(",", "").partition(".")
    numerator = int(whole or "0") * 10 ** len(frac) + int(frac or "0")
    denominator = 10 ** len(frac)
    power = int(exponent or "0")
    if power > 30 or power < -30:
        raise SizeError(f"exponent out of range in {text!r}")
    if power >= 0:
        numerator *= 10**power
    else:
        denominator *= 10**-power
    numerator *= _UNITS[unit_key]
    if numerator % denominator:
        raise SizeError(f"{text!r} is not a whole number of bytes")
    return numerator // denominator


def format_bytes(nbytes: int) -> str:
    """Bytes for people: the largest binary unit that keeps the number at or above 1.

    ``format_bytes(134217728) == "128.00 MiB"``; ``format_bytes(512) == "512 B"``.
    """
    sign = "-" if nbytes < 0 else ""
    value = abs(nbytes)
    for unit, scale in reversed(_BINARY_UNITS):
        if value >= scale:
            return f"{sign}{value / scale:.2f} {unit}"
    return f"{sign}{value} B"
