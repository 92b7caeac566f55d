"""memviz.errors: one hierarchy; an OOM's message is plain text, the same through str, args, repr and traceback."""

import traceback

import pytest

from memviz.errors import (
    AllocatorConfigError,
    InputError,
    InputTypeError,
    InvalidFreeError,
    MemvizError,
    OutOfMemoryError,
    SnapshotError,
)
from memviz.sim import CachingAllocator

MiB = 1 << 20


def _oom() -> OutOfMemoryError:
    a = CachingAllocator(1 << 30, memory_fraction=0.5)
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(600 * MiB)
    return e.value


def test_oom_message_reads_the_same_through_str_args_repr_and_traceback() -> None:
    err = _oom()
    text = str(err)
    assert text.startswith("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of "
                           "1024.00 MiB of which 1024.00 MiB is free. 512.00 MiB allowed; ")
    assert err.args == (text,)
    assert repr(err) == f"OutOfMemoryError({text!r})"
    assert traceback.format_exception_only(err)[0].rstrip("\n").endswith(text)
    assert (err.requested_bytes, err.alloc_size_bytes, err.reserved_bytes) == (600 * MiB, 600 * MiB, 0)


def test_one_hierarchy_keeps_the_builtin_bases() -> None:
    for cls in (InputError, InputTypeError, AllocatorConfigError, InvalidFreeError, SnapshotError):
        assert issubclass(cls, MemvizError) and issubclass(cls, ValueError)
    assert issubclass(InputTypeError, TypeError)
    assert issubclass(OutOfMemoryError, MemvizError) and issubclass(OutOfMemoryError, RuntimeError)
    assert not issubclass(OutOfMemoryError, InputError)
    import memviz.sim
    import memviz.snapshots

    assert memviz.sim.OutOfMemoryError is OutOfMemoryError and memviz.snapshots.SnapshotError is SnapshotError
