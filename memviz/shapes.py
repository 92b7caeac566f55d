"""Tensor shapes and dtypes: how many bytes a tensor asks the allocator for, with the arithmetic shown.

``tensor_request((2048, 4096, 4096), "float32")`` is 128 GiB, not the "0.5 GB" the seed article
claimed: :class:`Request` keeps the arithmetic (``numel × element size``) so a lesson can print it.
Works without torch; a ``torch.dtype`` is accepted too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from numbers import Integral

from memviz.errors import SizeError
from memviz.units import MAX_BYTES, format_bytes, parse_size

__all__ = ["DTYPE_SIZES", "Request", "dtype_name", "read_size", "size_request", "tensor_request"]

DTYPE_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complex128": 16, "complex64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
"""Bytes per element of each dtype, by torch's canonical name."""

_ALIASES = {
    "double": "float64", "float": "float32", "half": "float16", "bf16": "bfloat16",
    "fp64": "float64", "fp32": "float32", "fp16": "float16",
    "long": "int64", "int": "int32", "short": "int16", "cfloat": "complex64", "cdouble": "complex128",
}  # fmt: skip


def dtype_name(dtype: object) -> str:
    """Canonical name of ``dtype``: a name such as ``"float32"``/``"half"`` or a ``torch.dtype``.

    Raises:
        ValueError: an unknown dtype, naming the known ones.
    """
    text = str(dtype)
    name = text.removeprefix("torch.").lower()
    name = _ALIASES.get(name, name)
    if name not in DTYPE_SIZES:
        known = ", ".join(DTYPE_SIZES)
        raise ValueError(f"unknown dtype {text!r}; known dtypes: {known}")
    return name


@dataclass(frozen=True)
class Request:
    """One tensor's request to the allocator.

    Attributes:
        nbytes: bytes requested (``numel × element_size``), before the allocator rounds it.
        shape: the tensor's shape; ``(nbytes,)`` for a request made by size.
        dtype: canonical dtype name; ``"uint8"`` for a request made by size.
    """

    nbytes: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        """Number of elements."""
        return self.nbytes // DTYPE_SIZES[self.dtype]

    @property
    def arithmetic(self) -> str:
        """The size worked out, e.g. ``2048 × 4096 × 4096 × 4 B (float32) = 137,438,953,472 B = 128.00 GiB``."""
        item = DTYPE_SIZES[self.dtype]
        if self.dtype == "uint8" and len(self.shape) == 1:
            return f"{self.nbytes:,} B = {format_bytes(self.nbytes)}"
        dims = " × ".join(str(d) for d in self.shape)
        return f"{dims} × {item} B ({self.dtype}) = {self.nbytes:,} B = {format_bytes(self.nbytes)}"


def tensor_request(shape: tuple[int, ...] | list[int] | int, dtype: object = "float32") -> Request:
    """The request a tensor of ``shape`` and ``dtype`` makes (default dtype float32, as torch's).

    Raises:
        ValueError: a dimension that is not a positive int, an unknown dtype, or a size over int64.
    """
    dims = (shape,) if isinstance(shape, Integral) and not isinstance(shape, bool) else shape
    if not isinstance(dims, tuple | list) or not dims:
        raise ValueError(f"shape must be a non-empty tuple of positive ints, not {shape!r}")
    checked = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, Integral):
            raise ValueError(f"shape {tuple(dims)!r} has a non-integer dimension {d!r}")
        if d <= 0:
            raise ValueError(f"shape {tuple(dims)!r} has dimension {d}; every dimension must be positive")
        checked.append(int(d))
    name = dtype_name(dtype)
    nbytes = DTYPE_SIZES[name]
    for d in checked:
        nbytes *= d
    if nbytes > MAX_BYTES:
        raise SizeError(f"shape {tuple(checked)} of {name} is {nbytes} bytes, more than int64 can hold")
    return Request(nbytes, tuple(checked), name)


def size_request(size: int | str) -> Request:
    """The request for ``size`` bytes (``"512 MiB"``, ``"1.5GB"``, ``40_000``), as a uint8 tensor."""
    nbytes = parse_size(size)
    return Request(nbytes, (nbytes,), "uint8")


_DIM = r"[0-9]+(?:_[0-9]+)*"
_TIMES_RE = re.compile(rf"^{_DIM}(?:\s*[x×*]\s*{_DIM})+$")
_CLOSE = {"(": ")", "[": "]"}


def read_size(text: str) -> int | tuple[int, ...]:
    """What a typed size means: a shape (a tuple of dimensions) or a number of bytes (an int).

    The one reading of a size for the lab's API (``Lab.allocate("(100, 100)")``) and the dashboard's size
    box. A shape is in brackets, its dimensions separated by commas as in Python (``"(2048, 4096)"``,
    ``"[8]"``, ``"(7,)"``), or joined by ``x``, ``×`` or ``*`` (``"100x100"``, ``"2048 × 4096"``). Anything
    else is bytes for :func:`memviz.units.parse_size`: ``"512 MiB"``, ``"40000"``, and ``"1,024"`` (a
    thousands separator: 1024 bytes, not a 1 × 24 shape).

    Raises:
        SizeError: an unclosed or unmatched bracket, a dimension that is not a positive whole number
            (``"(1, two)"``, ``"(1,024)"``: no leading zeros, as in Python), or a bad size.

    >>> read_size("(2048, 4096)"), read_size("100x100"), read_size("1,024"), read_size("2 KiB")
    ((2048, 4096), (100, 100), 1024, 2048)
    """
    if not isinstance(text, str):
        raise SizeError(f"a typed size must be a str such as '512 MiB' or '(100, 100)', not {type(text).__name__}")
    t = text.strip()
    shown = repr(t) if len(t) <= 40 else repr(t[:37]) + "..."
    opening = t[:1]
    if opening in _CLOSE:
        if not t.endswith(_CLOSE[opening]):
            raise SizeError(f"unclosed {opening!r} in {shown}: a shape is written {opening}2048, 4096{_CLOSE[opening]}")
        parts = [p.strip() for p in t[1:-1].split(",")]
        if len(parts) > 1 and parts[-1] == "":  # "(7,)": Python's one-element tuple
            parts.pop()
        if parts == [""]:
            raise SizeError(f"cannot read {shown} as a shape: it is empty; give at least one dimension, e.g. "
                            "(2048, 4096) or [8]")
        return tuple(_dimension(p, shown) for p in parts)
    if t[-1:] in (")", "]") or "(" in t or "[" in t:
        raise SizeError(f"unmatched bracket in {shown}: a shape is written (2048, 4096)")
    if _TIMES_RE.match(t):
        return tuple(_dimension(p.strip(), shown) for p in re.split(r"[x×*]", t))
    return parse_size(t)


def _dimension(part: str, shown: str) -> int:
    """One dimension of a typed shape: a positive whole number, digits in ASCII, no leading zero."""
    if not re.fullmatch(_DIM, part) or (part[0] == "0" and part.strip("0_") != ""):
        example = "(1, 24)" if "," in shown else "(2048, 4096)"
        raise SizeError(f"cannot read {shown} as a shape: {part!r} is not a dimension (each is a positive whole "
                        f"number without a leading zero, e.g. {example})")
    dim = int(part.replace("_", ""))
    if dim <= 0:
        raise SizeError(f"shape {shown} has dimension {dim}; every dimension must be positive")
    return dim
