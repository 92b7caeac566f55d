"""Hostile numbers at the simulator's boundary: each is refused with an error naming the input, or handled
within the designed limits (16 TiB devices, a 47-bit address space), and the state stays as it was."""

from __future__ import annotations

import contextlib

import pytest

from memviz.errors import AllocatorConfigError, InputError, InputTypeError
from memviz.sim import MAX_DEVICE_BYTES, CachingAllocator, OutOfMemoryError, fraction_for_cap, parse_alloc_conf
from memviz.sim.addresses import VA_SPLIT, AddressSpace

MiB, TiB = 1 << 20, 1 << 40


@pytest.mark.parametrize("total", [2**80, MAX_DEVICE_BYTES + 1, 0, -1])
def test_device_sizes_outside_the_designed_limit_are_refused(total: int) -> None:
    with pytest.raises(InputError, match="total_memory must be between 1 and"):
        CachingAllocator(total)


@pytest.mark.parametrize("total", [1.5e12, "16 GiB", None, True])
def test_device_sizes_of_the_wrong_type_are_refused(total: object) -> None:
    with pytest.raises(InputTypeError, match="total_memory must be an int"):
        CachingAllocator(total)  # type: ignore[arg-type]


@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_the_largest_device_gets_positive_addresses_and_releases_them(conf: str) -> None:
    a = CachingAllocator(MAX_DEVICE_BYTES, alloc_conf=conf)
    ptrs = [a.malloc(n) for n in (MAX_DEVICE_BYTES // 2, MAX_DEVICE_BYTES // 4, 1000, 30 * MiB)]
    assert all(0 < p < 1 << 47 for p in ptrs)
    a._check()
    for p in ptrs:
        a.free(p)
    a.empty_cache()
    a._check()
    assert a.memory_reserved() == 0


def test_running_out_of_address_space_is_a_failed_cudamalloc() -> None:
    """Reservations held by 2 MiB segments pile up until the cudaMalloc half (64 TiB) is full."""
    a = CachingAllocator(16 * TiB)
    with pytest.raises(OutOfMemoryError):
        for k in range(20):
            big = a.malloc(8 * TiB - 2 * MiB + k * 32 * MiB)
            a.malloc(MiB), a.malloc(MiB)
            a.free(big)
            a.empty_cache()
    a._check()
    assert all(s.ptr >= VA_SPLIT for s in a.iter_segments())


def test_address_space_refuses_what_does_not_fit() -> None:
    space = AddressSpace()
    assert space.malloc(1 << 46) is None and space.reserve(1 << 46) is None
    assert space.malloc(2 * MiB) is not None and space.reserve(2 * MiB) is not None


@pytest.mark.parametrize("bad", [None, 1.0, "0x7fe000000000", True])
def test_free_of_a_non_address_is_refused_and_changes_nothing(bad: object) -> None:
    a = CachingAllocator(1 << 30)
    p = a.malloc(4 * MiB)
    before = a.memory_stats()
    with pytest.raises(InputTypeError, match="free\\(\\) takes the int address"):
        a.free(bad)  # type: ignore[arg-type]
    assert a.memory_stats() == before
    a.free(p)


@pytest.mark.parametrize("size", [-1, 2**80])
def test_malloc_sizes_out_of_range(size: int) -> None:
    with pytest.raises(InputError, match="malloc size"):
        CachingAllocator(1 << 30).malloc(size)


@pytest.mark.parametrize("conf", ["max_split_size_mb:²", "max_split_size_mb:١٢٨", "max_split_size_mb:1_28",
                                  "garbage_collection_threshold:0.6_0", "garbage_collection_threshold:٠.٦",
                                  "garbage_collection_threshold:nan", "max_split_size_mb:128abc"])
def test_alloc_conf_numbers_torch_does_not_read_are_refused(conf: str) -> None:
    with pytest.raises(AllocatorConfigError, match=conf.split(":")[0]):
        parse_alloc_conf(conf)


@pytest.mark.parametrize("conf", ["garbage_collection_threshold:.6", "garbage_collection_threshold:6e-1",
                                  "garbage_collection_threshold:+0.6"])
def test_alloc_conf_numbers_in_c_syntax_are_read(conf: str) -> None:
    assert parse_alloc_conf(conf).garbage_collection_threshold == 0.6


@pytest.mark.parametrize(("total", "cap"), [(2**62 // 1024, 2**62 // 1024 - 1), (2**44, 2**44 - 1),
                                            (80 << 30, 2 << 30), (141 << 30, (141 << 30) - 1)])
def test_a_cap_always_caps(total: int, cap: int) -> None:
    f = fraction_for_cap(cap, total)
    assert f < 1.0 and int(f * total) <= cap
    if total <= 2**53:
        assert int(f * total) == cap  # exact for every real device


def test_fraction_for_a_huge_device_caps_below_the_ask() -> None:
    f = fraction_for_cap(2**62 - 1, 2**62)
    assert f < 1.0 and 2**62 - 1024 <= int(f * 2**62) <= 2**62 - 1
    assert fraction_for_cap(2**62, 2**62) == 1.0


@pytest.mark.parametrize("cap", [1.5, "2 GiB", 0, -5, 2**45])
def test_bad_caps_are_refused(cap: object) -> None:
    with pytest.raises(InputError, match="cap"):
        fraction_for_cap(cap, 2**44)  # type: ignore[arg-type]


@pytest.mark.parametrize("fraction", [float("nan"), 1.5, -0.1, "0.5", True])
def test_bad_fractions_are_refused(fraction: object) -> None:
    a = CachingAllocator(1 << 30)
    with pytest.raises(InputError, match="memory fraction"):
        a.set_memory_fraction(fraction)  # type: ignore[arg-type]
    assert a.allowed_memory_bytes is None
    with contextlib.suppress(OutOfMemoryError):
        a.malloc(1 << 29)
