"""Spec vectors (allocator-spec.md §16 and sequences A-E), config parsing, OOM text and bad frees."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import memviz.sim as sim_pkg
from memviz.sim import (
    AllocatorConfigError,
    CachingAllocator,
    InvalidFreeError,
    OutOfMemoryError,
    format_size,
    parse_alloc_conf,
)

MiB = 1 << 20
H200 = 150109880320

# request, pool, block size, segment size, free remainder  (spec §16)
VECTORS = [
    (1, "small", 512, 2097152, 2096640),
    (511, "small", 512, 2097152, 2096640),
    (512, "small", 512, 2097152, 2096640),
    (513, "small", 1024, 2097152, 2096128),
    (1000, "small", 1024, 2097152, 2096128),
    (1048575, "small", 1048576, 2097152, 1048576),
    (1048576, "small", 1048576, 2097152, 1048576),
    (1048577, "large", 1049088, 20971520, 19922432),
    (2097152, "large", 2097152, 20971520, 18874368),
    (5242883, "large", 5243392, 20971520, 15728128),
    (10485248, "large", 10485248, 20971520, 10486272),
    (10485759, "large", 10485760, 10485760, 0),
    (10485760, "large", 10485760, 10485760, 0),
    (10485761, "large", 10486272, 12582912, 2096640),
    (19922944, "large", 20971520, 20971520, 0),
    (20971519, "large", 20971520, 20971520, 0),
    (20971520, "large", 20971520, 20971520, 0),
    (22020096, "large", 23068672, 23068672, 0),
    (104857605, "large", 104858112, 106954752, 2096640),
]


@pytest.mark.parametrize(("req", "pool", "block", "segment", "remainder"), VECTORS)
def test_spec_vector(req: int, pool: str, block: int, segment: int, remainder: int) -> None:
    a = CachingAllocator(H200)
    p = a.malloc(req)
    s = a.memory_stats()
    other = "small_pool" if pool == "large" else "large_pool"
    assert s[f"allocated_bytes.{pool}_pool.current"] == block
    assert s[f"reserved_bytes.{pool}_pool.current"] == segment
    assert s[f"reserved_bytes.{other}.current"] == 0
    assert s["requested_bytes.all.current"] == req
    assert s["inactive_split_bytes.all.current"] == remainder
    assert s["inactive_split.all.current"] == (1 if remainder else 0)
    assert a.requested_size(p) == req and a.block_size(p) == block
    a.free(p)
    a.empty_cache()
    assert a.memory_reserved() == 0
    a._check()


def test_sequence_a_packing() -> None:
    a = CachingAllocator(H200)
    ps = [a.malloc(6 * MiB) for _ in range(4)]
    s = a.memory_stats()
    assert (s["reserved_bytes.all.current"], s["allocated_bytes.all.current"]) == (41943040, 25165824)
    assert (s["inactive_split.all.current"], s["inactive_split_bytes.all.current"]) == (2, 16777216)
    a.free(ps[1])
    s = a.memory_stats()
    assert (s["inactive_split.all.current"], s["inactive_split_bytes.all.current"]) == (3, 23068672)
    a.empty_cache()
    assert a.memory_stats()["num_sync_all_streams"] == 1 and a.memory_reserved() == 41943040
    a.free(ps[3])
    s = a.memory_stats()
    assert (s["inactive_split.all.current"], s["inactive_split_bytes.all.current"]) == (2, 8388608)
    a._check()


def test_sequence_b_small_pool() -> None:
    a = CachingAllocator(H200)
    ps = [a.malloc(512 * 1024) for _ in range(5)]
    s = a.memory_stats()
    assert (s["inactive_split.all.current"], s["reserved_bytes.all.current"]) == (1, 4194304)
    a.free(ps[0])
    a.free(ps[3])
    s = a.memory_stats()
    assert (s["inactive_split.all.current"], s["inactive_split_bytes.all.current"]) == (3, 2621440)


def test_sequence_c_stale_requested_size() -> None:
    a = CachingAllocator(H200)
    a.free(a.malloc(30 * MiB))
    p = a.malloc(25 * MiB)
    s = a.memory_stats()
    assert s["num_device_alloc"] == 1 and s["inactive_split_bytes.all.current"] == 5242880
    blocks = a.snapshot()["segments"][0]["blocks"]
    assert [(b["size"], b["requested_size"], b["state"]) for b in blocks] == [
        (25 * MiB, 25 * MiB, "active_allocated"), (5 * MiB, 30 * MiB, "inactive")]
    a.free(p)
    a.malloc(7 * MiB)
    assert a.memory_stats()["inactive_split_bytes.all.current"] == 24117248


def test_sequence_d_max_split() -> None:
    a = CachingAllocator(H200, alloc_conf="max_split_size_mb:40")
    assert a.memory_stats()["max_split_size"] == 41943040
    p = a.malloc(50 * MiB)
    s = a.memory_stats()
    assert s["oversize_allocations.current"] == 1 and s["oversize_segments.current"] == 1
    a.free(p)
    p = a.malloc(45 * MiB)
    s = a.memory_stats()
    assert (s["allocated_bytes.all.current"], s["requested_bytes.all.current"]) == (52428800, 47185920)
    a.free(p)
    a.free(a.malloc(30 * MiB))
    assert a.memory_stats()["segment.all.current"] == 2
    a.free(a.malloc(72 * MiB))
    assert a.memory_stats()["oversize_segments.current"] == 2
    p = a.malloc(31 * MiB)
    assert a.block_size(p) == 32 * MiB
    a.free(p)
    a.empty_cache()
    assert a.memory_stats()["num_device_free"] == 4  # the cached 50, 30, 72 and 32 MiB segments
    a._check()


def test_sequence_e_oom_counters() -> None:
    a = CachingAllocator(H200)
    a.reset_accumulated_memory_stats()
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(2**41)
    s = a.memory_stats()
    counters = (s["num_alloc_retries"], s["num_sync_all_streams"], s["num_ooms"], s["num_device_alloc"])
    assert counters == (1, 1, 1, 0)
    assert str(e.value).startswith("CUDA out of memory. Tried to allocate 2048.00 GiB. GPU 0 has a total "
                                   "capacity of 139.80 GiB of which 139.80 GiB is free. Of the allocated")
    assert e.value.alloc_size_bytes == 2**41 and e.value.requested_bytes == 2**41


def test_exabyte_request_changes_nothing() -> None:
    a = CachingAllocator(H200)
    before = a.memory_stats()
    with pytest.raises(OutOfMemoryError, match=r"Tried to allocate more than 1EB memory\."):
        a.malloc(2**60)
    assert a.memory_stats() == before


def test_bad_sizes_change_nothing() -> None:
    a = CachingAllocator(H200)
    before = a.memory_stats()
    assert a.malloc(0) == 0
    a.free(0)
    with pytest.raises(ValueError):
        a.malloc(-1)
    with pytest.raises(TypeError):
        a.malloc(1.5)
    with pytest.raises(TypeError):
        a.malloc(True)
    assert a.memory_stats() == before


def test_bad_free_changes_nothing() -> None:
    a = CachingAllocator(H200)
    p = a.malloc(4096)
    q = a.malloc(8 * MiB)
    a.free(q)
    before = (a.memory_stats(), a.snapshot()["segments"])
    for bad in (q, p + 512, 12345):
        with pytest.raises(InvalidFreeError):
            a.free(bad)
    assert (a.memory_stats(), a.snapshot()["segments"]) == before
    a._check()


def test_expandable_sequence() -> None:
    a = CachingAllocator(H200, alloc_conf="expandable_segments:True")
    pa = a.malloc(6 * MiB)
    pb = a.malloc(6 * MiB)
    pc = a.malloc(30 * MiB)
    s = a.memory_stats()
    assert s["reserved_bytes.all.current"] == 60 * MiB
    assert (s["num_device_alloc"], s["segment.all.current"]) == (2, 0)
    ps = a.malloc(1000)
    a.free(pb)
    a.empty_cache()
    assert a.memory_reserved() == 62 * MiB
    a.free(pc)
    a.empty_cache()
    assert a.memory_reserved() == 22 * MiB and a.memory_stats()["num_device_free"] == 1
    a.free(pa)
    a.free(ps)
    a.empty_cache()
    assert a.memory_reserved() == 0 and a.memory_stats()["num_device_free"] == 3
    a.malloc(50 * MiB)
    a.malloc(3 * MiB)
    segs = a.snapshot()["segments"]
    assert [[b["size"] for b in s["blocks"]] for s in segs] == [[50 * MiB, 3 * MiB, 7 * MiB]]
    assert segs[0]["is_expandable"] and a.memory_stats()["num_device_alloc"] == 4
    a._check()


def test_memory_fraction_limit() -> None:
    a = CachingAllocator(H200, memory_fraction=0.01)
    assert a.allowed_memory_bytes == 1501098803
    ps = [a.malloc(8 * MiB) for _ in range(142)]
    assert a.memory_reserved() == 71 * 20 * MiB
    for p in ps[::2]:
        a.free(p)
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(12 * MiB)
    s = a.memory_stats()
    assert (s["inactive_split.all.current"], s["inactive_split_bytes.all.current"]) == (142, 893386752)
    assert "1.40 GiB allowed; Of the allocated memory 568.00 MiB is allocated by PyTorch, and 852.00 MiB " \
           "is reserved by PyTorch but unallocated." in str(e.value)
    with pytest.raises(ValueError):
        a.set_memory_fraction(1.5)
    a.set_memory_fraction(1.0)
    assert a.allowed_memory_bytes is None


def test_oom_messages_match_recordings() -> None:
    """Every recorded OOM message, from "Tried to allocate" up to the NVML process list, and its tail."""
    path = Path(__file__).parent / "data" / "golden" / "default.json.gz"
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    meta = data["meta"]
    checked = 0
    for trace in data["traces"]:
        if trace["name"] not in ("fragmentation", "random-2"):
            continue
        a = CachingAllocator(meta["total_memory"], memory_fraction=meta["fraction"])
        live = {}
        for op in trace["ops"]:
            if op["op"] == "alloc":
                try:
                    live[op["id"]] = a.malloc(op["size"])
                except OutOfMemoryError as e:
                    got, want = str(e), op["msg"]
                    assert got.split(" GPU 0 has")[0] == want.split(" GPU 0 has")[0]
                    assert got[got.index("allowed; "):] == want[want.index("allowed; "):]
                    checked += 1
            elif op["op"] == "free":
                a.free(live.pop(op["id"]))
            elif op["op"] == "empty_cache":
                a.empty_cache()
    assert checked >= 3


def test_oom_message_with_context_bytes() -> None:
    a = CachingAllocator(1 << 30, context_bytes=512 * MiB, device_name="GPU 3")
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(600 * MiB)
    msg = str(e.value)
    assert "GPU 3 has a total capacity of 1024.00 MiB of which 512.00 MiB is free. Including non-PyTorch " \
           "memory, this process has 512.00 MiB memory in use. Of the allocated" in msg
    assert e.value.device_free_bytes == 512 * MiB


@pytest.mark.parametrize(("n", "text"), [(1024, "1024 bytes"), (1025, "1.00 KiB"), (MiB, "1024.00 KiB"),
                                         (20 * MiB, "20.00 MiB"), (1 << 30, "1024.00 MiB"),
                                         (2**41, "2048.00 GiB")])
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


def test_roundup_power2_divisions() -> None:
    a = CachingAllocator(H200, alloc_conf="roundup_power2_divisions:4")
    for req, want in [(1200, 1536), (3000, 3072), (5 * MiB + 1, 6 * MiB), (33 * MiB, 40 * MiB),
                      (1500 * MiB + 7, 1536 * MiB)]:
        assert a.round_size(req) == want
    b = CachingAllocator(H200, alloc_conf="roundup_power2_divisions:[256:1,512:2,>:4]")
    assert b.round_size(300 * MiB + 1) == 300 * MiB + 512
    assert b.round_size(600 * MiB + 1) == 768 * MiB
    assert b.round_size(1100 * MiB + 1) == 1280 * MiB


def test_config_lists() -> None:
    cfg = parse_alloc_conf("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]")
    assert cfg.roundup_power2_divisions == (8,) * 7 + (0, 4, 0, 4) + (1,) * 5
    cfg = parse_alloc_conf(" expandable_segments : True , max_split_size_mb:128,"
                           "garbage_collection_threshold:0.6")
    assert cfg.expandable_segments and cfg.max_split_size == 128 * MiB
    assert cfg.garbage_collection_threshold == 0.6
    assert parse_alloc_conf("large_segment_size_mb:32").max_non_split_rounding_size == 32 * MiB


@pytest.mark.parametrize(("conf", "needle"), [
    ("max_split_size_mb:10", "CachingAllocator option max_split_size_mb too small, must be >= 20"),
    ("max_non_split_rounding_mb:1", "max_non_split_rounding_mb too small"),
    ("max_split_size_mb:abc", "max_split_size_mb"),
    ("garbage_collection_threshold:1.5", "garbage_collect_threshold is invalid"),
    ("expandable_segments:true", "Expected 'True' or 'False'"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("roundup_power2_divisions:[100:2]", "intervals have to be power of 2"),
    ("foo:1", "Unrecognized key 'foo'"),
    ("max_split_size_mb", "max_split_size_mb"),
    ("max_split_size_mb:64;expandable_segments:True", "max_split_size_mb"),
    ("large_segment_size_mb:8", "large_segment_size_mb too small"),
    ("backend:cudaMallocAsync", "native backend only"),
    ("per_process_memory_fraction:2", "per_process_memory_fraction"),
])
def test_config_errors(conf: str, needle: str) -> None:
    with pytest.raises(AllocatorConfigError, match=None) as e:
        CachingAllocator(H200, alloc_conf=conf)
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)


def test_snapshot_shape_and_trace() -> None:
    a = CachingAllocator(H200)
    p = a.malloc(100)
    a.free(p)
    snap = a.snapshot()
    seg = snap["segments"][0]
    assert list(seg) == ["device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                         "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"]
    assert list(seg["blocks"][0]) == ["address", "size", "requested_size", "state", "frames"]
    actions = [e["action"] for e in snap["device_traces"][0]]
    # torch collects the trace, then records the snapshot entry: it shows in the next snapshot (H200, 2.11)
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed"]
    assert [e["action"] for e in a.snapshot()["device_traces"][0]][-1] == "snapshot"
    assert snap["allocator_settings"]["max_split_size"] == -1
    assert list(snap["allocator_settings"]["roundup_power2_divisions"])[-1] == "32768"


def test_summary_and_peaks() -> None:
    a = CachingAllocator(H200)
    p = a.malloc(3 * MiB)
    a.free(p)
    text = a.memory_summary()
    assert "PyTorch CUDA memory summary, device ID 0" in text and "Allocated memory" in text
    assert all(len(line) == 77 for line in text.splitlines())
    assert a.max_memory_allocated() == 3 * MiB
    a.reset_peak_memory_stats()
    assert a.max_memory_allocated() == 0 and a.max_memory_reserved() == 20 * MiB


def test_all_is_public_and_importable() -> None:
    # the order is ruff's (RUF022: constants, classes, functions)
    assert {"CachingAllocator", "OutOfMemoryError", "Op", "replay", "fraction_for_cap"} <= set(sim_pkg.__all__)
    assert all(hasattr(sim_pkg, name) for name in sim_pkg.__all__)
