"""Will it fit? Predict a PyTorch program's GPU memory with no GPU.

``predict(fn, *args, device="A100-40GB", cap=None, alloc_conf=None, **kwargs)`` runs ``fn(*args, **kwargs)``
— an ordinary CUDA training or inference script — on meta tensors (no GPU, no memory, no compute) and
drives :class:`memviz.sim.CachingAllocator` with every allocation it makes, as CUDA would (autocast,
SDPA's kernel choice, the optimizers' foreach defaults, cuBLAS/cuBLASLt workspaces; see
:mod:`memviz.predict.trace`). ``max_batch`` bisects the largest batch that fits. ``python -m memviz.fit``
does both from a shell. Works on the CPU-only torch and on the CUDA one (it never touches a GPU).
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable
from typing import Any

from memviz.devices import PRESETS
from memviz.units import parse_size

from .gpus import ARCHS, GpuArch, arch_for
from .result import CATEGORIES, OutOfMemory, Prediction
from .trace import PHASES, DataDependentError

__all__ = ["ARCHS", "CATEGORIES", "DEVICES", "PHASES", "DataDependentError", "GpuArch", "OutOfMemory",
           "Prediction", "max_batch", "predict", "predicting"]

DEVICES: tuple[str, ...] = tuple(k for k in PRESETS if k in ARCHS)
"""The preset names ``device=`` accepts (any size such as ``"24 GiB"`` works too)."""

Progress = Callable[[int, "int | None", str], None]

_active = 0


def predicting() -> bool:
    """True while :func:`predict` runs the caller's program: skip value-dependent code (logging
    ``loss.item()``) with ``if not memviz.predicting(): ...``."""
    return _active > 0


def _cap_bytes(cap: int | str | None) -> int | None:
    return None if cap is None else parse_size(cap)


def predict(fn: Callable[..., Any], *args: Any, device: Any = "A100-40GB", cap: int | str | None = None,
            alloc_conf: str | None = None, on_progress: Progress | None = None, **kwargs: Any) -> Prediction:
    """Run ``fn(*args, **kwargs)`` with no GPU and predict its memory on ``device``.

    Args:
        fn: the program, unchanged: it uses ``"cuda"`` as it would on a GPU.
        device: a preset (:data:`DEVICES`: ``"T4"``, ``"A100-40GB"``, ``"H200"``...) or a size
            (``"24 GiB"``, bytes; taken as a Hopper for the workspaces).
        cap: the allocator's limit in bytes or as ``"4 GiB"`` (what ``set_per_process_memory_fraction``
            gives), default None: the whole device less the CUDA context.
        alloc_conf: a ``PYTORCH_CUDA_ALLOC_CONF`` string (default: torch's defaults).
        on_progress: called as ``on_progress(events_so_far, None, phase)`` every 1024 allocations.

    Returns:
        A :class:`Prediction`. An allocation that does not fit raises ``torch.OutOfMemoryError`` inside
        ``fn`` at that op, as on the GPU; if ``fn`` lets it out, the prediction says ``fits=False`` and
        ``oom`` names the request, op, module and line.

    Raises:
        DataDependentError: ``fn`` needs tensor values (``.item()``, ``nonzero``...) — see its message.
        Whatever ``fn`` raises (with a note saying where the prediction stopped).
        memviz.errors.InputError / ValueError: a bad device, cap or alloc_conf.
    """
    global _active
    from .trace import Session

    dev, arch = arch_for(device)
    cap_bytes = _cap_bytes(cap)
    conf = alloc_conf or ""
    session = Session(dev, arch, cap_bytes, conf, on_progress)
    start = time.perf_counter()
    _active += 1
    try:
        import torch

        with session.active():
            try:
                fn(*args, **kwargs)
            except torch.OutOfMemoryError:
                if session.oom is None:
                    raise
            except Exception as e:
                if hasattr(e, "add_note"):  # Python 3.11+
                    e.add_note(f"memviz.predict: the program stopped after {len(session.events)} allocator "
                               f"events, in phase {session.phase!r}")
                raise
    finally:
        _active -= 1
    return Prediction(session, cap_bytes, conf, time.perf_counter() - start)


def max_batch(fn_of_batch: Callable[[int], Any], device: Any = "A100-40GB", cap: int | str | None = None,
              alloc_conf: str | None = None, lo: int = 1, hi: int | None = None,
              on_progress: Progress | None = None) -> int:
    """The largest batch ``b`` in ``[lo, hi]`` for which ``fn_of_batch(b)`` fits (0 if ``lo`` does not).

    Doubles from ``lo`` until a batch does not fit (or ``hi``), then bisects; one :func:`predict` per try.
    Assumes memory grows with the batch. ``on_progress(tries_done, None, "batch B: fits"/"OOM")`` after
    each try.

    Raises:
        ValueError: ``lo < 1``, ``hi < lo``, or no OOM up to 2**24 with no ``hi`` (memory does not grow).
    """
    if not isinstance(lo, int) or lo < 1:
        raise ValueError(f"lo must be an int >= 1, got {lo!r}")
    if hi is not None and (not isinstance(hi, int) or hi < lo):
        raise ValueError(f"hi must be an int >= lo ({lo}), got {hi!r}")
    tries = 0

    def fits(b: int) -> bool:
        nonlocal tries
        ok = predict(fn_of_batch, b, device=device, cap=cap, alloc_conf=alloc_conf).fits
        tries += 1
        if on_progress is not None:
            on_progress(tries, None, f"batch {b}: {'fits' if ok else 'OOM'}")
        return ok

    if not fits(lo):
        return 0
    good, bad = lo, None
    while bad is None:
        nxt = good * 2 if hi is None else min(good * 2, hi)
        if nxt == good:
            return good
        if nxt > 1 << 24:
            raise ValueError("no batch up to 2**24 ran out of memory: does the program's memory grow with the batch?")
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


class _CallableModule(types.ModuleType):
    """``memviz.predict`` is both this package and the function: importing a submodule
    (``memviz.examples``) binds the package to ``memviz.predict``, so the package calls :func:`predict`."""

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Prediction:
        return predict(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
