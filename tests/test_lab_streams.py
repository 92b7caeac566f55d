"""The lab's side streams, record_stream, private pools and CUDA graphs (memviz.lab_streams), on the simulator.

The same scenario runs on a real GPU against the simulator in tests/test_lab_streams_cuda.py.
"""

from __future__ import annotations

import pytest

from memviz.errors import InputError, InputTypeError
from memviz.lab import Lab

MiB = 1 << 20
RESERVED = "reserved_bytes.all.current"
# a capture registers the default CUDA generator: while any graph lives, its seed and offset tensors (8 B each)
# sit on the capture stream outside the graph's pool, in a 2 MiB small segment (as on the H200)
GENERATOR_SEGMENT = ("stream capture", 2 * MiB, ("active_allocated", "active_allocated", "inactive"))


def sim_lab(**kwargs) -> Lab:
    return Lab(backend="sim", device="H200", **kwargs)


def layout(lab: Lab) -> list[tuple[str, int, tuple[str, ...]]]:
    """(place, segment size, block states) of every segment, sorted: what the map groups and draws."""
    return sorted((lab.place_of(s), s["total_size"], tuple(b["state"] for b in s["blocks"])) for s in lab.segments())


def test_a_side_streams_cached_segment_does_not_serve_the_default_stream():
    lab = sim_lab()
    lab.new_stream("side")
    lab.allocate("30 MiB", name="x", stream="side")
    lab.free("x")
    event = lab.allocate("30 MiB", name="y")
    assert event.delta(RESERVED) == 30 * MiB  # a new segment, beside side's free one
    assert layout(lab) == [("default stream", 30 * MiB, ("active_allocated",)),
                           ("stream side", 30 * MiB, ("inactive",))]
    assert lab.tensors["y"].stream == "default" and lab.streams["side"] != 0
    lab.free("y")
    assert lab.allocate("30 MiB", name="z", stream="side").delta(RESERVED) == 0  # side's own cache serves it
    assert lab.empty_cache().reserved_bytes == 30 * MiB  # empty_cache releases every stream's free segments


def test_record_stream_delays_the_free_until_the_streams_work_is_done():
    lab = sim_lab()
    lab.new_stream("side")
    lab.allocate("30 MiB", name="batch")
    lab.record_stream("batch", "side")
    lab.queue_work("side", seconds=60)
    freed = lab.free("batch")
    assert freed.allocated_bytes == 0 and freed.active_bytes == 30 * MiB  # allocated drops, the block stays active
    assert layout(lab) == [("default stream", 30 * MiB, ("active_pending_free",))]
    assert lab.allocate("30 MiB", name="next").delta(RESERVED) == 30 * MiB  # not reused: still pending
    lab.synchronize("side")
    assert lab.stats()["active_bytes.all.current"] == 60 * MiB  # synchronize alone frees nothing ...
    lab.allocate("1 MiB", name="small")  # ... the next allocation does (process_events)
    assert lab.stats()["active_bytes.all.current"] == 31 * MiB


def test_a_free_waiting_on_an_idle_stream_completes_at_the_next_allocation():
    lab = sim_lab()
    lab.new_stream("side")
    lab.allocate("30 MiB", name="batch")
    lab.record_stream("batch", "side")
    lab.free("batch")  # side has no queued work: its event completes at once, as on a GPU
    assert lab.allocate("30 MiB", name="again").delta(RESERVED) == 0


def test_empty_cache_waits_for_pending_frees_and_releases_them():
    lab = sim_lab()
    lab.new_stream("side")
    lab.allocate("30 MiB", name="batch")
    lab.record_stream("batch", "side")
    lab.queue_work("side", seconds=60)
    lab.free("batch")
    assert lab.empty_cache().reserved_bytes == 0


def test_a_pools_segments_stay_after_empty_cache_until_the_pool_is_released():
    lab = sim_lab()
    lab.new_pool("p")
    lab.allocate("8 MiB", name="a", pool="p")
    lab.allocate("8 MiB", name="b")
    assert lab.tensors["a"].pool == "p" and lab.tensors["b"].pool is None
    lab.free("a", "b")
    assert lab.empty_cache().reserved_bytes == 20 * MiB  # the pool's free 20 MiB segment stays
    assert layout(lab) == [("pool p", 20 * MiB, ("inactive",))]
    pool_id = lab.pools["p"].id
    assert lab.pool_is_held(pool_id) and not lab.pool_is_held((0, 0))
    assert lab.release_pool("p").reserved_bytes == 0  # del pool: releasePool, then emptyCache of its id
    assert not lab.pool_is_held(pool_id)


def test_a_tensor_outliving_its_pool_keeps_its_segment_until_freed():
    lab = sim_lab()
    lab.new_pool("p")
    lab.allocate("8 MiB", name="a", pool="p")
    lab.release_pool("p")
    assert layout(lab) == [("pool p (released)", 20 * MiB, ("active_allocated", "inactive"))]
    lab.free("a")  # freeing into a released pool is what torch does too
    assert lab.empty_cache().reserved_bytes == 0


def test_a_block_allocated_during_capture_stays_in_the_graphs_pool_after_the_graph_is_deleted():
    lab = sim_lab()
    lab.allocate("4 MiB", name="x")
    with lab.capture("g1"):
        lab.allocate("32 MiB", name="workspace")  # as cuBLAS's workspace for the capture stream
        lab.allocate("4 MiB", name="y1")
    assert lab.tensors["workspace"].stream == "capture" and lab.tensors["workspace"].pool == "g1"
    lab.replay("g1")
    lab.delete_graph("g1")
    lab.free("y1")
    lab.empty_cache()
    assert layout(lab) == [("default stream", 20 * MiB, ("active_allocated", "inactive")),
                           ("graph pool g1 (released) · stream capture", 32 * MiB, ("active_allocated",))]


def test_graphs_share_a_pool_and_the_second_reuses_what_the_first_freed():
    lab = sim_lab()
    with lab.capture("g1"):
        lab.allocate("4 MiB", name="tmp")
        lab.allocate("4 MiB", name="y1")
        lab.free("tmp")  # freed inside g1's capture: its block is free in the pool ...
    tmp_address = next(b["address"] for s in lab.segments() if s["segment_pool_id"] != (0, 0) for b in s["blocks"]
                       if b["state"] == "inactive")
    with lab.capture("g2", pool="g1"):
        lab.allocate("4 MiB", name="y2")  # ... and g2's capture gets the same block
    assert lab["y2"].data_ptr() == tmp_address
    assert lab.pools["g1"].holders == {"g1": None, "g2": None}
    lab.delete_graph("g1")
    lab.free("y1", "y2")
    assert lab.empty_cache().reserved_bytes == 22 * MiB  # g2 still holds the pool (and the generator's 2 MiB)
    lab.delete_graph("g2")
    assert lab.empty_cache().reserved_bytes == 0


def test_a_capture_can_go_into_a_mempool():
    lab = sim_lab()
    lab.new_pool("p")
    with lab.capture("g", pool="p"):
        lab.allocate("4 MiB", name="y")
    assert lab.tensors["y"].pool == "p" and lab.pools["p"].holders == {"p": None, "g": None}


def _state(lab: Lab) -> tuple:
    return (dict(lab.stats()), layout(lab), len(lab.events), sorted(lab.tensors), dict(lab.streams),
            {n: dict(p.holders) for n, p in lab.pools.items()}, lab.capturing)


def _prepared() -> Lab:
    lab = sim_lab()
    lab.new_stream("side")
    lab.new_pool("p")
    lab.new_pool("gone")
    lab.release_pool("gone")
    lab.allocate("8 MiB", name="t")
    with lab.capture("g1"):
        lab.allocate("2 MiB", name="w")
    lab.delete_graph("g1")
    return lab


BAD = {
    "allocate on an unknown stream": lambda lab: lab.allocate("1 MiB", name="u", stream="nope"),
    "allocate on a stream named by an int": lambda lab: lab.allocate("1 MiB", name="u", stream=3),
    "allocate into an unknown pool": lambda lab: lab.allocate("1 MiB", name="u", pool="nope"),
    "allocate into a released pool": lambda lab: lab.allocate("1 MiB", name="u", pool="gone"),
    "allocate into a graph's pool outside its capture": lambda lab: lab.allocate("1 MiB", name="u", pool="g1"),
    "a second stream of the same name": lambda lab: lab.new_stream("side"),
    "a stream called default": lambda lab: lab.new_stream("default"),
    "a pool named like a graph": lambda lab: lab.new_pool("g1"),
    "record_stream on an unknown stream": lambda lab: lab.record_stream("t", "nope"),
    "record_stream of an unknown tensor": lambda lab: lab.record_stream("nope", "side"),
    "queue_work of 0 s": lambda lab: lab.queue_work("side", 0),
    "queue_work of '5'": lambda lab: lab.queue_work("side", "5"),
    "synchronize an unknown stream": lambda lab: lab.synchronize("nope"),
    "release a pool twice": lambda lab: lab.release_pool("gone"),
    "release a graph's pool": lambda lab: lab.release_pool("g1"),
    "release an unknown pool": lambda lab: lab.release_pool("nope"),
    "delete a graph twice": lambda lab: lab.delete_graph("g1"),
    "replay a deleted graph": lambda lab: lab.replay("g1"),
    "replay an unknown graph": lambda lab: lab.replay("nope"),
    "share a pool nothing holds": lambda lab: lab.begin_capture("g2", pool="g1"),
    "share a released MemPool": lambda lab: lab.begin_capture("g2", pool="gone"),
    "capture into an unknown pool": lambda lab: lab.begin_capture("g2", pool="nope"),
    "a graph named like a pool": lambda lab: lab.begin_capture("p"),
    "end_capture without a capture": lambda lab: lab.end_capture(),
}


@pytest.mark.parametrize("call", BAD.values(), ids=BAD.keys())
def test_bad_input_is_refused_with_a_clear_error_and_changes_nothing(call):
    lab = _prepared()
    before = _state(lab)
    with pytest.raises((InputError, KeyError)) as info:
        call(lab)
    assert len(str(info.value)) > 20
    assert _state(lab) == before


DURING_CAPTURE = {
    "a second capture": lambda lab: lab.begin_capture("g3"),
    "empty_cache": lambda lab: lab.empty_cache(),
    "synchronize": lambda lab: lab.synchronize(),
    "queue_work": lambda lab: lab.queue_work("side", 1),
    "allocate on another stream": lambda lab: lab.allocate("1 MiB", name="u", stream="side"),
    "allocate into a pool": lambda lab: lab.allocate("1 MiB", name="u", pool="p"),
    "release a pool": lambda lab: lab.release_pool("p"),
    "replay the graph being captured": lambda lab: lab.replay("g2"),
}


@pytest.mark.parametrize("call", DURING_CAPTURE.values(), ids=DURING_CAPTURE.keys())
def test_what_a_capture_forbids_is_refused_and_changes_nothing(call):
    lab = _prepared()
    lab.begin_capture("g2")
    before = _state(lab)
    with pytest.raises(InputError, match="captur"):
        call(lab)
    assert _state(lab) == before
    lab.end_capture()
    assert lab.capturing is None


def test_a_capture_ends_when_its_block_raises():
    lab = sim_lab()
    with pytest.raises(ZeroDivisionError), lab.capture("g1"):
        lab.allocate("1 MiB", name="y")
        1 / 0  # noqa: B018
    assert lab.capturing is None and lab.allocate("1 MiB", name="after").ok
    assert lab.tensors["after"].stream == "default"


def test_names_must_be_strings():
    lab = sim_lab()
    with pytest.raises(InputTypeError):
        lab.record_stream("x", 0)
    with pytest.raises(InputError):
        lab.new_stream(" side")


def test_every_new_action_is_a_lab_action():
    from memviz.events import LAB_ACTIONS

    lab = _prepared()
    lab.record_stream("t", "side")
    lab.queue_work("side", 1)
    lab.synchronize()
    assert {e.action for e in lab.events} <= set(LAB_ACTIONS)
    assert {"new_stream", "new_pool", "release_pool", "capture", "end_capture", "delete_graph", "record_stream",
            "queue_work", "synchronize"} <= {e.action for e in lab.events}


STREAM_METHODS = ("default_stream", "new_stream", "stream_id", "on_stream", "record_stream", "queue_work",
                  "synchronize", "new_pool", "pool_id", "in_pool", "release_pool", "begin_capture", "end_capture",
                  "capture_stream", "graph_pool_id", "replay_graph", "delete_graph")


@pytest.mark.parametrize("method", STREAM_METHODS)
def test_both_backends_implement_the_streams_interface_with_its_signature(method):
    import inspect

    from memviz.backends.base import Backend
    from memviz.backends.cuda import CudaBackend  # importable with CPU torch: only its use needs CUDA
    from memviz.backends.simulated import SimulatedBackend

    want = list(inspect.signature(getattr(Backend, method)).parameters)
    for backend in (CudaBackend, SimulatedBackend):
        assert getattr(backend, method) is not getattr(Backend, method), f"{backend.__name__}.{method} missing"
        assert list(inspect.signature(getattr(backend, method)).parameters) == want, f"{backend.__name__}.{method}"


def test_the_torch_api_the_cuda_backend_calls_exists_in_this_torch():
    torch = pytest.importorskip("torch")
    for name in ("Stream", "stream", "default_stream", "current_stream", "MemPool", "use_mem_pool", "CUDAGraph",
                 "graph", "synchronize", "_sleep"):
        assert hasattr(torch.cuda, name), f"torch.cuda.{name}"
    assert hasattr(torch.Tensor, "record_stream")


def test_a_backend_without_streams_says_so():
    from memviz.backends.base import Backend

    class Plain(Backend):  # the abstract methods only: what a third backend would start from
        empty = empty_cache = memory_stats = snapshot = reset_peak_memory_stats = None
        reset_accumulated_memory_stats = set_cap = None

    for call in (lambda b: b.new_stream(), lambda b: b.new_pool(), lambda b: b.begin_capture(None)):
        with pytest.raises(InputError, match="the Plain backend has no"):
            call(Plain())


def test_let_go_ends_the_capture_deletes_the_graphs_and_releases_the_pools():
    lab = sim_lab()
    lab.new_pool("p")
    lab.allocate("8 MiB", name="a", pool="p")
    with lab.capture("g1"):
        lab.allocate("4 MiB", name="y1")
    lab.begin_capture("g2", pool="g1")
    actions = [e.action for e in lab.let_go()]
    assert actions == ["end_capture", "delete_graph", "delete_graph", "release_pool"]
    assert lab.capturing is None and not any(p.held for p in lab.pools.values())
    lab.free_all()
    assert lab.empty_cache().reserved_bytes == 0
    assert lab.let_go() == []


def test_during_its_first_capture_a_new_graph_pool_is_named_by_its_graph():
    lab = sim_lab()  # torch gives a new graph pool's id only once the capture ends; the lab names it before
    lab.begin_capture("g1")
    lab.allocate("4 MiB", name="y1")
    assert layout(lab) == [("graph pool g1 · stream capture", 20 * MiB, ("active_allocated", "inactive")),
                           GENERATOR_SEGMENT]
    pool_id = next(tuple(s["segment_pool_id"]) for s in lab.segments() if s["segment_pool_id"] != (0, 0))
    assert lab.pools["g1"].id is None and lab.pool_is_held(pool_id)
    lab.end_capture()
    assert lab.pools["g1"].id == pool_id


def test_the_generators_two_blocks_come_with_the_first_graph_and_go_with_the_last():
    lab = sim_lab()
    with lab.capture("g1"):
        pass
    with lab.capture("g2"):
        pass
    assert layout(lab) == [GENERATOR_SEGMENT]
    lab.delete_graph("g1")
    assert layout(lab) == [GENERATOR_SEGMENT]  # g2 still registers the generator
    lab.delete_graph("g2")
    assert lab.empty_cache().reserved_bytes == 0
