"""Load a memory snapshot safely: a scanned, restricted unpickler plus a shape check, in bounded time and memory.

``torch.cuda.memory._dump_snapshot()`` writes ``pickle.dump(torch.cuda.memory._snapshot())``. A
pickle can name any importable callable and call it while loading, so an untrusted ``.pickle`` is a
program, not a file. :func:`load_snapshot` reads it in three steps:

1. A scan of the opcodes as the bytes arrive (``memviz.snapshots._pickle_scan``): only the opcodes that
   build plain data pass (dict, list, tuple, str, int, float, bool, None). A global such as
   ``os.system``, a persistent id, ``bytes``/``bytearray``, a set, protocol 5's out-of-band buffers, or a
   length or memo index the data cannot back is refused before anything is built, and so is a pickle
   whose objects would take more than 24 bytes of memory per byte of file (as the scan estimates them).
2. CPython's unpickler builds the data, with a ``find_class`` that refuses every global (so nothing is
   ever imported or called, even if the scan missed one).
3. A check against the shape ``_snapshot()`` gives (see the allocator spec, §13): each segment, block
   and trace event is its own object (a pickle can refer to one block a million times in two bytes a
   reference; torch never does); every number has its type and int64 range; the whole object nests at
   most :data:`MAX_DEPTH` levels and has no cycles. Every problem is reported with its place, e.g.
   ``segments[3].blocks[2]: ...``, and the first problem found stops the check.

Bounds, for a file of ``n`` bytes, whatever it holds: the bytes are read in 1 MiB chunks and scanned as
they come, so garbage (``/dev/zero``) is refused after the first chunk, and a source that is not a
regular file is read to at most :data:`MAX_STREAM_BYTES`; time is linear in ``n``: one pass of the scan
(0.2 µs an opcode, so at most 0.2 µs a byte; a real snapshot has one opcode in 4 bytes), one of
CPython's unpickler, one of the checks, each container once. Memory is the ``n`` bytes, at most ``24 n``
of built objects (the scan's estimate, an upper bound), then the checks' copies of segments and blocks
and one entry per container walked: under ``35 n`` in all, which the tests hold under a 2 GiB address
space (measured: a real snapshot ``9 n``, the worst pickle we built ``13 n``). Protocols 0 to 5 are read
(torch writes 4 or 5, depending on Python's default).
"""

from __future__ import annotations

import io
import os
import pickle
import stat
import struct
from collections.abc import Mapping
from typing import IO, Any

from memviz.sim.constants import SMALL_BUFFER

from ._pickle_scan import PickleScan
from .errors import SnapshotError

__all__ = ["BLOCK_STATES", "MAX_DEPTH", "MAX_STREAM_BYTES", "TRACE_ACTIONS", "load_snapshot", "loads_snapshot",
           "validate_snapshot"]  # fmt: skip

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

MAX_DEPTH = 32
"""Most levels of nesting a snapshot may have (torch's nest 7: snapshot, segments, segment, blocks, block,
frames, frame)."""

MAX_STREAM_BYTES = 1 << 30
"""Most bytes read from a source whose size is not known in advance (a pipe, a device, a file object)."""

_CHUNK = 1 << 20
_INT64_MAX = (1 << 63) - 1
_ADDR_ACTIONS = frozenset(TRACE_ACTIONS) - {"snapshot", "oom", "annotate"}
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_PLAIN_SCALARS)
_CONTAINER_TYPES = frozenset((dict, list, tuple))
_LEAF_TYPES = _SCALAR_TYPES | _CONTAINER_TYPES
_EVENT_INTS = ("time_us", "stream", "device_free")  # optional int fields of a trace event
_ABSENT = object()
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a non-zip torch.save() file
_DUMP_HINT = ("load_snapshot reads the file torch.cuda.memory._dump_snapshot(path) writes (or the dict "
              "torch.cuda.memory._snapshot() returns)")
_TORCH_HINT = ("; if it holds a snapshot dict saved with torch.save, pass torch.load(path, weights_only=True) "
               "to load_snapshot")


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


def _sniff(head: bytes, name: str) -> None:
    """Refuse, by its first bytes, a file that is something else than a pickle, saying what it is."""
    if head.startswith(b"PK\x03\x04"):
        raise SnapshotError(f"{name}: this is a zip archive, as torch.save() writes (a model or tensors), not a "
                            f"memory snapshot; {_DUMP_HINT}{_TORCH_HINT}")
    if head.startswith(b"\x1f\x8b"):
        raise SnapshotError(f"{name}: this file is gzip-compressed; pass gzip.open(path, 'rb') to load_snapshot, "
                            "or decompress it first")
    if head.startswith(b"\x93NUMPY"):
        raise SnapshotError(f"{name}: this is a NumPy .npy array, not a memory snapshot; {_DUMP_HINT}")
    if head.lstrip()[:1] in (b"{", b"[") or head.startswith(b"\xef\xbb\xbf"):
        raise SnapshotError(f"{name}: this looks like text (JSON?), not a pickle; {_DUMP_HINT}")


def _scan_and_build(data: bytes, scan: PickleScan, name: str) -> Any:
    """Finish the scan of ``data`` and build the pickle with the restricted unpickler."""
    result = scan.finish(data)
    unpickler = _RestrictedUnpickler(io.BytesIO(data))
    try:
        obj = unpickler.load()
    except SnapshotError as exc:
        raise SnapshotError(f"{name}: {exc}") from None
    except EOFError:
        raise SnapshotError(f"{name}: truncated pickle (ran out of input)") from None
    except MemoryError:
        raise SnapshotError(f"{name}: the pickle needs more memory than is available") from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError, UnicodeDecodeError, struct.error, RecursionError) as exc:
        msg = str(exc) or type(exc).__name__
        raise SnapshotError(f"{name}: not a valid snapshot pickle ({msg[:200]})") from None
    if type(obj) is int and obj == _TORCH_LEGACY_MAGIC:
        raise SnapshotError(f"{name}: this is a torch.save() file (the legacy, non-zip format: a model or "
                            f"tensors), not a memory snapshot; {_DUMP_HINT}{_TORCH_HINT}")
    if result.end < len(data):
        raise SnapshotError(f"{name}: {len(data) - result.end:,} bytes follow the end of the pickle (at byte "
                            f"{result.end:,}); a snapshot file is one pickle: {_DUMP_HINT}")
    return obj


def loads_snapshot(data: bytes | bytearray | memoryview, *, name: str = "<bytes>") -> dict[str, Any]:
    """Unpickle ``data`` (a snapshot pickle, protocols 0–5) safely and check its shape.

    Time and memory are bounded by the size of ``data`` (see the module docstring).

    Args:
        data: the bytes of the pickle.
        name: how error messages refer to the data (default: ``"<bytes>"``).

    Raises:
        SnapshotError: the data is empty, truncated, not a pickle, asks for code or non-plain
            objects, would take too much memory for its size, or does not have a snapshot's shape.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SnapshotError(f"{name}: loads_snapshot takes the pickle's bytes, not {type(data).__name__}; "
                            "pass a path or a file to load_snapshot")
    data = bytes(data)
    if not data:
        raise SnapshotError(f"{name}: empty file, expected a snapshot pickle")
    _sniff(data[:16], name)
    return _validate(_scan_and_build(data, PickleScan(name, len(data)), name), name, owned=True)


def _read(f: IO[bytes], name: str, limit: int) -> Any:
    """Read ``f`` in chunks, scanning as it comes, to at most ``limit`` bytes; return what the pickle builds."""
    scan = PickleScan(name, limit)
    buf = bytearray()
    sniffed = False
    while True:
        try:
            chunk = f.read(min(_CHUNK, limit + 1 - len(buf)))
        except UnicodeDecodeError:
            chunk = ""
        except OSError as exc:
            raise SnapshotError(f"{name}: cannot read ({exc.strerror or exc})") from None
        if isinstance(chunk, str):
            raise SnapshotError(f"{name}: file is open in text mode; open it with 'rb'")
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise SnapshotError(f"{name}: read() returned {type(chunk).__name__}, not bytes; pass a binary file")
        if not chunk:
            break
        try:
            buf += chunk
        except MemoryError:
            raise SnapshotError(f"{name}: not enough memory to read more than {len(buf):,} bytes") from None
        if len(buf) > limit:
            raise SnapshotError(f"{name}: more than {limit:,} bytes; a source whose size is not known is read to at "
                                f"most {MAX_STREAM_BYTES:,} bytes (save the snapshot to a file to load a bigger one)")
        if not sniffed and len(buf) >= 16:
            _sniff(bytes(buf[:16]), name)
            sniffed = True
        if scan.feed(buf):
            break
        scan.check_so_far()
    if not buf:
        raise SnapshotError(f"{name}: empty file, expected a snapshot pickle")
    if not sniffed:
        _sniff(bytes(buf[:16]), name)
    try:
        data = bytes(buf)
    except MemoryError:
        raise SnapshotError(f"{name}: not enough memory to hold the file's {len(buf):,} bytes twice") from None
    del buf
    return _scan_and_build(data, scan, name)


def _limit_of(f: Any) -> int:
    """The most bytes ``f`` can give: the rest of a regular file, else :data:`MAX_STREAM_BYTES`."""
    if not isinstance(f, (io.BufferedReader, io.FileIO)):  # e.g. a GzipFile: its fileno() is the compressed file's
        return MAX_STREAM_BYTES
    try:
        st = os.fstat(f.fileno())
        if stat.S_ISREG(st.st_mode) and st.st_size > 0:
            return max(st.st_size - f.tell(), 0)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    return MAX_STREAM_BYTES


def load_snapshot(source: str | os.PathLike[str] | IO[bytes] | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """Load a memory snapshot from a pickle file, an open binary file, pickle bytes, or a ``_snapshot()`` dict.

    The pickle is scanned and read with an unpickler that refuses every global (see the module
    docstring), so a malicious file raises :class:`SnapshotError` and runs nothing; time and memory are
    bounded by the file's size (at most about 35 bytes of memory per byte of file, whatever it holds). The
    result is checked against the shape ``torch.cuda.memory._snapshot()`` gives and returned as a new
    top-level dict with the keys ``segments``, ``device_traces``, ``allocator_settings`` and
    ``external_annotations`` (missing optional keys filled in: ``device_traces=[]``,
    ``allocator_settings={}``; blocks without an ``address`` get the address implied by their order).
    Sizes and addresses are bytes.

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
    if isinstance(source, (bytes, bytearray, memoryview)):
        return loads_snapshot(source, name="<bytes>")
    name = _describe(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            f = open(source, "rb")  # noqa: SIM115 (closed below; the limit needs the open file)
        except OSError as exc:
            raise SnapshotError(f"{name}: cannot read ({exc.strerror or exc})") from None
        with f:
            return _validate(_read(f, name, _limit_of(f)), name, owned=True)
    if isinstance(source, io.TextIOBase):
        raise SnapshotError(f"{name}: file is open in text mode; open it with 'rb'")
    if not callable(getattr(source, "read", None)):
        raise SnapshotError(
            f"cannot load a snapshot from {type(source).__name__}: give a path, a binary file, bytes, "
            "or the dict from torch.cuda.memory._snapshot()"
        )
    return _validate(_read(source, name, _limit_of(source)), name, owned=True)


# --------------------------------------------------------------------------------------------------
# Shape checks


def _show(value: Any) -> str:
    """``repr(value)`` cut to 60 characters (a huge int is described, not printed)."""
    if type(value) is int and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _where(stack: list[list[Any]], key: Any) -> str:
    """``snapshot['x'][0]...``: the path of the walk's ``stack`` to ``key``, the middle elided past 12 levels."""
    path = [f[2] for f in stack[1:]] + [key]
    parts = [f"[{_show(k)}]" for k in (path if len(path) <= 12 else path[:6] + path[-4:])]
    if len(path) > 12:
        parts[6:6] = [f"...({len(path) - 10} levels)..."]
    return "snapshot" + "".join(parts)


def _check_plain(obj: Any, name: str) -> None:
    """Refuse unless ``obj`` is plain data (dict, list, tuple, str, int, float, bool, None), nests at most
    :data:`MAX_DEPTH` levels and has no cycle. Each container is visited once: time O(objects + items)."""
    if isinstance(obj, _PLAIN_SCALARS):
        return
    items = _items(obj)
    if isinstance(items, int):
        return
    heights: dict[int, int] = {}  # id -> levels of a container already checked, itself included
    # frames of the walk: [container, items iterator, key from the parent, tallest child so far]
    stack: list[list[Any]] = [[obj, items, None, 0]]
    on_path = {id(obj)}
    while stack:
        frame = stack[-1]
        for key, child in frame[1]:
            if type(child) in _SCALAR_TYPES or isinstance(child, _PLAIN_SCALARS):
                continue
            cid = id(child)
            height = heights.get(cid)
            if height is None:
                if not isinstance(child, (dict, list, tuple)):
                    raise SnapshotError(f"{name}: {_where(stack, key)} is a {type(child).__name__}; a snapshot "
                                        "holds only plain data (dict, list, tuple, str, int, float, bool, None)")
                if cid in on_path:
                    raise SnapshotError(f"{name}: {_where(stack, key)} contains itself (a cycle); a snapshot is "
                                        "a tree")
                items = _items(child)
                if not isinstance(items, int):  # not a leaf: walk it
                    if len(stack) >= MAX_DEPTH:
                        raise SnapshotError(f"{name}: {_where(stack, key)} nests deeper than {MAX_DEPTH} levels; "
                                            "a snapshot nests 7")
                    stack.append([child, items, key, 0])
                    on_path.add(cid)
                    break
                height = items
                if len(child) > 8:  # a small leaf is re-checked for less than its entry here would cost
                    heights[cid] = height
            if len(stack) + height > MAX_DEPTH:
                raise SnapshotError(f"{name}: {_where(stack, key)} nests deeper than {MAX_DEPTH} levels; a "
                                    "snapshot nests 7")
            if height > frame[3]:
                frame[3] = height
        else:
            stack.pop()
            cid = id(frame[0])
            on_path.discard(cid)
            heights[cid] = frame[3] + 1
            if stack and frame[3] + 1 > stack[-1][3]:
                stack[-1][3] = frame[3] + 1


def _items(container: Any) -> Any:
    """(key, value) pairs of a container to walk, or, for a leaf, its height: 1 for a container of scalars
    (or an empty one), 2 for a dict of scalars and empty containers (a block with ``'frames': []``). A dict's
    keys must be plain scalars."""
    if isinstance(container, dict):
        types = {*map(type, container), *map(type, container.values())}
        if types <= _SCALAR_TYPES:
            return 1  # the common case: one set for keys and values
        if not set(map(type, container)) <= _SCALAR_TYPES:
            for key in container:
                if not isinstance(key, _PLAIN_SCALARS):
                    raise SnapshotError(f"a dict has a key of type {type(key).__name__}; a snapshot holds only "
                                        "plain data")
        if types <= _LEAF_TYPES and not any(v for v in container.values() if type(v) in _CONTAINER_TYPES):
            return 2
        return iter(container.items())
    if set(map(type, container)) <= _SCALAR_TYPES:
        return 1
    return enumerate(container)


Place = str | tuple  # a place in the snapshot: text, or (format, *numbers) formatted only for an error


def _place(where: Place) -> str:
    return where if isinstance(where, str) else where[0].format(*where[1:])


def _int(d: Mapping[str, Any], key: str, where: Place, *, default: int | None = None, minimum: int = 0) -> int:
    if key not in d:
        if default is None:
            raise SnapshotError(f"{_place(where)}: missing key '{key}'")
        return default
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _INT64_MAX:
        raise SnapshotError(f"{_place(where)}: '{key}' must be an int from {minimum} to 2**63-1, got {_show(value)}")
    return value


class _Once:
    """Refuses a second reference to a segment, block or event object: a pickle can refer to one object a
    million times at two bytes a reference, and a check that copies each would take a million times its size.
    Only ids are kept; the first place is found again, in the same order, for the error."""

    def __init__(self, snapshot: Mapping[str, Any]) -> None:
        self.snapshot = snapshot
        self.seen: set[int] = set()

    def __call__(self, obj: Any, where: Place) -> None:
        key = id(obj)
        if key in self.seen:
            raise SnapshotError(f"{_place(where)} is the same object as {self._first(key)}; each segment, block and "
                                "trace event of a snapshot is its own object (torch never shares them)")
        self.seen.add(key)

    def _first(self, key: int) -> str:
        for i, seg in enumerate(self.snapshot["segments"]):
            if id(seg) == key:
                return f"segments[{i}]"
            blocks = seg.get("blocks", ())
            if id(blocks) == key:
                return f"segments[{i}].blocks"
            for j, b in enumerate(blocks):
                if id(b) == key:
                    return f"segments[{i}].blocks[{j}]"
        for d, trace in enumerate(self.snapshot.get("device_traces", ())):
            if id(trace) == key:
                return f"device_traces[{d}]"
            for i, e in enumerate(trace):
                if id(e) == key:
                    return f"device_traces[{d}][{i}]"
        return "an earlier one"


def _segment(seg: Any, where: str, once: _Once, owned: bool) -> dict[str, Any]:
    """The segment checked and normalized; ``owned``: it was built by the unpickler here, so it is normalized in
    place (no copies of its blocks: a snapshot's blocks are most of its memory)."""
    if not isinstance(seg, Mapping):
        raise SnapshotError(f"{where}: a segment must be a dict, got {type(seg).__name__}")
    once(seg, where)
    address = _int(seg, "address", where)
    total = _int(seg, "total_size", where)
    blocks = seg.get("blocks")
    if not isinstance(blocks, list):
        raise SnapshotError(f"{where}: 'blocks' must be a list, got {type(blocks).__name__}")
    once(blocks, f"{where}.blocks")
    out = seg if owned else dict(seg)
    out["stream"] = _int(seg, "stream", where, default=0)
    out["device"] = _int(seg, "device", where, default=0)
    kind = seg.get("segment_type", "small" if total <= SMALL_BUFFER else "large")
    if kind not in ("small", "large"):
        raise SnapshotError(f"{where}: 'segment_type' must be 'small' or 'large', got {_show(kind)}")
    out["segment_type"] = kind
    expandable = seg.get("is_expandable", False)
    if type(expandable) is not bool:
        raise SnapshotError(f"{where}: 'is_expandable' must be True or False, got {_show(expandable)}")
    out["is_expandable"] = expandable
    offset = address
    allocated = active = requested = 0
    new_blocks = blocks if owned else []
    block_place = where + ".blocks[{}]"
    for j, b in enumerate(blocks):
        bw = (block_place, j)
        if not isinstance(b, Mapping):
            raise SnapshotError(f"{_place(bw)}: a block must be a dict, got {type(b).__name__}")
        once(b, bw)
        size = _int(b, "size", bw)
        state = b.get("state")
        if state not in BLOCK_STATES:
            raise SnapshotError(f"{_place(bw)}: 'state' must be one of {', '.join(BLOCK_STATES)}, "
                                f"got {_show(state)}")
        baddr = _int(b, "address", bw, default=offset)
        if baddr != offset:
            raise SnapshotError(f"{_place(bw)}: block at address {baddr} does not start where the previous one "
                                f"ends ({offset}); blocks must tile their segment in address order")
        req = _int(b, "requested_size", bw, default=size)
        nb = b if owned else dict(b)
        nb["address"], nb["requested_size"] = baddr, req
        if not owned:
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
    for key, value in (("allocated_size", allocated), ("active_size", active), ("requested_size", requested)):
        out[key] = _int(seg, key, where, default=value)
    return out


def _check_trace(trace: Any, where: str, once: _Once) -> None:
    if not isinstance(trace, list):
        raise SnapshotError(f"{where}: a device trace must be a list of events, got {type(trace).__name__}")
    once(trace, where)
    addr_actions, place, event_place, seen = _ADDR_ACTIONS, where + "[{}] ({})", where + "[{}]", once.seen
    for i, e in enumerate(trace):
        if not isinstance(e, dict):
            raise SnapshotError(f"{where}[{i}]: a trace event must be a dict, got {type(e).__name__}")
        if id(e) in seen:
            once(e, (event_place, i))  # raises
        seen.add(id(e))
        action = e.get("action")
        if action in addr_actions:
            addr, size = e.get("addr"), e.get("size")
            if type(addr) is not int or not 0 <= addr <= _INT64_MAX:
                raise SnapshotError(f"{where}[{i}] ({action}): 'addr' must be an int from 0 to 2**63-1, "
                                    f"got {_show(addr)}")
            if type(size) is not int or not 0 <= size <= _INT64_MAX:
                raise SnapshotError(f"{where}[{i}] ({action}): 'size' must be an int from 0 to 2**63-1, "
                                    f"got {_show(size)}")
        elif action == "oom":
            _int(e, "size", (where + "[{}] (oom)", i))
        elif not isinstance(action, str):
            raise SnapshotError(f"{where}[{i}]: 'action' must be a string, got {_show(action)}")
        for key in _EVENT_INTS:
            value = e.get(key, _ABSENT)
            if value is not _ABSENT and (type(value) is not int or not 0 <= value <= _INT64_MAX):
                _int(e, key, (place, i, action))  # raises unless an int subclass in range


def validate_snapshot(obj: Any, *, name: str = "<snapshot>") -> dict[str, Any]:
    """Check that ``obj`` has the shape of ``torch.cuda.memory._snapshot()`` and return it normalized.

    The shape is checked first (so a wrong ``segments[0]`` is reported at once), then that the whole of
    ``obj`` is plain data nesting at most :data:`MAX_DEPTH` levels. Time and memory are linear in the
    number of objects and items in ``obj``; ``obj`` is not modified (segments and blocks are copied).

    Raises:
        SnapshotError: naming the first thing that is wrong and where.
    """
    return _validate(obj, name, owned=False)


def _validate(obj: Any, name: str, owned: bool) -> dict[str, Any]:
    """:func:`validate_snapshot`; ``owned``: ``obj`` was just unpickled here, so it is normalized in place."""
    if isinstance(obj, list):
        raise SnapshotError(f"{name}: got a list, not a snapshot dict; torch.cuda.memory_snapshot() returns "
                            "only the segment list, use torch.cuda.memory._snapshot() (or _dump_snapshot())")
    if not isinstance(obj, Mapping):
        raise SnapshotError(f"{name}: a snapshot is a dict with 'segments' and 'device_traces', "
                            f"got {type(obj).__name__}")
    if "segments" not in obj:
        raise SnapshotError(f"{name}: missing key 'segments'")
    segments = obj["segments"]
    if not isinstance(segments, list):
        raise SnapshotError(f"{name}: 'segments' must be a list, got {type(segments).__name__}")
    out = dict(obj)
    once = _Once(obj)
    try:
        out["segments"] = [_segment(s, f"segments[{i}]", once, owned) for i, s in enumerate(segments)]
        traces = obj.get("device_traces", [])
        if not isinstance(traces, list):
            raise SnapshotError(f"'device_traces' must be a list (one event list per device), "
                                f"got {type(traces).__name__}")
        for dev, trace in enumerate(traces):
            _check_trace(trace, f"device_traces[{dev}]", once)
        settings = obj.get("allocator_settings", {})
        if not isinstance(settings, Mapping):
            raise SnapshotError(f"'allocator_settings' must be a dict, got {type(settings).__name__}")
        _check_plain(obj if isinstance(obj, dict) else dict(obj), name)
    except SnapshotError as exc:
        raise SnapshotError(f"{name}: {exc}" if not str(exc).startswith(f"{name}: ") else str(exc)) from None
    del once
    out["device_traces"] = traces
    out["allocator_settings"] = settings
    out.setdefault("external_annotations", [])
    return out
