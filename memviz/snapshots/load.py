"""Load a memory snapshot safely: a restricted unpickler plus a shape check.

``torch.cuda.memory._dump_snapshot()`` writes ``pickle.dump(torch.cuda.memory._snapshot())``. A
pickle can name any importable callable and call it while loading, so an untrusted ``.pickle`` is a
program, not a file. :func:`load_snapshot` reads it with an unpickler whose ``find_class`` refuses
every global, so only the opcodes that build plain data can run: dict, list, tuple, str, int, float,
bool and None. Anything else (a global such as ``os.system``, a persistent id, protocol 5's
out-of-band buffers, ``bytes``/``bytearray``, sets) is refused with :class:`SnapshotError` before any
of it is called. Protocols 0 to 5 are read (torch writes 4 or 5, depending on Python's default).

The loaded dict is then checked against the shape ``_snapshot()`` gives (see the allocator spec, §13),
and every problem is reported with its place, e.g. ``segments[3].blocks[2]: ...``.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections.abc import Mapping
from typing import IO, Any

from .errors import SnapshotError

__all__ = ["BLOCK_STATES", "TRACE_ACTIONS", "load_snapshot", "loads_snapshot"]

#: Block states in ``_snapshot()["segments"][i]["blocks"][j]["state"]``.
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")

#: Trace-entry actions of ``device_traces`` (``TraceEntry::Action``; ``annotate`` is torch 2.14+).
TRACE_ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "annotate",
)

_ADDR_ACTIONS = frozenset(TRACE_ACTIONS) - {"snapshot", "oom", "annotate"}
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_SMALL_BUFFER = 2 * 1024 * 1024  # bytes: a small-pool segment (kSmallBuffer)


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: it refuses every global and every persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"refusing to load global '{module}.{name}': a memory snapshot holds only plain data "
            "(dict, list, tuple, str, int, float, bool, None), and this pickle asks to import and "
            "possibly call code. Nothing was run."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError("refusing a pickle persistent id: a memory snapshot holds only plain data")


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "<snapshot>"


def loads_snapshot(data: bytes | bytearray | memoryview, *, name: str = "<bytes>") -> dict[str, Any]:
    """Unpickle ``data`` (a snapshot pickle, protocols 0–5) with the restricted unpickler and check its shape.

    Args:
        data: the bytes of the pickle.
        name: how error messages refer to the data (default: ``"<bytes>"``).

    Raises:
        SnapshotError: the data is empty, truncated, not a pickle, asks for code or non-plain
            objects, or does not have a snapshot's shape.
    """
    data = bytes(data)
    if not data:
        raise SnapshotError(f"{name}: empty file, expected a snapshot pickle")
    unpickler = _RestrictedUnpickler(io.BytesIO(data))
    try:
        obj = unpickler.load()
    except SnapshotError as exc:
        raise SnapshotError(f"{name}: {exc}") from None
    except EOFError:
        raise SnapshotError(f"{name}: truncated pickle (ran out of input)") from None
    except RecursionError:
        raise SnapshotError(f"{name}: pickle nests too deeply to be a snapshot") from None
    except MemoryError:
        raise SnapshotError(f"{name}: pickle asks for more memory than is available") from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError, UnicodeDecodeError, struct.error) as exc:
        msg = str(exc) or type(exc).__name__
        if "out-of-band" in msg:
            msg = "it uses protocol 5 out-of-band buffers, which a snapshot never needs"
        raise SnapshotError(f"{name}: not a valid snapshot pickle ({msg})") from None
    return validate_snapshot(obj, name=name)


def load_snapshot(source: str | os.PathLike[str] | IO[bytes] | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """Load a memory snapshot from a pickle file, an open binary file, pickle bytes, or a ``_snapshot()`` dict.

    The pickle is read with an unpickler that refuses every global (see the module docstring), so a
    malicious file raises :class:`SnapshotError` and runs nothing. The result is checked against the
    shape ``torch.cuda.memory._snapshot()`` gives and returned as a new top-level dict with the keys
    ``segments``, ``device_traces``, ``allocator_settings`` and ``external_annotations`` (missing
    optional keys filled in: ``device_traces=[]``, ``allocator_settings={}``; blocks without an
    ``address`` get the address implied by their order). Sizes and addresses are bytes.

    Args:
        source: a path, a binary file object, the pickle's bytes, or the dict from
            ``torch.cuda.memory._snapshot()`` itself.

    Raises:
        SnapshotError: the file cannot be read as a plain-data pickle, or its content is not a snapshot.

    >>> snap = load_snapshot({"segments": [], "device_traces": [[]]})
    >>> snap["segments"], snap["device_traces"]
    ([], [[]])
    """
    if isinstance(source, Mapping):
        return validate_snapshot(source, name="<dict>")
    name = _describe(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return loads_snapshot(source, name="<bytes>")
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise SnapshotError(f"{name}: cannot read ({exc.strerror or exc})") from None
        return loads_snapshot(data, name=name)
    read = getattr(source, "read", None)
    if read is None:
        raise SnapshotError(
            f"cannot load a snapshot from {type(source).__name__}: give a path, a binary file, bytes, "
            "or the dict from torch.cuda.memory._snapshot()"
        )
    data = read()
    if isinstance(data, str):
        raise SnapshotError(f"{name}: file is open in text mode; open it with 'rb'")
    return loads_snapshot(data, name=name)


# --------------------------------------------------------------------------------------------------
# Shape checks


def _check_plain(obj: Any, name: str) -> None:
    """Raise unless ``obj`` is built only from dict, list, tuple, str, int, float, bool and None."""
    stack = [(obj, "snapshot")]
    seen: set[int] = set()
    while stack:
        value, where = stack.pop()
        if isinstance(value, _PLAIN_SCALARS):
            continue
        if isinstance(value, (dict, list, tuple)):
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, _PLAIN_SCALARS):
                        raise SnapshotError(f"{name}: {where} has a key of type {type(key).__name__}; "
                                            "a snapshot holds only plain data")
                    stack.append((item, f"{where}[{key!r}]"))
            else:
                stack.extend((item, f"{where}[{i}]") for i, item in enumerate(value))
            continue
        raise SnapshotError(f"{name}: {where} is a {type(value).__name__}; a snapshot holds only plain data "
                            "(dict, list, tuple, str, int, float, bool, None)")


def _int(d: Mapping[str, Any], key: str, where: str, *, default: int | None = None, minimum: int = 0) -> int:
    if key not in d:
        if default is None:
            raise SnapshotError(f"{where}: missing key '{key}'")
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SnapshotError(f"{where}: '{key}' must be an int >= {minimum}, got {value!r}")
    return value


def _segment(seg: Any, where: str) -> dict[str, Any]:
    if not isinstance(seg, Mapping):
        raise SnapshotError(f"{where}: a segment must be a dict, got {type(seg).__name__}")
    address = _int(seg, "address", where)
    total = _int(seg, "total_size", where)
    blocks = seg.get("blocks")
    if not isinstance(blocks, list):
        raise SnapshotError(f"{where}: 'blocks' must be a list, got {type(blocks).__name__}")
    out = dict(seg)
    out["stream"] = _int(seg, "stream", where, default=0)
    kind = seg.get("segment_type", "small" if total <= _SMALL_BUFFER else "large")
    if kind not in ("small", "large"):
        raise SnapshotError(f"{where}: 'segment_type' must be 'small' or 'large', got {kind!r}")
    out["segment_type"] = kind
    out.setdefault("device", 0)
    out.setdefault("is_expandable", False)
    offset = address
    allocated = active = requested = 0
    new_blocks = []
    for j, b in enumerate(blocks):
        bw = f"{where}.blocks[{j}]"
        if not isinstance(b, Mapping):
            raise SnapshotError(f"{bw}: a block must be a dict, got {type(b).__name__}")
        size = _int(b, "size", bw)
        state = b.get("state")
        if state not in BLOCK_STATES:
            raise SnapshotError(f"{bw}: 'state' must be one of {', '.join(BLOCK_STATES)}, got {state!r}")
        baddr = _int(b, "address", bw, default=offset)
        if baddr != offset:
            raise SnapshotError(f"{bw}: block at address {baddr} does not start where the previous one ends "
                                f"({offset}); blocks must tile their segment in address order")
        req = _int(b, "requested_size", bw, default=size)
        nb = dict(b)
        nb["address"], nb["requested_size"] = baddr, req
        new_blocks.append(nb)
        offset += size
        if state != "inactive":
            active += size
            requested += req
            if state == "active_allocated":
                allocated += size
    if offset - address != total:
        raise SnapshotError(f"{where}: blocks add up to {offset - address} bytes but 'total_size' is {total}")
    out["blocks"] = new_blocks
    out.setdefault("allocated_size", allocated)
    out.setdefault("active_size", active)
    out.setdefault("requested_size", requested)
    return out


def _check_trace(trace: Any, where: str) -> None:
    if not isinstance(trace, list):
        raise SnapshotError(f"{where}: a device trace must be a list of events, got {type(trace).__name__}")
    addr_actions = _ADDR_ACTIONS
    for i, e in enumerate(trace):
        if not isinstance(e, dict):
            raise SnapshotError(f"{where}[{i}]: a trace event must be a dict, got {type(e).__name__}")
        action = e.get("action")
        if action in addr_actions:
            addr, size = e.get("addr"), e.get("size")
            if type(addr) is not int or addr < 0:
                raise SnapshotError(f"{where}[{i}] ({action}): 'addr' must be an int >= 0, got {addr!r}")
            if type(size) is not int or size < 0:
                raise SnapshotError(f"{where}[{i}] ({action}): 'size' must be an int >= 0, got {size!r}")
        elif action == "oom":
            _int(e, "size", f"{where}[{i}] (oom)")
        elif not isinstance(action, str):
            raise SnapshotError(f"{where}[{i}]: 'action' must be a string, got {action!r}")


def validate_snapshot(obj: Any, *, name: str = "<snapshot>") -> dict[str, Any]:
    """Check that ``obj`` has the shape of ``torch.cuda.memory._snapshot()`` and return it normalized.

    Raises:
        SnapshotError: naming the first thing that is wrong and where.
    """
    if isinstance(obj, list):
        raise SnapshotError(f"{name}: got a list, not a snapshot dict; torch.cuda.memory_snapshot() returns "
                            "only the segment list, use torch.cuda.memory._snapshot() (or _dump_snapshot())")
    if not isinstance(obj, Mapping):
        raise SnapshotError(f"{name}: a snapshot is a dict with 'segments' and 'device_traces', "
                            f"got {type(obj).__name__}")
    if "segments" not in obj:
        raise SnapshotError(f"{name}: missing key 'segments'")
    _check_plain(dict(obj), name)
    segments = obj["segments"]
    if not isinstance(segments, list):
        raise SnapshotError(f"{name}: 'segments' must be a list, got {type(segments).__name__}")
    out = dict(obj)
    try:
        out["segments"] = [_segment(s, f"segments[{i}]") for i, s in enumerate(segments)]
        traces = obj.get("device_traces", [])
        if not isinstance(traces, list):
            raise SnapshotError(f"'device_traces' must be a list (one event list per device), "
                                f"got {type(traces).__name__}")
        for dev, trace in enumerate(traces):
            _check_trace(trace, f"device_traces[{dev}]")
    except SnapshotError as exc:
        raise SnapshotError(f"{name}: {exc}") from None
    out["device_traces"] = traces
    settings = obj.get("allocator_settings", {})
    if not isinstance(settings, Mapping):
        raise SnapshotError(f"{name}: 'allocator_settings' must be a dict, got {type(settings).__name__}")
    out["allocator_settings"] = settings
    out.setdefault("external_annotations", [])
    return out
