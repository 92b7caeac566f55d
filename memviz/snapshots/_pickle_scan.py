"""Read a pickle's opcodes before anything is built: plain-data opcodes only, and a memory bound.

:class:`PickleScan` walks the opcode stream once (fed in chunks, so a stream such as ``/dev/zero`` is
refused after its first chunk), without building objects, and refuses with :class:`SnapshotError`:

- any opcode that is not plain data: globals and calls (``GLOBAL``, ``REDUCE``, ``BUILD``, ...), persistent
  ids, ``bytes``/``bytearray``, sets, protocol 5's out-of-band buffers, Python 2 byte strings;
- a length or memo index the data cannot back (a 6-byte pickle can ask for a 16 GiB memo table);
- a pickle whose objects would take more than :data:`BUILD_BYTES_PER_BYTE` (24) bytes of memory for each byte
  of the pickle. The estimate is an upper bound of what CPython's unpickler allocates (object sizes of
  CPython 3.10-3.13 on 64-bit: an empty dict 64 B, a list 56 B + 8 B per item, a str 49 B + 1-4 B per
  character, a dict entry at most 48 B, plus the unpickler's stack, marks and memo at 16 B a slot).

``STACK_GLOBAL`` takes its names from the stack; the scan marks the pickle as asking for code and stops,
so that the restricted unpickler, run on a prefix already checked, names the global and refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from memviz.errors import SnapshotError

__all__ = ["BUILD_BYTES_PER_BYTE", "PickleScan"]

BUILD_BYTES_PER_BYTE = 24
"""Most bytes of built objects per byte of pickle (the scan's estimate). A snapshot written by
``torch.cuda.memory._dump_snapshot()`` estimates at 5-8 (and really takes 3-6)."""

_SLOT = 16  # bytes per unpickler stack, mark or memo slot (8 B, grown by doubling)
_DICT_ITEM = 48  # bytes per dict entry (CPython grows the table by doubling at 2/3 full)
_LIST_ITEM = 16  # bytes per appended list item, over-allocation included

# fixed-size opcodes: opcode -> (bytes including the opcode, bytes allocated, stack height change)
_FIXED: dict[int, tuple[int, int, int]] = {
    ord("N"): (1, 0, 1), 0x88: (1, 0, 1), 0x89: (1, 0, 1), ord(")"): (1, 0, 1),  # None, True, False, ()
    ord("K"): (2, 0, 1), ord("M"): (3, 32, 1), ord("J"): (5, 32, 1), ord("G"): (9, 32, 1),  # ints, float
    ord("]"): (1, 56, 1), ord("}"): (1, 64, 1),  # empty list, empty dict
    ord("h"): (2, 0, 1), ord("j"): (5, 0, 1), ord("2"): (1, 0, 1),  # memo get, DUP
    ord("0"): (1, 0, -1),  # POP
    ord("a"): (1, _LIST_ITEM, -1), ord("s"): (1, _DICT_ITEM, -2),  # APPEND, SETITEM
    0x85: (1, 48, 0), 0x86: (1, 56, -1), 0x87: (1, 64, -2),  # TUPLE1-3
}  # fmt: skip
_NEEDS = {ord("0"): 1, ord("2"): 1, ord("a"): 2, ord("s"): 3, 0x85: 1, 0x86: 2, 0x87: 3}  # stack items used
# by opcode: (size, cost, height change, stack items used) of the fixed-size opcodes, else None
_FIXED_TABLE: list[tuple[int, int, int, int] | None] = [
    (*_FIXED[op], _NEEDS.get(op, 0)) if op in _FIXED else None for op in range(256)]

_NOT_PLAIN = {
    ord("c"): "a global (GLOBAL)", ord("i"): "a global (INST)", 0x93: "a global (STACK_GLOBAL)",
    ord("R"): "a call (REDUCE)", ord("b"): "an object's state (BUILD)", ord("o"): "an object (OBJ)",
    0x81: "an object (NEWOBJ)", 0x92: "an object (NEWOBJ_EX)",
    0x82: "an extension code (EXT1)", 0x83: "an extension code (EXT2)", 0x84: "an extension code (EXT4)",
    ord("P"): "a persistent id (PERSID)", ord("Q"): "a persistent id (BINPERSID)",
    ord("B"): "a bytes object (BINBYTES)", ord("C"): "a bytes object (SHORT_BINBYTES)",
    0x8E: "a bytes object (BINBYTES8)", 0x96: "a bytearray (BYTEARRAY8)",
    0x8F: "a set (EMPTY_SET)", 0x90: "a set (ADDITEMS)", 0x91: "a frozenset (FROZENSET)",
    0x97: "an out-of-band buffer (NEXT_BUFFER)", 0x98: "an out-of-band buffer (READONLY_BUFFER)",
    ord("S"): "a Python 2 byte string (STRING)", ord("T"): "a Python 2 byte string (BINSTRING)",
    ord("U"): "a Python 2 byte string (SHORT_BINSTRING)",
}  # fmt: skip
_CODE = frozenset(b"ci\x93Rbo\x81\x92\x82\x83\x84PQ")
_STACK_GLOBAL = 0x93
# counted arguments: opcode -> (bytes of the length, True for a str); SHORT_BINUNICODE, BINUNICODE,
# BINUNICODE8 (UTF-8 text), LONG1, LONG4 (little-endian ints)
_COUNTED = {0x8C: (1, True), ord("X"): (4, True), 0x8D: (8, True), 0x8A: (1, False), 0x8B: (4, False)}
_LINE_OPS = frozenset(b"IFLVgp")  # INT, FLOAT, LONG, UNICODE, GET, PUT: an argument ending in b"\n"
_MAX_LINE = 1 << 20  # bytes of a text argument (protocol 0); torch never writes protocol 0


@dataclass
class ScanResult:
    """What the scan found: where the pickle ends, its memory estimate, and whether it asks for a global."""

    end: int
    estimate_bytes: int
    stack_global_at: int | None


class PickleScan:
    """Check a pickle's opcodes as its bytes arrive: ``feed(data)`` after each chunk, ``finish(data)`` at the end.

    ``data`` is the whole buffer read so far (a ``bytes`` or ``bytearray`` that only grows); the scan
    resumes where it stopped. ``limit_bytes`` is the most the source can hold: a length claimed beyond
    it is refused at once instead of waiting for bytes that cannot come.
    """

    def __init__(self, name: str, limit_bytes: int) -> None:
        self.name = name
        self.limit_bytes = limit_bytes
        self.pos = 0
        self.alloc = 0
        self.height = 0
        self.marks: list[int] = []
        self.max_height = 0
        self.max_marks = 0
        self.memo = 0
        self.max_frame = 0
        self.stop: int | None = None
        self.stack_global_at: int | None = None

    def _fail(self, message: str) -> SnapshotError:
        return SnapshotError(f"{self.name}: {message}")

    def feed(self, data: bytes | bytearray) -> bool:
        """Scan the complete opcodes of ``data`` from where the last call stopped; True once the pickle ended."""
        if self.stop is not None or self.stack_global_at is not None:
            return True
        n = len(data)
        i, alloc, height, marks, memo = self.pos, self.alloc, self.height, self.marks, self.memo
        fixed = _FIXED_TABLE
        top, mtop = max(self.max_height, height), max(self.max_marks, len(marks))  # most stack and mark slots
        try:
            while i < n:
                op = data[i]
                f = fixed[op]
                if f is not None:
                    size, cost, dh, need = f
                    if i + size > n:
                        break
                    if need and height - (marks[-1] if marks else 0) < need:
                        raise self._fail(f"not a valid snapshot pickle (stack underflow at byte {i})")
                    alloc += cost
                    height += dh
                    i += size
                    if dh > 0 and height > top:
                        top = height
                    continue
                if op == 0x94:  # MEMOIZE
                    if height <= (marks[-1] if marks else 0):
                        raise self._fail(f"not a valid snapshot pickle (empty stack at byte {i})")
                    memo += 1
                    i += 1
                    continue
                if op == 0x28:  # MARK
                    marks.append(height)
                    i += 1
                    if len(marks) > mtop:
                        mtop = len(marks)
                    continue
                counted = _COUNTED.get(op)
                if counted is not None:
                    w, text = counted
                    if i + 1 + w > n:
                        break
                    length = int.from_bytes(data[i + 1:i + 1 + w], "little")
                    self._check_length(length, i)
                    end = i + 1 + w + length
                    if end > n:
                        break
                    if not text:  # an int of `length` bytes
                        alloc += 32 + length
                    else:  # a str: 1 byte a character if ASCII, else up to 4
                        alloc += 64 + (length if data[i + 1 + w:end].isascii() else 4 * length)
                    height += 1
                    if height > top:
                        top = height
                    i = end
                    continue
                if op in (0x65, 0x75, 0x6C, 0x74, 0x64, 0x31):  # APPENDS SETITEMS LIST TUPLE DICT POP_MARK
                    if not marks:
                        raise self._fail(f"not a valid snapshot pickle (no MARK before byte {i})")
                    base = marks.pop()
                    items = height - base
                    if op == 0x65:
                        if base < 1:
                            raise self._fail(f"not a valid snapshot pickle (APPENDS without a list, byte {i})")
                        alloc += _LIST_ITEM * items
                    elif op == 0x75:
                        if base < 1 or items % 2:
                            raise self._fail(f"not a valid snapshot pickle (SETITEMS with odd items, byte {i})")
                        alloc += _DICT_ITEM * (items // 2)
                    elif op in (0x6C, 0x74):
                        alloc += 56 + 8 * items
                        base += 1
                    elif op == 0x64:
                        if items % 2:
                            raise self._fail(f"not a valid snapshot pickle (DICT with odd items, byte {i})")
                        alloc += 64 + _DICT_ITEM * (items // 2)
                        base += 1
                    height = base
                    i += 1
                    continue
                if op in (0x71, 0x72):  # BINPUT, LONG_BINPUT
                    w = 1 if op == 0x71 else 4
                    if i + 1 + w > n:
                        break
                    self._check_put(int.from_bytes(data[i + 1:i + 1 + w], "little"), memo, height, marks, i)
                    memo += 1
                    i += 1 + w
                    continue
                if op == 0x95:  # FRAME: the unpickler reads the frame in one piece
                    if i + 9 > n:
                        break
                    length = int.from_bytes(data[i + 1:i + 9], "little")
                    self._check_length(length, i)
                    self.max_frame = max(self.max_frame, length)
                    i += 9
                    continue
                if op == 0x80:  # PROTO
                    if i + 2 > n:
                        break
                    if data[i + 1] > 5:
                        raise self._fail(f"not a valid snapshot pickle (unsupported pickle protocol {data[i + 1]})")
                    i += 2
                    continue
                if op == 0x2E:  # STOP
                    if height - (marks[-1] if marks else 0) < 1:
                        raise self._fail(f"not a valid snapshot pickle (STOP with an empty stack at byte {i})")
                    self.stop = i + 1
                    i += 1
                    break
                if op in _LINE_OPS:
                    eol = data.find(b"\n", i + 1, i + 2 + _MAX_LINE)
                    if eol < 0:
                        if n - i > _MAX_LINE:
                            raise self._fail(f"not a valid snapshot pickle (a text argument of more than "
                                             f"{_MAX_LINE} bytes at byte {i})")
                        break
                    length = eol - i - 1
                    if op == 0x70:  # PUT
                        text = bytes(data[i + 1:eol])
                        if not text.isdigit():
                            raise self._fail(f"not a valid snapshot pickle (PUT {text[:20]!r} at byte {i})")
                        self._check_put(int(text), memo, height, marks, i)
                        memo += 1
                    else:
                        alloc += 64 + 4 * length
                        height += 1
                        if height > top:
                            top = height
                    i = eol + 1
                    continue
                if op in _NOT_PLAIN:
                    if op == _STACK_GLOBAL:
                        self.stack_global_at = i
                        break
                    raise self._refusal(op, data, i)
                raise self._fail(f"not a valid snapshot pickle (byte {op:#04x} at offset {i} is not a pickle opcode)")
        finally:
            self.pos, self.alloc, self.height, self.memo = i, alloc, height, memo
            self.max_height, self.max_marks = top, mtop
        return self.stop is not None or self.stack_global_at is not None

    def _check_length(self, length: int, at: int) -> None:
        if length > self.limit_bytes:
            raise self._fail(f"not a valid snapshot pickle (byte {at} announces {length:,} bytes; "
                             f"the source holds at most {self.limit_bytes:,})")

    def _check_put(self, index: int, memo: int, height: int, marks: list[int], at: int) -> None:
        if height <= (marks[-1] if marks else 0):
            raise self._fail(f"not a valid snapshot pickle (empty stack at byte {at})")
        if index > memo:  # a pickler numbers its memo 0, 1, 2, ...: a jump would size the table to the index
            raise self._fail(f"not a valid snapshot pickle (memo index {index:,} at byte {at}, after only "
                             f"{memo:,} memo entries)")

    def _refusal(self, op: int, data: bytes | bytearray, at: int) -> SnapshotError:
        what = _NOT_PLAIN[op]
        if op in (ord("c"), ord("i")):  # GLOBAL / INST: "module\nname\n"
            end = data.find(b"\n", data.find(b"\n", at + 1, at + 1 + _MAX_LINE) + 1, at + 1 + 2 * _MAX_LINE)
            module, _, qualname = bytes(data[at + 1:end]).decode("utf-8", "replace").partition("\n")
            return self._fail(f"refusing to load global '{module}.{qualname}': a memory snapshot holds only plain "
                              "data (dict, list, tuple, str, int, float, bool, None), and this pickle asks to "
                              "import and possibly call code. Nothing was run.")
        if op in _CODE:
            return self._fail(f"refusing {what} at byte {at}: a memory snapshot holds only plain data (dict, "
                              "list, tuple, str, int, float, bool, None). Nothing was run.")
        if op in (0x97, 0x98):
            return self._fail(f"refusing {what} at byte {at}: it uses protocol 5 out-of-band buffers, which a "
                              "snapshot never needs")
        return self._fail(f"refusing {what} at byte {at}: a memory snapshot holds only plain data (dict, list, "
                          "tuple, str, int, float, bool, None)")

    def _estimate(self) -> int:
        return self.alloc + _SLOT * (self.max_height + self.max_marks + self.memo) + self.max_frame

    def _over_budget(self, estimate: int, end: int) -> SnapshotError:
        return self._fail(
            f"refusing a pickle that would build about {estimate:,} bytes of objects from {end:,} bytes "
            f"({estimate / max(end, 1):.0f} per byte; a snapshot takes at most {BUILD_BYTES_PER_BYTE}): it "
            "is not a memory snapshot")

    def check_so_far(self) -> None:
        """Refuse, while the bytes still arrive, a pickle whose first part is already far over the bound
        (by 64 MiB: a snapshot's parts all estimate well under it), so an endless stream of empty dicts
        is not read to :data:`~memviz.snapshots.load.MAX_STREAM_BYTES`."""
        estimate = self._estimate()
        if estimate > BUILD_BYTES_PER_BYTE * self.pos + (64 << 20):
            raise self._over_budget(estimate, self.pos)

    def finish(self, data: bytes | bytearray) -> ScanResult:
        """The scan of the whole of ``data``: refuses a truncated pickle or one over the memory bound."""
        self.feed(data)
        if self.stop is None and self.stack_global_at is None:
            raise self._fail(f"truncated pickle (ran out of input at byte {self.pos} of {len(data)})")
        end = self.stop if self.stop is not None else self.pos
        estimate = self._estimate()
        if estimate > BUILD_BYTES_PER_BYTE * max(end, 4096):
            raise self._over_budget(estimate, end)
        return ScanResult(end, estimate, self.stack_global_at)
