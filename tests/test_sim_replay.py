"""memviz.sim.replay: the one replay loop (what-if, OOM explanations, the benchmark and the golden test run it)."""

from __future__ import annotations

import pytest

from memviz.errors import InputError
from memviz.sim import CachingAllocator, Op, OutOfMemoryError, replay

MiB = 1 << 20


def test_ops_map_keys_to_the_allocators_addresses() -> None:
    a = CachingAllocator(1 << 30, memory_fraction=0.4)  # a 409.6 MiB cap
    ops = [Op("malloc", 7, 100 * MiB), Op("malloc", 8, 200 * MiB), Op("malloc", 9, 300 * MiB),  # the last: OOM
           Op("probe", None, 50 * MiB), Op("free", 9), Op("free", 7), Op("free", 12345), Op("empty_cache")]
    seen: list[tuple[int, str, bool]] = []
    outcome = replay(ops, a, lambda step, op, oom: seen.append((step, op.kind, oom is None)))
    assert outcome.steps == len(ops) and outcome.ooms == 1 and outcome.oom_steps == [2]
    assert outcome.last_ok and list(outcome.live) == [8] and a.live_block(outcome.live[8]) is not None
    assert seen == [(0, "malloc", True), (1, "malloc", True), (2, "malloc", False), (3, "probe", True),
                    (4, "free", True), (5, "free", True), (6, "free", True), (7, "empty_cache", True)]
    assert a.memory_allocated() == 200 * MiB
    a._check()


def test_on_step_sees_the_oom_itself() -> None:
    errors: list[OutOfMemoryError] = []
    replay([Op("malloc", 0, 2 << 30)], CachingAllocator(1 << 30),
           lambda step, op, oom: errors.append(oom) if oom else None)
    assert len(errors) == 1 and "Tried to allocate 2.00 GiB" in str(errors[0])


def test_an_unknown_kind_stops_the_replay_by_name() -> None:
    a = CachingAllocator(1 << 30)
    with pytest.raises(InputError, match=r"ops\[1\]: kind 'alloc' is not an op kind"):
        replay([Op("malloc", 0, MiB), Op("alloc", 1, MiB)], a)
    assert a.memory_allocated() == MiB  # the ops before it ran


def test_an_empty_replay() -> None:
    outcome = replay([], CachingAllocator(1 << 30))
    assert (outcome.steps, outcome.ooms, outcome.last_ok, outcome.live) == (0, 0, True, {})
