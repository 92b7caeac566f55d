"""The lab's op log replays to the lab's own numbers, private pools, captures and waiting frees included.

``Lab.ops`` is what every what-if of the lab replays (:func:`memviz.oom.explain_oom`). After every action of
programs that use ``MemPool``, CUDA graph captures (new and shared pools, the default generator's tensors) and
``record_stream`` (frees that wait on a busy stream, then finish at a later allocation or an ``empty_cache``),
the log so far, replayed through a fresh simulator of the lab's device, cap and settings, gives the lab's
``memory_stats()`` and its segments. A lab whose memory the log does not hold (a tensor made outside it) is said
to be not replayable, and no config is tried.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from memviz.lab import Lab
from memviz.sim import CachingAllocator, fraction_for_cap, replay

MiB = 1 << 20
CONFS = ["", "expandable_segments:True"]
_KEYS = ("reserved_bytes.all.current", "allocated_bytes.all.current", "active_bytes.all.current",
         "segment.all.current", "active.all.current", "allocation.all.current", "num_device_alloc",
         "num_device_free", "reserved_bytes.all.peak", "inactive_split_bytes.all.current")


def _signature(segments: list[dict]) -> list[tuple]:
    return sorted((s["segment_type"], s["total_size"], s["stream"] != 0, tuple(s["segment_pool_id"]) != (0, 0),
                   tuple((b["size"], b["state"]) for b in s["blocks"])) for s in segments)


def _replayed(lab: Lab) -> CachingAllocator:
    backend = lab.backend
    sim = CachingAllocator(backend.total_memory_bytes,
                           memory_fraction=fraction_for_cap(backend.cap_bytes, backend.total_memory_bytes),
                           alloc_conf=backend.alloc_conf)
    outcome = replay(list(lab.ops), sim)
    assert outcome.failure is None
    return sim


def _follow(lab: Lab, program: Callable[[Lab], None]) -> int:
    """Run ``program``, checking the replay of the log after each of its actions; the number of checks."""
    checks = 0

    def check() -> None:
        nonlocal checks
        sim = _replayed(lab)
        want, got = lab.stats(), sim.memory_stats()
        assert {k: got[k] for k in _KEYS} == {k: want[k] for k in _KEYS}, (lab.events[-1].detail, lab.ops[-6:])
        assert _signature(sim.segments()) == _signature(lab.segments()), lab.events[-1].detail
        checks += 1

    n = len(lab.events)

    def step() -> None:
        nonlocal n
        if len(lab.events) != n:
            n = len(lab.events)
            check()

    program(lab, step)
    return checks


def mempools(lab: Lab, step: Callable[[], None]) -> None:
    lab.new_pool("p"), step()
    lab.allocate("6 MiB", name="a", pool="p"), step()
    lab.allocate("300 KiB", name="b", pool="p"), step()
    lab.allocate("6 MiB", name="c"), step()
    lab.free("a"), step()
    lab.allocate("6 MiB", name="d", pool="p"), step()
    lab.release_pool("p"), step()  # d and b still live in it
    lab.free("d", "c"), step()
    lab.empty_cache(), step()
    lab.free("b"), step()
    lab.empty_cache(), step()
    lab.new_pool("q"), step()
    lab.allocate("30 MiB", name="e", pool="q"), step()
    lab.free("e"), step()
    lab.empty_cache(), step()  # q lives: its segment stays
    lab.release_pool("q"), step()


def captures(lab: Lab, step: Callable[[], None]) -> None:
    lab.allocate("4 MiB", name="w"), step()
    with lab.capture("g1"):
        lab.allocate("32 MiB", name="ws"), step()
        lab.allocate("4 MiB", name="y1"), step()
        lab.allocate("4 MiB", name="t"), step()
        lab.free("t"), step()
    step()
    with lab.capture("g2", pool="g1"):
        lab.allocate("4 MiB", name="y2"), step()
        lab.allocate("300 KiB", name="s"), step()
    step()
    lab.replay("g1"), step()
    lab.delete_graph("g1"), step()
    lab.empty_cache(), step()  # g2 holds the pool
    lab.delete_graph("g2"), step()  # the last graph: the generator's two tensors go
    lab.free("y1", "y2", "s", "ws"), step()
    lab.empty_cache(), step()
    lab.new_pool("m"), step()
    with lab.capture("g3", pool="m"):
        lab.allocate("2 MiB", name="z"), step()
    step()
    lab.free("z"), step()
    lab.delete_graph("g3"), step()
    lab.release_pool("m"), step()


def waiting_frees(lab: Lab, step: Callable[[], None]) -> None:
    lab.new_stream("side"), step()
    lab.allocate("8 MiB", name="x"), step()
    lab.allocate("1 MiB", name="small"), step()
    lab.record_stream("x", "side"), step()
    lab.record_stream("small", "side"), step()
    lab.queue_work("side", 60), step()
    lab.free("x", "small"), step()  # both wait on side's work
    lab.allocate("8 MiB", name="y"), step()  # side still busy: a new block
    lab.synchronize("side"), step()
    lab.allocate("8 MiB", count=3, name="z"), step()  # the first of the three finishes both frees
    lab.record_stream("y", "side"), step()
    lab.free("y"), step()
    lab.empty_cache(), step()  # waits for it, releases
    lab.allocate("2 MiB", name="last", stream="side"), step()
    lab.record_stream("last", "default"), step()
    lab.free("last"), step()
    lab.allocate("2 MiB", name="again", stream="side"), step()  # the idle default stream: finished here


@pytest.mark.parametrize("conf", CONFS, ids=["default", "expandable"])
@pytest.mark.parametrize("program", [mempools, captures, waiting_frees], ids=lambda f: f.__name__)
def test_the_op_log_replays_to_the_labs_numbers(program: Callable, conf: str) -> None:
    lab = Lab(backend="sim", device="H200", alloc_conf=conf)
    assert _follow(lab, program) >= 15


def test_the_log_holds_the_pool_calls_and_the_waits() -> None:
    lab = Lab(backend="sim", device="H200")
    waiting_frees(lab, lambda: None)
    kinds = [op.kind for op in lab.ops]
    assert kinds.count("free_requested") == 4 and kinds.count("free_completed") == 3  # one done by empty_cache
    first = kinds.index("free_completed")
    assert kinds[first:first + 3] == ["free_completed", "free_completed", "malloc"]  # before the malloc that did it
    lab = Lab(backend="sim", device="H200")
    captures(lab, lambda: None)
    generator = [op for op in lab.ops if op.kind == "malloc" and op.size_bytes == 8]  # g1's, then g3's (g2 shared)
    assert len(generator) == 4 and all(op.stream == lab.streams["capture"] for op in generator)
    assert {op.key for op in lab.ops if op.kind == "free"} >= {op.key for op in generator}  # g2's and g3's deletion
    begins = [op.key for op in lab.ops if op.kind == "begin_allocate_to_pool"]
    assert begins == [lab.pools["g1"].id, lab.pools["g1"].id, lab.pools["m"].id, lab.pools["m"].id]


def test_an_oom_in_a_pool_is_replayed_and_the_what_ifs_run() -> None:
    lab = Lab(backend="sim", device="H200", cap="200 MiB")
    lab.new_pool("p")
    for k in range(5):
        lab.allocate("36 MiB", name=f"a{k}", pool="p")
        lab.allocate("2 MiB", name=f"b{k}")
    lab.free(*[f"a{k}" for k in range(0, 5, 2)])
    event = lab.allocate("60 MiB", pool="p")
    assert not event.ok
    why = lab.explain_oom(event)
    assert why.replay_reproduces and why.not_replayable is None and len(why.what_ifs) > 1
    assert "No what-if" not in str(why)


def test_memory_outside_the_log_makes_the_lab_not_replayable() -> None:
    lab = Lab(backend="sim", device="H200", cap="100 MiB")
    lab.allocate("40 MiB", name="a")
    outside = lab.backend.allocator.malloc(30 * MiB)  # plain code, not the lab: the log does not hold it
    event = lab.allocate("40 MiB", name="b")
    assert not event.ok
    why = lab.explain_oom(event)
    assert not why.replay_reproduces and why.what_ifs == ()
    assert why.not_replayable.startswith("the replay of its ops under its own settings (default) serves the "
                                         "request with 80.00 MiB reserved")
    assert "No what-if: the lab cannot be replayed exactly" in str(why)
    lab.backend.allocator.free(outside)
