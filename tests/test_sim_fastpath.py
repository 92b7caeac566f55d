"""The fast paths (memviz.sim._fastpath) against the methods they stand for, op by op.

``CachingAllocator`` runs ``malloc``, ``alloc_found_block``, ``free`` and ``free_block`` as
:mod:`memviz.sim._fastpath` writes them (calls inlined); ``fast_paths=False`` runs the methods, which read
line by line with CUDACachingAllocator.cpp. The golden tests check the fast paths against the H200; these
check that the readable methods do exactly what the fast paths do: the same address or OOM for every request,
every counter after every op (the stat lists every ``memory_stats()`` key is read from), and the same
segments (addresses, blocks, states, requested sizes) and trace at every snapshot and at the end.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memviz.errors import MemvizError
from memviz.sim import CachingAllocator, CUDAGraph, MemPool, OutOfMemoryError

MiB = 1 << 20
GOLDEN = Path(__file__).parent / "data" / "golden"


def _counters(a: CachingAllocator) -> tuple:
    """Every stored counter (``memory_stats()`` is computed from these alone)."""
    s = a.stats
    return (tuple(s.small), tuple(s.large), tuple(s.agg), tuple(map(tuple, s.pending)), tuple(map(tuple, s._base)),
            s.num_alloc_retries, s.num_device_alloc, s.num_device_free, s.num_ooms, s.num_sync_all_streams,
            a.total_allocated_memory)


def _state(a: CachingAllocator) -> tuple:
    return a.segments(), list(a.trace_records()), a.memory_stats()


class Pair:
    """The same calls on a fast-path and a readable-path allocator; each call's outcome and counters compared."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.fast = CachingAllocator(*args, **kwargs)
        self.readable = CachingAllocator(*args, fast_paths=False, **kwargs)
        assert self.fast.malloc.__func__ is not self.readable.malloc.__func__

    def call(self, name: str, *args: object, **kwargs: object) -> object:
        outcomes = []
        for a in (self.fast, self.readable):
            try:
                outcomes.append(("ok", getattr(a, name)(*args, **kwargs)))
            except MemvizError as e:  # OOM, invalid free, bad input: the same error, the same message
                outcomes.append((type(e).__name__, str(e)))
        assert outcomes[0] == outcomes[1], f"{name}{args}: {outcomes}"
        assert _counters(self.fast) == _counters(self.readable), f"counters differ after {name}{args}"
        return outcomes[0][1] if outcomes[0][0] == "ok" else None

    def check_state(self) -> None:
        assert _state(self.fast) == _state(self.readable)


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.json.gz")))
def test_golden_traces_run_the_same_both_ways(name: str) -> None:
    """Every recorded trace of one config (default, expandable, gc_threshold, max_split_64, roundup4)."""
    with gzip.open(GOLDEN / name, "rt") as f:
        data = json.load(f)
    meta = data["meta"]
    for trace in data["traces"]:
        pair = Pair(meta["total_memory"], memory_fraction=meta["fraction"], alloc_conf=meta["alloc_conf"])
        live: dict[int, int] = {}
        for op in trace["ops"]:
            kind = op["op"]
            if kind == "alloc":
                ptr = pair.call("malloc", op["size"])
                if ptr is not None:
                    live[op["id"]] = ptr
            elif kind == "free" and op["id"] in live:
                pair.call("free", live.pop(op["id"]))
            elif kind == "empty_cache":
                pair.call("empty_cache")
            elif kind == "snapshot":
                assert pair.fast.segments() == pair.readable.segments()
        pair.check_state()


STREAMS = (0, 0x100, 0x200)
# the size rules' edges too: 512 bytes, the small pool's 1 MiB, 10 MiB (kMinLargeAlloc), 2 MiB steps, the configs'
# max_split_size (20 and 40 MiB)
EDGES = [n + d for n in (512, MiB, 2 * MiB, 10 * MiB, 20 * MiB, 40 * MiB) for d in (-1, 0, 1)]
SIZES = st.one_of(st.integers(1, 4096), st.integers(4097, 2 * MiB), st.integers(2 * MiB, 50 * MiB),
                  st.sampled_from(EDGES))
KINDS = ["malloc", "malloc", "malloc", "malloc", "free", "free", "free", "record_free", "record", "sync",
         "sync_one", "empty", "capture", "end", "pool", "unpool", "reset", "settings", "bad_free", "bad_malloc",
         "reset_peak", "reset_accumulated"]
# set_allocator_settings calls; each also names the config's own max_split_size and garbage collection threshold,
# which a call that does not name them resets (and a max_split_size changed under split blocks is not modelled)
SETTINGS = ["expandable_segments:True", "expandable_segments:False", "roundup_power2_divisions:4", ""]
OPS = st.lists(st.tuples(st.sampled_from(KINDS), SIZES, st.sampled_from(STREAMS), st.integers(0, 1 << 30)),
               min_size=1, max_size=80)
CONFS = ["", "expandable_segments:True", "max_split_size_mb:20", "roundup_power2_divisions:[1:4,>:8]",
         "garbage_collection_threshold:0.6", "max_split_size_mb:40,garbage_collection_threshold:0.5"]


@pytest.mark.parametrize("conf", CONFS)
def test_size_rule_edges_run_the_same_both_ways(conf: str) -> None:
    """Each edge size requested after a cached block of each of a range of sizes was freed (beside a live block
    in a small segment, or a whole large segment): where rounding, best fit and splitting change their answer."""
    cached = [512, MiB, 2 * MiB, 5 * MiB, 12 * MiB, 20 * MiB, 22 * MiB, 30 * MiB, 39 * MiB, 41 * MiB, 64 * MiB]
    fraction = 0.8 if "garbage" in conf else None
    for first in cached:
        for edge in EDGES:
            pair = Pair(1 << 30, memory_fraction=fraction, alloc_conf=conf)
            kept = pair.call("malloc", MiB)
            freed = pair.call("malloc", first)
            pair.call("free", freed)
            for size in (edge, edge, first):
                pair.call("malloc", size)
            pair.call("free", kept)
            pair.call("empty_cache")
            pair.check_state()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conf=st.sampled_from(CONFS), capacity_mb=st.integers(40, 300), ops=OPS)
def test_random_programs_run_the_same_both_ways(conf: str, capacity_mb: int, ops: list) -> None:
    """Short programs, shrunk to the fewest ops that differ when one does."""
    run_both_ways(conf, capacity_mb, ops)


@pytest.mark.parametrize("seed", range(12))
def test_long_seeded_programs_run_the_same_both_ways(seed: int) -> None:
    """3,000 ops a program, the kinds and sizes drawn as above: deep states (long-lived splits, full devices)
    that short programs do not reach, such as a request of exactly max_split_size served by a larger block."""
    rng = random.Random(seed)
    sizes = (lambda: rng.randint(1, 4096), lambda: rng.randint(4097, 2 * MiB), lambda: rng.randint(2 * MiB, 50 * MiB),
             lambda: rng.choice(EDGES))
    ops = [(rng.choice(KINDS), rng.choice(sizes)(), rng.choice(STREAMS) if rng.random() < 0.2 else 0,
            rng.randrange(1 << 30)) for _ in range(3000)]
    run_both_ways(CONFS[seed % len(CONFS)], rng.randint(40, 300), ops)


def run_both_ways(conf: str, capacity_mb: int, ops: list[tuple[str, int, int, int]]) -> None:
    """Run ``ops`` (kind, size in bytes, stream, a number that picks among live blocks, graphs, settings) on a
    ``capacity_mb`` device both ways. Streams, record_stream's delayed frees, graph captures and MemPools,
    settings changed at run time, the garbage collector (with a memory fraction), OOMs, bad frees and sizes."""
    fraction = 0.8 if "garbage" in conf else None
    pair = Pair(capacity_mb * MiB, memory_fraction=fraction, alloc_conf=conf)
    fast, readable = pair.fast, pair.readable
    live: list[int] = []
    freed: list[int] = []
    graphs: list[tuple[CUDAGraph, CUDAGraph]] = []
    capturing: tuple[CUDAGraph, CUDAGraph] | None = None
    pools: tuple[MemPool, MemPool] | None = None
    in_pool = False
    for kind, size, stream, pick in ops:
        if kind == "malloc":
            ptr = pair.call("malloc", size, stream)
            if ptr is not None:
                live.append(ptr)
        elif kind == "free" and live:
            freed.append(live.pop(pick % len(live)))
            pair.call("free", freed[-1])
        elif kind == "record_free" and live:
            freed.append(live.pop(pick % len(live)))
            pair.call("record_stream", freed[-1], STREAMS[(pick >> 3) % 3])
            pair.call("free", freed[-1])
        elif kind == "record" and live:
            pair.call("record_stream", live[pick % len(live)], STREAMS[pick % 3])
        elif kind == "sync":
            pair.call("synchronize")
        elif kind == "sync_one":
            pair.call("synchronize", stream)
        elif kind == "empty":
            pair.call("empty_cache")
        elif kind == "capture" and capturing is None:
            capturing = (CUDAGraph(fast), CUDAGraph(readable))
            shared = graphs[0] if graphs and pick % 2 else None
            ooms = []
            for g, pool_of in zip(capturing, (0, 1), strict=True):
                try:  # the first capture's generator tensors may not fit
                    g.capture_begin(shared[pool_of].pool() if shared else None, stream=stream)
                    ooms.append(False)
                except OutOfMemoryError:
                    ooms.append(True)
            assert ooms[0] == ooms[1] and _counters(fast) == _counters(readable)
            if ooms[0]:
                for g in capturing:
                    g.delete()
                capturing = None
        elif kind == "end" and capturing is not None:
            for g in capturing:
                g.capture_end()
            graphs.append(capturing)
            capturing = None
        elif kind == "pool" and not in_pool:
            pools = pools or (MemPool(fast), MemPool(readable))
            assert pools[0].id == pools[1].id
            pair.call("begin_allocate_to_pool", pools[0].id)
            in_pool = True
        elif kind == "unpool" and in_pool and pools is not None:
            pair.call("end_allocate_to_pool", pools[0].id)
            pair.call("release_pool", pools[0].id)
            in_pool = False
        elif kind == "reset" and graphs:
            for g in graphs.pop(pick % len(graphs)):
                g.delete()
            assert _counters(fast) == _counters(readable)
        elif kind == "settings":
            kept = [o for o in conf.split(",") if o.startswith(("max_split_size_mb", "garbage_collection"))]
            pair.call("set_allocator_settings", ",".join([SETTINGS[pick % len(SETTINGS)], *kept]).strip(","))
        elif kind == "bad_free":  # a free of 0, of None, of an address never returned, of one freed already
            stale = [p for p in freed[-1:] if fast.live_block(p) is None]  # not handed out again since
            pair.call("free", (0, None, pick | 1, *stale)[pick % (3 + len(stale))])
        elif kind == "bad_malloc":  # 0 bytes, a negative size, 1 EB
            pair.call("malloc", (0, -size, 1 << 60)[pick % 3])
        elif kind == "reset_peak":
            pair.call("reset_peak_memory_stats")
        elif kind == "reset_accumulated":
            pair.call("reset_accumulated_memory_stats")
    pair.check_state()
