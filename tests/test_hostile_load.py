"""The snapshot loader under attack: issue 16's reproducers at the sizes that blew up, and property tests.

Each reproducer runs in a fresh Python under a 2 GiB address-space limit and a 20 s timeout (as the
held-out checks do) and must end with a SnapshotError, fast, with its memory within the bound the
loader's docstring states (35 bytes per byte of file, plus the interpreter).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import re
import resource
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memviz.snapshots import SnapshotError, load_snapshot, loads_snapshot, validate_snapshot
from memviz.snapshots.load import MAX_DEPTH

DATA = Path(__file__).parent / "data" / "snapshots"
TRAIN = DATA / "train_snapshot.pickle"
ROOT = Path(__file__).parent.parent

_CHILD = textwrap.dedent("""
    import resource, sys, time
    from memviz.snapshots import SnapshotError, load_snapshot
    path = sys.argv[1]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    try:
        load_snapshot(path)
        print("LOADED")
    except SnapshotError as exc:
        print("SNAPSHOTERROR", str(exc)[:300])
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("GROWTH", rss1 - rss0, "SECONDS", time.perf_counter() - t)
""")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _load_in_child(path: str | Path) -> tuple[str, int]:
    """load_snapshot(path) in a child under 2 GiB of address space and 20 s: (its output, RSS growth)."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=20,
                          preexec_fn=_limited, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    growth = int(out.split("GROWTH ")[1].split()[0])
    return out, growth


REPRODUCERS = {
    # 1. one block referred to by 10,000 segments x 10,000 blocks: was 72 s and 7.7 GB, then MemoryError
    "shared_references": (
        lambda: pickle.dumps({"segments": [{"address": 0, "total_size": 512 * 10_000, "blocks":
                             [{"size": 512, "state": "inactive"}] * 10_000}] * 10_000, "device_traces": [[]]},
                             protocol=4),
        "is the same object as"),
    # 2. a list nested 10^6 deep: was 50 s (location strings rebuilt at every level)
    "deep_nesting": (
        lambda: b"\x80\x04}(\x8c\x08segments]\x8c\x01x" + b"]" * 10**6 + b"a" * (10**6 - 1) + b"u.",
        "refusing a pickle that would build"),
    # 2'. as deep, but padded with strings so that it passes the memory estimate: the depth check refuses it
    "deep_nesting_padded": (
        lambda: b"\x80\x04}(\x8c\x08segments]\x8c\x01x" + (b"]\x8c\x40" + b"p" * 64 + b"a") * 100_000
        + b"a" * (100_000 - 1) + b"u.",
        f"nests deeper than {MAX_DEPTH} levels"),
    # 8. a 10 MB flat list in place of the segments: was 1.5 GB, the whole list scanned before the error
    "flat_list_10MB": (lambda: pickle.dumps({"segments": [0] * 5_000_000}, protocol=4),
                       r"segments[0]: a segment must be a dict, got int"),
    # 8. 10 MB of distinct empty dicts: 48 bytes of objects per byte of file
    "flat_dicts_10MB": (lambda: b"\x80\x04}\x94(\x8c\x08segments\x94]\x94(" + b"}\x94" * 5_000_000 + b"eu.",
                        "refusing a pickle that would build"),
    # 8. a 7-byte pickle whose memo index would size the unpickler's memo table to 16 GiB
    "memo_index": (lambda: b"\x80\x04N" + b"r\xff\xff\xff\x7f" + b".", "memo index 2,147,483,647"),
    # a 2**40-byte string announced in a 20-byte file
    "length_claim": (lambda: b"\x80\x04\x8d" + (1 << 40).to_bytes(8, "little") + b"abc", "announces"),
}


@pytest.mark.parametrize("case", sorted(REPRODUCERS))
def test_reproducer_is_refused_fast_and_small(tmp_path, case):
    make, expected = REPRODUCERS[case]
    path = tmp_path / f"{case}.pickle"
    path.write_bytes(make())
    out, growth = _load_in_child(path)
    assert "SNAPSHOTERROR" in out and expected in out, out
    assert growth <= 35 * path.stat().st_size + (64 << 20), (growth, path.stat().st_size)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_devices_are_refused_after_the_first_chunk(device):
    out, growth = _load_in_child(device)
    assert "SNAPSHOTERROR" in out and device in out
    assert growth < 64 << 20


def test_real_snapshot_loads_within_the_bound():
    path = DATA / "workload" / "workload_default.pickle"
    out, growth = _load_in_child(path)
    assert "LOADED" in out
    assert growth <= 35 * path.stat().st_size


@pytest.mark.parametrize(("head", "body", "match"), [(b"", b"\x00", "not a pickle opcode"),
                                                     (b"\x80\x04", b"}", "refusing a pickle that would build")])
def test_a_pipe_that_never_ends_is_refused_early(head, body, match):
    read_fd, write_fd = os.pipe()

    def feed() -> None:
        try:
            with os.fdopen(write_fd, "wb") as w:
                w.write(head)
                while True:
                    w.write(body * 65536)
        except OSError:  # the reader closed the pipe
            pass

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    with os.fdopen(read_fd, "rb") as r, pytest.raises(SnapshotError, match=match) as info:
        load_snapshot(r)
    thread.join(5)
    if body == b"}":  # refused after its first megabytes, not read to MAX_STREAM_BYTES
        read = re.search(r"from ([\d,]+) bytes", str(info.value))
        assert read is not None and int(read.group(1).replace(",", "")) < 8 << 20


# -- shared references, cycles, depth -------------------------------------------------------------------


def _block(size=512, state="inactive"):
    return {"size": size, "state": state}


def _segment(blocks, address=0):
    return {"address": address, "total_size": sum(b["size"] for b in blocks), "blocks": blocks}


@pytest.mark.parametrize(
    ("make", "where"),
    [
        (lambda b: {"segments": [_segment([b, b])]}, r"segments\[0\]\.blocks\[1\] is the same object as "
                                                     r"segments\[0\]\.blocks\[0\]"),
        (lambda b: {"segments": [_segment([b]), _segment([b], 512)]}, r"segments\[1\]\.blocks\[0\]"),
        (lambda b: (lambda s: {"segments": [s, s]})(_segment([b])), r"segments\[1\] is the same object as "
                                                                     r"segments\[0\]"),
        (lambda b: (lambda bl: {"segments": [_segment(bl), _segment(bl, 512)]})([b]), r"segments\[1\]\.blocks is the"),
        (lambda b: (lambda e: {"segments": [], "device_traces": [[e, e]]})({"action": "alloc", "addr": 0, "size": 1}),
         r"device_traces\[0\]\[1\] is the same object"),
    ],
)
def test_shared_segments_blocks_and_events_are_refused(make, where):
    snap = make(_block())
    with pytest.raises(SnapshotError, match=where):
        load_snapshot(snap)
    with pytest.raises(SnapshotError, match=where):
        loads_snapshot(pickle.dumps(snap, protocol=4))


def test_shared_frames_are_fine():
    frames = [{"name": "f", "filename": "a.py", "line": 1}] * 40  # torch shares frame dicts
    blocks = [dict(_block(), frames=frames) for _ in range(100)]
    snap = loads_snapshot(pickle.dumps({"segments": [_segment(blocks)]}, protocol=4))
    assert snap["segments"][0]["blocks"][99]["frames"] is snap["segments"][0]["blocks"][0]["frames"]


def test_cycle_is_refused():
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(SnapshotError, match=r"snapshot\['x'\]\[0\] contains itself"):
        loads_snapshot(pickle.dumps({"segments": [], "x": cycle}, protocol=4))


def test_depth_limit_names_the_place_briefly():
    deep: list = ["leaf"]
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(SnapshotError, match=rf"nests deeper than {MAX_DEPTH}") as info:
        load_snapshot({"segments": [], "x": deep})
    assert "levels)..." in str(info.value) and len(str(info.value)) < 400
    ok: list = ["leaf"]
    for _ in range(MAX_DEPTH - 2):  # the snapshot dict is one level, the innermost list another
        ok = [ok]
    assert load_snapshot({"segments": [], "x": ok})["x"] is ok


def test_a_dag_of_shared_values_is_walked_once():
    level: list = [1]
    for _ in range(30):  # 2**30 paths through 31 lists
        level = [level, level]
    assert load_snapshot({"segments": [], "x": level})["x"] is level


# -- numbers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "match"),
    [
        ({"action": "alloc", "addr": 2**64, "size": 1}, "'addr' must be an int from 0 to 2\\*\\*63-1, got 18446"),
        ({"action": "alloc", "addr": 10**400, "size": 1}, "got an int of 1329 bits"),
        ({"action": "alloc", "addr": 0, "size": 1, "time_us": 1.5}, "'time_us' must be an int"),
        ({"action": "alloc", "addr": 0, "size": 1, "stream": -1}, "'stream' must be an int"),
        ({"action": "oom", "size": True}, "'size' must be an int"),
    ],
)
def test_trace_numbers_have_type_and_int64_range(event, match):
    with pytest.raises(SnapshotError, match=match):
        load_snapshot({"segments": [], "device_traces": [[event]]})


def test_huge_block_size_is_refused_without_printing_it():
    seg = {"address": 0, "total_size": 10**5000, "blocks": [{"size": 10**5000, "state": "inactive"}]}
    with pytest.raises(SnapshotError, match="an int of 16610 bits"):
        load_snapshot({"segments": [seg]})


# -- what the file is --------------------------------------------------------------------------------


def test_text_mode_file_of_a_real_pickle_says_open_it_with_rb():
    with open(TRAIN) as f, pytest.raises(SnapshotError, match="open it with 'rb'"):
        load_snapshot(f)
    with open(TRAIN, encoding="latin-1") as f, pytest.raises(SnapshotError, match="open it with 'rb'"):
        load_snapshot(f)


def test_torch_save_files_say_what_they_are(tmp_path):
    torch = pytest.importorskip("torch")
    zipped, legacy = tmp_path / "model.pt", tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(3)}, zipped)
    torch.save({"w": torch.zeros(3)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(SnapshotError, match=r"model\.pt: this is a zip archive, as torch\.save\(\) writes.*"
                                            r"_dump_snapshot.*torch\.load\(path, weights_only=True\)"):
        load_snapshot(zipped)
    with pytest.raises(SnapshotError, match=r"legacy\.pt: this is a torch\.save\(\) file.*_dump_snapshot"):
        load_snapshot(legacy)


def test_gzip_json_and_trailing_data(tmp_path):
    raw = TRAIN.read_bytes()
    gz = tmp_path / "snap.pickle.gz"
    gz.write_bytes(gzip.compress(raw))
    with pytest.raises(SnapshotError, match=r"gzip-compressed; pass gzip\.open\(path, 'rb'\)"):
        load_snapshot(gz)
    with gzip.open(gz, "rb") as f:
        assert load_snapshot(f) == load_snapshot(raw)
    with pytest.raises(SnapshotError, match="looks like text"):
        loads_snapshot(json.dumps({"segments": []}).encode())
    with pytest.raises(SnapshotError, match="5 bytes follow the end of the pickle"):
        loads_snapshot(raw + b"extra")


def test_file_object_sources():
    raw = TRAIN.read_bytes()
    assert load_snapshot(io.BytesIO(raw)) == load_snapshot(raw)
    with pytest.raises(SnapshotError, match="cannot load a snapshot from int"):
        load_snapshot(42)
    with pytest.raises(SnapshotError, match="takes the pickle's bytes, not str"):
        loads_snapshot("segments")


# -- property tests, one per class of input ------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
_plain = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.tuples(c, c)
                      | st.dictionaries(st.text(max_size=4), c, max_size=4), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_snapshot_error(data):
    try:
        snap = loads_snapshot(data)
    except SnapshotError:
        return
    assert isinstance(snap["segments"], list)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_plain, st.integers(0, 5))
def test_any_plain_object_loads_or_is_refused_the_same_way_as_its_dict(obj, protocol):
    data = pickle.dumps({"segments": [], "x": obj}, protocol=protocol)
    from_dict = load_snapshot({"segments": [], "x": obj})
    assert loads_snapshot(data) == from_dict


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_real_pickle_raises_only_snapshot_error(data):
    raw = bytearray(TRAIN.read_bytes()[:3000])
    raw += b"."
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(raw) - 1))
        raw[where] = data.draw(st.integers(0, 255))
    with contextlib.suppress(SnapshotError):
        loads_snapshot(bytes(raw))


_states = st.sampled_from(["active_allocated", "active_pending_free", "inactive"])
_blocks = st.lists(st.tuples(st.integers(1, 2**20).map(lambda n: n * 512), _states), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(_blocks, max_size=5), st.integers(0, 5))
def test_valid_snapshots_round_trip_every_protocol(layout, protocol):
    segments, address = [], 1 << 30
    for blocks in layout:
        bl = [{"size": s, "state": state} for s, state in blocks]
        segments.append({"address": address, "total_size": sum(s for s, _ in blocks), "blocks": bl})
        address += 1 << 40
    snap = {"segments": segments, "device_traces": [[{"action": "alloc", "addr": address, "size": 512}]]}
    loaded = loads_snapshot(pickle.dumps(snap, protocol=protocol))
    assert loaded == validate_snapshot(snap)
    assert [len(s["blocks"]) for s in loaded["segments"]] == [len(b) for b in layout]


def test_a_callers_dict_is_left_as_it_was_loaded_or_refused():
    import copy

    snap = {"segments": [{"address": 0, "total_size": 1024, "blocks": [{"size": 512, "state": "inactive"},
                                                                      {"size": 512, "state": "active_allocated"}]}]}
    before = copy.deepcopy(snap)
    loaded = load_snapshot(snap)
    assert snap == before and loaded["segments"][0]["blocks"][1]["address"] == 512
    snap["segments"].append(snap["segments"][0])
    before = copy.deepcopy(snap)
    with pytest.raises(SnapshotError, match="same object"):
        load_snapshot(snap)
    assert snap == before
