"""memviz.sim.errors: an OOM's message is built when first read, and reads the same every way."""

import traceback

import pytest

from memviz.sim import CachingAllocator, OutOfMemoryError

MiB = 1 << 20


def _oom() -> OutOfMemoryError:
    a = CachingAllocator(1 << 30, memory_fraction=0.5)
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(600 * MiB)
    return e.value


def test_lazy_message_reads_the_same_through_str_args_repr_and_traceback() -> None:
    err = _oom()
    text = str(err)
    assert text.startswith("CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of "
                           "1024.00 MiB of which 1024.00 MiB is free. 512.00 MiB allowed; ")
    assert err.args == (text,)
    assert repr(err) == f"OutOfMemoryError({text!r})"
    assert traceback.format_exception_only(err)[0].rstrip("\n").endswith(text)
    fresh = _oom()
    assert fresh.args == (text,)  # args alone also builds it
    assert (fresh.requested_bytes, fresh.alloc_size_bytes, fresh.reserved_bytes) == (600 * MiB, 600 * MiB, 0)


def test_plain_message_and_args_setter() -> None:
    err = OutOfMemoryError("plain", requested_bytes=1)
    assert (str(err), err.args) == ("plain", ("plain",))
    err = _oom()
    err.args = ("replaced",)
    assert str(err) == "replaced"
