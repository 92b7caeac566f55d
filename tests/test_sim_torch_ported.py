"""PyTorch's own allocator tests, ported to memviz.sim: a peer suite.

Each test names its source: a test of pytorch/pytorch's test/test_cuda.py (class TestCuda, TestMemPool, or
TestCudaMallocAsync, whose native-backend cases are the allocator's), re-run with expandable segments
as test/test_cuda_expandable_segments.py does where the source runs there. A tensor becomes a ``malloc`` of
its storage bytes on the stream current at its creation, ``del`` a ``free``; ``torch.cuda.stream(s)`` is the
``stream=`` argument, ``Tensor.record_stream`` :meth:`CachingAllocator.record_stream`, ``synchronize()``
:meth:`CachingAllocator.synchronize`. What the GPU computes (sums, copies) is not simulated: those asserts
are left out and said so. What torch's own code allocates for a capture (the default generator's seed and
offset holders) :meth:`memviz.sim.CUDAGraph.capture_begin` allocates too, and ``del g`` is
:meth:`~memviz.sim.CUDAGraph.delete`.
"""

from __future__ import annotations

import random

import pytest

from memviz.errors import AllocatorConfigError
from memviz.sim import (
    CachingAllocator,
    CUDAGraph,
    MemPool,
    OutOfMemoryError,
    graph,
    graph_pool_handle,
    use_mem_pool,
)
from memviz.sim.rules import divisions_for

MiB = 1 << 20
GiB = 1 << 30
H200 = 150_754_820_096  # totalGlobalMem of the H200 the golden traces were recorded on
FLOAT = 4
kSmallSize, kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge = 1 * MiB, 2 * MiB, 20 * MiB, 10 * MiB, 2 * MiB
SIDE, OTHER = 0x5A00, 0x5B00  # two side streams (torch.cuda.Stream()): any ids but 0
CONFIGS = [pytest.param("", id="native"), pytest.param("expandable_segments:True", id="expandable")]


def _alloc(conf: str = "", total: int = H200, **kw: object) -> CachingAllocator:
    return CachingAllocator(total, alloc_conf=conf, **kw)


def _checked(a: CachingAllocator) -> None:
    a._check()


# ---------------------------------------------------------------------------------------- single stream


@pytest.mark.parametrize("conf", CONFIGS)
def test_memory_stats(conf: str) -> None:
    """test_cuda.py TestCuda.test_memory_stats (``_test_memory_stats_generator``): memory_allocated grows by
    each tensor's block and falls back when it dies; max_memory_allocated keeps the peak until reset."""
    a = _alloc(conf)
    last = a.memory_allocated()
    live = []
    for numel in (1, 10, 128, 1000, 256 * 1024, 1024 * 1024 * 3):
        live.append(a.malloc(numel * FLOAT))
        now = a.memory_allocated()
        assert now - last == a.round_size(numel * FLOAT)
        assert a.max_memory_allocated() >= now
        last = now
    peak = a.max_memory_allocated()
    for p in live:
        a.free(p)
    assert a.memory_allocated() == 0 and a.max_memory_allocated() == peak
    a.reset_peak_memory_stats()
    assert a.max_memory_allocated() == 0
    a.empty_cache()
    assert a.memory_reserved() == 0
    _checked(a)


@pytest.mark.parametrize("conf", CONFIGS)
def test_out_of_memory_retry(conf: str) -> None:
    """test_cuda.py TestCuda.test_out_of_memory_retry: half the device, twice, fails (the CUDA context holds
    some: 518 MiB on the H200, spec §12); after ``del a`` it fits."""
    a = _alloc(conf, total=16 * GiB, context_bytes=518 * MiB)
    size = int(a.total_memory * 0.5)
    first = a.malloc(size)
    with pytest.raises(OutOfMemoryError, match="Tried to allocate"):
        a.malloc(size)
    a.free(first)
    a.free(a.malloc(size))
    a.empty_cache()
    a.reset_peak_memory_stats()
    assert a.memory_stats()["num_ooms"] == 1
    _checked(a)


def test_set_per_process_memory_fraction() -> None:
    """test_cuda.py TestCuda.test_set_per_process_memory_fraction: with 0.5, 0.499 of the device less what is
    reserved fits; 0.5 of it does not (the fraction is on reserved bytes); bad fractions are refused."""
    a = _alloc(total=16 * GiB)
    for bad in (-0.1, 2.0):
        with pytest.raises(ValueError, match="fraction"):
            a.set_memory_fraction(bad)
    tensor = a.malloc(1024 * FLOAT)
    a.empty_cache()
    a.set_memory_fraction(0.5)
    application = int(a.total_memory * 0.499) - a.max_memory_reserved()
    a.free(a.malloc(application))
    a.empty_cache()
    with pytest.raises(OutOfMemoryError, match="allowed"):
        a.malloc(int(a.total_memory * 0.5))
    assert a.live_block(tensor) is not None  # the OOM left the live tensor alone
    _checked(a)


def test_get_per_process_memory_fraction() -> None:
    """test_cuda.py TestCuda.test_get_per_process_memory_fraction: the getter returns what was set (1.0 before)."""
    a = _alloc()
    assert a.get_memory_fraction() == 1.0
    a.set_memory_fraction(1.0)
    assert a.get_memory_fraction() == 1.0
    a.set_memory_fraction(0.0)
    assert a.get_memory_fraction() == 0.0
    for val in random.Random(0).sample(range(1, 1000), 3):
        a.set_memory_fraction(val / 1000)
        assert a.get_memory_fraction() == pytest.approx(val / 1000, abs=1e-9)


def test_notifies_oom() -> None:
    """test_cuda.py TestCuda.test_notifies_oom: an observer attached with
    ``_cuda_attach_out_of_memory_observer`` is called on an OOM, with (device, alloc_size, total, free)."""
    a = _alloc(total=16 * GiB)
    seen = []
    a.attach_out_of_memory_observer(lambda *args: seen.append(args))
    with pytest.raises(OutOfMemoryError):
        a.malloc(1024 * 1024 * 1024 * 1024)
    assert seen == [(0, 1 << 40, 16 * GiB, 16 * GiB)]


def _power2_div(size: int, div_factor: int) -> int:
    """test_cuda.py's ``power2_div`` helper of test_allocator_settings."""
    pow2 = 1
    while pow2 < size:
        pow2 *= 2
    if pow2 == size:
        return pow2
    step = pow2 // 2 // div_factor
    ret = pow2 // 2
    while ret < size:
        ret += step
    return ret


def test_allocator_settings() -> None:
    """test_cuda.py TestCuda.test_allocator_settings: ``_set_allocator_settings`` at run time; each call resets
    what it does not name (power-2 divisions end with the next string), and malformed strings are refused."""
    a = _alloc()
    key_allocated, key_requested = "active_bytes.all.allocated", "requested_bytes.all.allocated"
    nelems, nelems_big = 21 * 1024 * 1024, 100 * 1024 * 1024
    nbytes, nbytes_big = FLOAT * nelems, FLOAT * nelems_big
    keep = []  # the test keeps x, y, z, w, v alive
    a.empty_cache()
    start_mem = a.memory_stats()[key_allocated]
    a.set_allocator_settings("")
    keep.append(a.malloc(nbytes))
    reg_mem = a.memory_stats()[key_allocated]
    start_requested = a.memory_stats()[key_requested]
    a.set_allocator_settings("roundup_power2_divisions:4")
    keep.append(a.malloc(nbytes))
    pow2_div4_mem = a.memory_stats()[key_allocated]
    current_requested = a.memory_stats()[key_requested]
    assert reg_mem - start_mem == nbytes
    assert pow2_div4_mem - reg_mem == _power2_div(nbytes, 4)
    assert current_requested - start_requested == nbytes
    a.set_allocator_settings("garbage_collection_threshold:0.5")
    a.set_allocator_settings("garbage_collection_threshold:0.5,max_split_size_mb:40")
    a.empty_cache()  # should have reset the power2 divisions now
    start_mem = a.memory_stats()[key_allocated]
    keep.append(a.malloc(nbytes))
    assert a.memory_stats()[key_allocated] - start_mem == nbytes
    a.empty_cache()
    a.set_allocator_settings(
        "garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
    start_mem = a.memory_stats()[key_allocated]
    keep.append(a.malloc(nbytes))
    assert a.memory_stats()[key_allocated] - start_mem == _power2_div(nbytes, 8)
    a.empty_cache()
    start_mem = a.memory_stats()[key_allocated]
    keep.append(a.malloc(nbytes_big))
    assert a.memory_stats()[key_allocated] - start_mem == _power2_div(nbytes_big, 2)
    a.empty_cache()
    a.set_allocator_settings("release_lock_on_cudamalloc:True")
    start_mem = a.memory_stats()[key_allocated]
    keep.append(a.malloc(nbytes))
    assert a.memory_stats()[key_allocated] - start_mem == nbytes
    for bad in ("foo:1,bar:2", "garbage_collection_threshold:1.2", "max_split_size_mb:2",
                "release_lock_on_cudamalloc:none", "pinned_use_cuda_host_register:none",
                "pinned_num_register_threads:none", "pinned_num_register_threads:1024"):
        with pytest.raises(ValueError):
            a.set_allocator_settings(bad)
        assert a.config.settings == "release_lock_on_cudamalloc:True"  # a refused string changes nothing
    assert a.memory_stats()["max_split_size"] == -1  # fixed when the allocator was made
    _checked(a)


def test_allocator_settings_expandable_turned_off_skips_expandable_blocks() -> None:
    """CUDACachingAllocator.cpp get_free_block: "Rarely expandable segments has been turned off after we have
    already allocated some blocks as expandable ... we need to honor this request by only finding
    non-expandable blocks" (what test_cuda.py's IPC tests rely on with ``expandable_segments:False``)."""
    a = _alloc("expandable_segments:True")
    a.free(a.malloc(4 * MiB))
    a.set_allocator_settings("expandable_segments:False")
    p = a.malloc(4 * MiB)
    seg = next(s for s in a.segments() if any(b["address"] == p for b in s["blocks"]))
    assert not seg["is_expandable"] and a.memory_stats()["num_device_alloc"] == 2
    _checked(a)


@pytest.mark.parametrize("version, keys", [("2.11", 122), ("2.12", 123), ("2.13.0+cu130", 123)])
def test_memory_stats_keys_by_version(version: str, keys: int) -> None:
    """torch/cuda/memory.py memory_stats over CUDACachingAllocator.h DeviceStats: 122 keys in 2.11;
    ``num_oom_rejections`` joins in 2.12 (sorted in, just before ``num_ooms``)."""
    stats = _alloc(torch_version=version).memory_stats()
    assert len(stats) == keys and list(stats) == sorted(stats)
    assert ("num_oom_rejections" in stats) == (keys == 123)


def test_memory_snapshot() -> None:
    """test_cuda.py TestCudaMallocAsync.test_memory_snapshot (native backend): x, the second block of its
    segment, shows with its request and address after 1000 tiled 512-byte tensors die in random order."""
    a = _alloc()
    a.empty_cache()
    first = a.malloc(2 * 311 * 411 * FLOAT)  # torch.rand(2 * 311, 411): dies at once
    a.free(first)
    unused = a.malloc(310 * 410 * FLOAT)
    x = a.malloc(311 * 411 * FLOAT)
    tensors = [a.malloc(128 * FLOAT) for _ in range(1000)]
    rng = random.Random(0)
    while tensors:
        a.free(tensors.pop(rng.randint(0, len(tensors) - 1)))
    a.free(a.malloc(128 * 5 * FLOAT))
    ss = a.snapshot()
    found = [b for seg in ss["segments"] for b in seg["blocks"] if b["requested_size"] == 311 * 411 * FLOAT]
    assert [b["address"] for b in found] == [x]
    assert all("frames" in seg for seg in ss["segments"])
    assert unused in {b["address"] for seg in ss["segments"] for b in seg["blocks"]}
    # torch collects the trace before it records the snapshot: the entry shows in the next one
    assert ss["device_traces"][0][-1]["action"] != "snapshot"
    entry = a.snapshot()["device_traces"][0][-1]
    assert entry["action"] == "snapshot" and entry["size"] == sum(seg["active_size"] for seg in ss["segments"])
    _checked(a)


# ---------------------------------------------------------------------------------------- streams


@pytest.mark.parametrize("conf", CONFIGS)
def test_record_stream(conf: str) -> None:
    """test_cuda.py TestCuda.test_record_stream: a block made on a side stream and recorded on the current one
    is not reused on the side stream until the current stream is done with it; then it is (native backend)."""
    a = _alloc(conf)
    nbytes = 4 * FLOAT  # torch.FloatTensor([1, 2, 3, 4])
    result = a.malloc(nbytes)
    tmp = a.malloc(nbytes, stream=SIDE)  # with torch.cuda.stream(stream): tmp = t.cuda(non_blocking=True)
    ptr = tmp
    a.record_stream(tmp, 0)  # tmp.record_stream(torch.cuda.current_stream()); then result.copy_(tmp)
    a.free(tmp)  # perform_copy() returns: tmp dies while the copy may still run
    tmp2 = a.malloc(nbytes, stream=SIDE)
    assert tmp2 != ptr, "allocation reused to soon"
    a.free(tmp2)
    a.synchronize(0)  # torch.cuda.current_stream().synchronize()
    tmp3 = a.malloc(nbytes, stream=SIDE)
    assert tmp3 == ptr, "allocation not reused"
    assert a.live_block(result) is not None
    _checked(a)


@pytest.mark.parametrize("conf", CONFIGS)
def test_record_stream_on_shifted_view(conf: str) -> None:
    """test_cuda.py TestCuda.test_record_stream_on_shifted_view (issue #27366): recording a stream on a view
    records the whole block; synchronizing the allocation stream alone does not free it."""
    a = _alloc(conf)
    stream_alloc, stream_record = SIDE, OTHER
    base = a.malloc(2 * FLOAT, stream=stream_alloc)  # torch.cuda.FloatTensor([10, 10])
    a.record_stream(base, stream_record)  # view = base[5:]; view.record_stream(stream_record): the storage's block
    data_ptr = base
    a.free(base)  # del base, view
    a.synchronize(stream_alloc)
    try_realloc = a.malloc(2 * FLOAT, stream=stream_alloc)
    assert try_realloc != data_ptr
    _checked(a)


def test_record_stream_on_own_stream_is_ignored() -> None:
    """CUDACachingAllocator.cpp recordStream: "ignore uses on the allocation stream, since those don't require
    any special synchronization" — the free completes at once."""
    a = _alloc()
    p = a.malloc(MiB, stream=SIDE)
    a.record_stream(p, SIDE)
    a.free(p)
    assert a.malloc(MiB, stream=SIDE) == p
    actions = [e["action"] for e in a.snapshot()["device_traces"][0]]
    assert actions == ["segment_alloc", "alloc", "free_requested", "free_completed", "alloc"]


@pytest.mark.parametrize("conf", CONFIGS)
def test_caching_allocator_record_stream_oom(conf: str) -> None:
    """test_cuda.py TestCuda.test_caching_allocator_record_stream_oom (issue #19219): allocations delayed by
    record_stream are freed on an out-of-memory in the retry (``synchronize_and_free_events``), so 100
    160 MiB tensors on a 2 GiB device never run out of memory."""
    a = _alloc(conf, total=2 * GiB)
    stream = SIDE
    y = a.malloc(40 * MiB * FLOAT, stream=stream)
    for _ in range(100):
        x = a.malloc(40 * MiB * FLOAT)
        a.record_stream(x, stream)  # with torch.cuda.stream(stream): y += x; x.record_stream(stream)
        a.free(x)
    stats = a.memory_stats()
    assert stats["num_ooms"] == 0 and stats["num_alloc_retries"] > 0
    assert stats["num_sync_all_streams"] == stats["num_alloc_retries"]
    a.empty_cache()
    assert a.live_block(y) is not None
    _checked(a)


@pytest.mark.parametrize("conf", CONFIGS)
def test_cross_stream_free_stats(conf: str) -> None:
    """CUDACachingAllocator.cpp free / free_block with stream_uses (spec §6.3): ``free`` drops allocation and
    allocated_bytes at once; active, active_bytes and requested_bytes wait for ``free_block``, which the next
    malloc runs (``process_events``) once the stream is done — ``synchronize()`` alone changes no stats."""
    a = _alloc(conf)
    p = a.malloc(3 * MiB)
    a.record_stream(p, SIDE)
    a.free(p)
    s = a.memory_stats()
    assert (s["allocated_bytes.all.current"], s["active_bytes.all.current"], s["requested_bytes.all.current"]) == (
        0, 3 * MiB, 3 * MiB)
    assert (s["allocation.all.current"], s["active.all.current"]) == (0, 1)
    state = {b["state"] for seg in a.snapshot()["segments"] for b in seg["blocks"]}
    assert "active_pending_free" in state
    q = a.malloc(512)  # the side stream is still busy: p stays pending
    s = a.memory_stats()
    assert (s["active.all.peak"], s["allocation.all.peak"]) == (2, 1)
    assert s["active_bytes.all.peak"] == 3 * MiB + 512 and s["allocated_bytes.all.peak"] == 3 * MiB
    a.synchronize()
    assert a.memory_stats()["active_bytes.all.current"] == 3 * MiB + 512
    r = a.malloc(512)  # process_events: p's free completes first
    s = a.memory_stats()
    assert (s["active_bytes.all.current"], s["requested_bytes.all.current"]) == (1024, 1024)
    trace = [e["action"] for e in a.snapshot()["device_traces"][0]]
    assert trace[-2:] == ["free_completed", "alloc"] and trace.count("free_requested") == 1
    a.free(q)
    a.free(r)
    _checked(a)


def test_side_stream_cache_does_not_serve_default_stream() -> None:
    """CUDACachingAllocator.cpp get_free_block: ``lower_bound`` on (stream, size) and ``(*it)->stream !=
    p.stream() -> return false``: a block cached on a side stream never serves the default stream, which gets
    a new segment; ``empty_cache`` releases both."""
    a = _alloc()
    a.free(a.malloc(30 * MiB, stream=SIDE))
    p = a.malloc(30 * MiB)
    segs = a.segments()
    assert sorted(s["stream"] for s in segs) == [0, SIDE] and a.memory_reserved() == 60 * MiB
    a.free(p)
    a.empty_cache()
    assert a.memory_reserved() == 0
    _checked(a)


# ---------------------------------------------------------------------------------------- CUDA graphs


def _round_large(n: int) -> int:
    return kRoundLarge * ((n + kRoundLarge - 1) // kRoundLarge)


_GRAPH_CASES = (  # numel, delta_cudaMallocs, delta_cudaMalloc_bytes, delta_cudaMalloc_bytes_post_del_g, pool
    (512 // FLOAT, 1, kSmallBuffer, kSmallBuffer, "small_pool"),
    (kSmallSize // FLOAT, 2, 2 * kSmallBuffer, kSmallBuffer, "small_pool"),
    ((kSmallSize + 512) // FLOAT, 1, kLargeBuffer, kLargeBuffer, "large_pool"),
    ((kMinLargeAlloc - 512) // FLOAT, 2, 2 * kLargeBuffer, kLargeBuffer, "large_pool"),
    ((kMinLargeAlloc + 512) // FLOAT, 3, 3 * _round_large(kMinLargeAlloc + 512), _round_large(kMinLargeAlloc + 512),
     "large_pool"),
)


@pytest.mark.parametrize("conf", CONFIGS)
def test_graph_memory_stats_and_use_result_after_destroy_graph(conf: str) -> None:
    """test_cuda.py TestCuda.test_graph_memory_stats_and_use_result_after_destroy_graph, every case and its
    expandable-segments exceptions: the capture's private pool adds these segments and bytes; ``empty_cache``
    leaves them while the graph lives; after ``del g`` only the segment holding the result b remains."""
    expandable = bool(conf)
    a = _alloc(conf)
    s = SIDE
    stats_to_check = ("segment.", "reserved_bytes.", "active.", "active_bytes.")
    for numel, d_mallocs, d_bytes, d_bytes_post_del, pool in _GRAPH_CASES:
        if pool == "small_pool":
            d_active_blocks, d_active_bytes = 3, numel * FLOAT + 1024
        else:
            d_active_blocks, d_active_bytes = 1, numel * FLOAT
        g = CUDAGraph(a)
        nbytes = numel * FLOAT
        x = a.malloc(nbytes, stream=s)  # a = torch.ones((numel,)) on s
        pre = a.memory_stats()
        # capture_begin: the default generator registers the graph and makes its one-element seed and offset
        # holders on the current stream, outside the graph's pool ("a sneaky two from CUDAGraph's one-element
        # rng seed and offset holders", as the source says); then b = a.clone() and five b = b.clone() + 1
        g.capture_begin(stream=s)
        b = a.malloc(nbytes, stream=s)
        for _ in range(5):
            c = a.malloc(nbytes, stream=s)
            d = a.malloc(nbytes, stream=s)
            a.free(c)
            a.free(b)
            b = d
        g.capture_end()
        post = a.memory_stats()
        for i in range(2):
            for stat, expected in zip(stats_to_check, (d_mallocs, d_bytes, d_active_blocks, d_active_bytes),
                                      strict=True):
                key = stat + pool + ".current"
                if expandable and "segment" in stat:
                    expected = 0
                if expandable and "reserved" in stat and numel in (_GRAPH_CASES[3][0], _GRAPH_CASES[4][0]):
                    expected = 2 * kLargeBuffer
                assert post[key] - pre[key] == expected, (key, numel)
            g.replay()
            if i == 0:
                a.empty_cache()
                post = a.memory_stats()
        g.delete()  # del g: the generator unregisters it and its holders die, then reset()
        a.empty_cache()
        postdel = a.memory_stats()
        for stat, expected in zip(stats_to_check, (1, d_bytes_post_del, 1, numel * FLOAT), strict=True):
            key = stat + pool + ".current"
            if expandable and "segment" in stat:
                expected = 0
            if expandable and "reserved" in stat and numel == _GRAPH_CASES[3][0]:
                expected = 2 * kLargeBuffer
            if expandable and "reserved" in stat and numel == _GRAPH_CASES[4][0]:
                expected = kLargeBuffer
            assert postdel[key] - pre[key] == expected, (key, numel)
        a.free(x)
        a.free(b)
        a.synchronize()
        a.empty_cache()
        _checked(a)
    assert a.memory_reserved() == 0
    # alloc_block counts one cudaMalloc per expandable growth and unmap_block one per unmapped range, so an
    # expandable graph pool may keep a count above 0 and stay in graph_pools, empty (as the C++ reads)
    assert not a.graph_pools or expandable


def _func_with_temps(a: CachingAllocator, t: int, nbytes: int, s: int) -> int:
    """test_cuda.py's ``func_with_temps(t, val)``: x = t.clone() + val; y = t.clone() + val; return x + y."""
    x1 = a.malloc(nbytes, stream=s)
    x = a.malloc(nbytes, stream=s)
    a.free(x1)
    y1 = a.malloc(nbytes, stream=s)
    y = a.malloc(nbytes, stream=s)
    a.free(y1)
    out = a.malloc(nbytes, stream=s)
    a.free(x)
    a.free(y)
    return out


def test_graph_two_successive() -> None:
    """test_cuda.py TestCuda.test_graph_two_successive: two graphs captured one after the other save exactly one
    small segment (kSmallBuffer) of reserved memory when they share a pool, via ``pool()`` or a
    ``graph_pool_handle()``."""
    a = _alloc()
    nbytes = 1000 * FLOAT
    s = SIDE
    reserved = {}
    for share_mem in ("Don't share", "via pool()", "via graph_pool_handle()"):
        g0, g1 = CUDAGraph(a), CUDAGraph(a)
        t = a.malloc(nbytes)  # a = torch.ones((size,))
        g0_pool = graph_pool_handle(a) if share_mem == "via graph_pool_handle()" else None
        g0.capture_begin(g0_pool, stream=s)
        b = a.malloc(nbytes, stream=s)  # b = a.clone()
        for _ in range(5):
            old, b = b, _func_with_temps(a, b, nbytes, s)
            a.free(old)
        g0.capture_end()
        g1_pool = g0.pool() if share_mem == "via pool()" else g0_pool
        g1.capture_begin(g1_pool, stream=s)
        for _ in range(5):
            old, b = b, _func_with_temps(a, b, nbytes, s)
            a.free(old)
        g1.capture_end()
        c = a.malloc(nbytes)  # c = a.clone(), then eager func_with_temps between replays
        for _ in range(6):
            old, c = c, _func_with_temps(a, c, nbytes, 0)
            a.free(old)
        reserved[share_mem] = a.memory_stats()["reserved_bytes.all.current"]
        for p in (t, b, c):  # del a, b, c, g0, g1 (the last graph deleted frees the generator's holders)
            a.free(p)
        g0.delete()
        g1.delete()
        a.synchronize()
        a.empty_cache()
        assert a.memory_reserved() == 0
    assert reserved["Don't share"] - reserved["via pool()"] == kSmallBuffer
    assert reserved["Don't share"] - reserved["via graph_pool_handle()"] == kSmallBuffer
    _checked(a)


@pytest.mark.parametrize("share_mem", ["Don't share", "via pool()", "via graph_pool_handle()"])
def test_graph_three_successive(share_mem: str) -> None:
    """test_cuda.py TestCuda.test_graph_three_successive: graphs sharing a pool must replay in capture order,
    because g2's output f takes the block c left when it died during g1's capture ("If we used the native
    allocator and shared mempools, we expect the concurrent replays corrupted each other"). Without sharing, f
    has a block of its own. (The sums the source checks are the GPU's; the shared block is why they differ.)"""
    a = _alloc()
    nbytes = 1000 * FLOAT
    s = SIDE
    t = a.malloc(nbytes)  # a = torch.ones((size,))
    g0, g1, g2 = CUDAGraph(a), CUDAGraph(a), CUDAGraph(a)
    g0_pool = graph_pool_handle(a) if share_mem == "via graph_pool_handle()" else None
    g0.capture_begin(g0_pool, stream=s)
    b = a.malloc(nbytes, stream=s)  # b = a.clone()
    c = a.malloc(nbytes, stream=s)  # c = b + 1
    d = a.malloc(nbytes, stream=s)  # d = b + 2
    g0.capture_end()
    pool = g0.pool() if share_mem == "via pool()" else g0_pool
    g1.capture_begin(pool, stream=s)
    e = a.malloc(nbytes, stream=s)  # e = c + 3
    a.free(c)  # del c
    g1.capture_end()
    g2.capture_begin(pool, stream=s)
    f = a.malloc(nbytes, stream=s)  # f = d + 4
    g2.capture_end()
    assert (f == c) == (share_mem != "Don't share")
    for p in (t, b, d, e, f):
        a.free(p)
    for g in (g0, g1, g2):  # del g0, g1, g2: the last frees the generator's holders
        g.delete()
    a.synchronize()
    a.empty_cache()
    assert a.memory_reserved() == 0
    _checked(a)


def test_graph_context_empties_the_cache_and_keeps_its_pool() -> None:
    """torch/cuda/graphs.py ``graph.__enter__`` (synchronize, empty_cache, then capture on a side stream) and
    CUDACachingAllocator.cpp release_cached_blocks: a live graph's pool is not freeable, so ``empty_cache``
    cannot release its segments; after ``reset`` it can, and the pool is forgotten once it holds none. (The
    default generator's two 8-byte holders, made by the capture in the device's own pool, go when the graph
    is deleted.)"""
    a = _alloc()
    a.free(a.malloc(30 * MiB))
    g = CUDAGraph(a)
    with graph(a, g):
        assert a.memory_reserved() == kSmallBuffer  # the context emptied the cache first; the generator's holders
        tmp = a.malloc(30 * MiB, stream=g.capture_stream)
        a.free(tmp)
    a.empty_cache()
    holders, seg = sorted(a.segments(), key=lambda seg: seg["total_size"])
    assert seg["segment_pool_id"] == g.pool() and seg["stream"] == g.capture_stream
    assert holders["segment_pool_id"] == (0, 0) and holders["allocated_size"] == 2 * 512
    g.delete()
    a.empty_cache()
    assert a.memory_reserved() == 0 and not a.graph_pools and not a.graph_pools_freeable
    _checked(a)


def test_free_during_capture_waits_for_the_capture_to_end() -> None:
    """CUDACachingAllocator.cpp free: "It's forbidden to cudaEventQuery an event recorded during CUDA graph
    capture. We conservatively defer recording end-of-life events until the next call to process_events()";
    streams recorded during the capture are dropped then (remove_cudagraph_stream_uses)."""
    a = _alloc()
    p = a.malloc(4 * MiB)
    g = CUDAGraph(a)
    g.capture_begin(stream=SIDE)
    a.record_stream(p, SIDE)  # used by the captured work only
    a.free(p)
    assert a.pending_blocks() and a.malloc(4 * MiB) != p  # malloc skips process_events while capturing
    g.capture_end()
    q = a.malloc(4 * MiB)  # the deferred free: no stream left from before the capture, freed at once
    assert q == p
    _checked(a)


# ---------------------------------------------------------------------------------------- MemPool


def test_mempool_id() -> None:
    """test_cuda.py TestMemPool.test_mempool_id: graph_pool_handle() and MemPool() ids start with 0 and each
    call increments the second value."""
    a = _alloc()
    pool1 = graph_pool_handle(a)
    pool2 = MemPool(a).id
    assert (pool1[0] == 0) == (pool2[0] == 0)
    assert abs(pool2[1] - pool1[1]) > 0


def test_mempool_public_api() -> None:
    """test_cuda.py TestMemPool (use_count): a MemPool holds its pool (1); use_mem_pool adds one while inside."""
    a = _alloc()
    pool = MemPool(a)
    assert pool.use_count() == 1
    with use_mem_pool(a, pool):
        assert pool.use_count() == 2
    assert pool.use_count() == 1
    pool.release()
    assert pool.use_count() == 0


@pytest.mark.parametrize("conf", CONFIGS)
def test_mempool_with_allocator_segments(conf: str) -> None:
    """test_cuda.py TestMemPool.test_mempool_with_allocator (its segment counts, on the caching allocator's own
    cudaMalloc): 7 MiB tensors in a pool — two share a 20 MiB segment, the third needs a second one
    (native); deleting the pool releases them."""
    a = _alloc(conf)
    pool = MemPool(a)
    nbytes = 7 * MiB

    def pool_segments() -> int:
        return len(pool.snapshot())

    with use_mem_pool(a, pool):
        out = [a.malloc(nbytes)]
        assert pool.use_count() == 2 and pool_segments() == 1
        out.append(a.malloc(nbytes))
        assert pool_segments() == 1
        out.append(a.malloc(nbytes))
        assert pool_segments() == (1 if conf else 2)  # an expandable segment grows instead
    assert pool.use_count() == 1
    for p in out:
        a.free(p)
    pool.release()  # del pool: releasePool, then emptyCache(pool.id)
    assert pool_segments() == 0 and a.memory_reserved() == 0
    _checked(a)


def test_mempool_empty_cache() -> None:
    """test_cuda.py TestMemPool.test_mempool_empty_cache: after del y, x and the pool, segments remain cached
    (x's, in the default pool: only the pool's own are released with it)."""
    a = _alloc()
    a.empty_cache()
    pool = MemPool(a)
    x = a.malloc(1024 * 1024 * FLOAT)
    with use_mem_pool(a, pool):
        y = a.malloc(1024 * 1024 * FLOAT)
    a.free(y)
    a.free(x)
    pool.release()
    segments = a.snapshot()["segments"]
    assert len(segments) > 0 and all(seg["segment_pool_id"] == (0, 0) for seg in segments)


def test_nested_mempool() -> None:
    """test_cuda.py TestMemPool.test_nested_mempool: nested use_mem_pool contexts allocate into the innermost
    pool (captures_underway is scanned from its end); 20 MiB tensors, one segment each."""
    a = _alloc()
    pools = [MemPool(a) for _ in range(3)]
    data = []

    def allocate_data() -> None:
        data.append(a.malloc(20 * MiB))

    with use_mem_pool(a, pools[0]):
        allocate_data()
        with use_mem_pool(a, pools[1]):
            allocate_data()
            with use_mem_pool(a, pools[2]):
                allocate_data()
            allocate_data()
        allocate_data()
    assert [len(p.snapshot()) for p in pools] == [2, 2, 1]
    _checked(a)


def test_mempool_emptycache_inside_use_mem_pool() -> None:
    """test_cuda.py TestMemPool.test_mempool_emptycache_multithread (one thread per pool, here one after the
    other): empty_cache inside use_mem_pool does nothing, so each pool keeps its single segment."""
    a = _alloc()
    pools = [MemPool(a) for _ in range(4)]
    for pool in pools:
        with use_mem_pool(a, pool):
            a.free(a.malloc(4 * FLOAT))
            a.empty_cache()
    for pool in pools:
        assert len(pool.snapshot()) == 1, "expected a single cached segment"
    assert a.memory_stats()["num_sync_all_streams"] == 0  # the default pool's sync is skipped too
    _checked(a)


def test_release_pool_errors_change_nothing() -> None:
    """CUDACachingAllocator.cpp beginAllocateToPool / endAllocateToPool / releasePool checks: recording twice to
    one pool, ending a recording that is not underway and releasing a pool no one holds are refused."""
    a = _alloc()
    pool = MemPool(a)
    a.begin_allocate_to_pool(pool.id)
    with pytest.raises(ValueError, match="already recording"):
        a.begin_allocate_to_pool(pool.id)
    a.end_allocate_to_pool(pool.id)
    with pytest.raises(ValueError, match="not currently recording"):
        a.end_allocate_to_pool(pool.id)
    a.release_pool(pool.id)
    pool.release()
    with pytest.raises(ValueError, match="not in use"):
        a.release_pool(pool.id)
    with pytest.raises(ValueError, match="already released"):
        pool.release()
    with pytest.raises(AllocatorConfigError):
        a.set_allocator_settings("max_split_size_mb:1")


# ---------------------------------------------------------------------------------------- AllocatorConfig


def test_allocator_config_test() -> None:
    """c10/test/core/AllocatorConfig_test.cpp AllocatorConfigTest.allocator_config_test, through
    ``set_allocator_settings``: each string is read afresh (the divisions of the array syntax that a string
    leaves out are 0, not the previous string's); a trailing comma is accepted; unknown keys are refused.
    (The test's device_specific_option_mb is a key its own parse hook registers; it is left out here.)"""
    a = _alloc()
    env = ("max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
           "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],expandable_segments:True,"
           "pinned_use_background_threads:True")
    a.set_allocator_settings(env)
    cfg = a.config
    assert cfg.settings == env and cfg.max_split_size == 40 * MiB and cfg.max_non_split_rounding_size == 30 * MiB
    assert cfg.garbage_collection_threshold == 0.5 and cfg.expandable_segments
    expected = {32: 8, 64: 8, 128: 2, 256: 4, 512: 2, 1024: 4, 2048: 1, 4096: 1, 8192: 1}
    assert {mb: divisions_for(mb * MiB, cfg.roundup_power2_divisions) for mb in expected} == expected
    env = "max_split_size_mb:20,max_non_split_rounding_mb:40,garbage_collection_threshold:0.8"
    a.set_allocator_settings(env)
    cfg = a.config
    assert (cfg.max_split_size, cfg.max_non_split_rounding_size, cfg.garbage_collection_threshold) == (
        20 * MiB, 40 * MiB, 0.8)
    a.set_allocator_settings("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    expected = {64: 8, 128: 8, 256: 16, 512: 1, 1024: 0, 2048: 8, 4096: 2}
    assert {mb: divisions_for(mb * MiB, a.config.roundup_power2_divisions) for mb in expected} == expected
    a.set_allocator_settings("roundup_power2_divisions:4")
    assert {divisions_for(mb * MiB, a.config.roundup_power2_divisions) for mb in (64, 256, 2048)} == {4}
    a.set_allocator_settings("expandable_segments:False,")
    assert not a.config.expandable_segments
    with pytest.raises(AllocatorConfigError, match="Unrecognized key"):
        a.set_allocator_settings("foo:123,bar:456")
