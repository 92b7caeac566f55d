"""``predict`` and ``max_batch``: run a program with no GPU and replay what it allocates through the simulator."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from memviz.errors import InputError
from memviz.units import parse_size

from .gpus import arch_for
from .result import Prediction, RankPredictions

__all__ = ["max_batch", "predict", "predicting"]

Progress = Callable[[int, "int | None", str], None]

_active = 0


def predicting() -> bool:
    """True while :func:`predict` runs the caller's program: skip value-dependent code (logging
    ``loss.item()``) with ``if not memviz.predicting(): ...``."""
    return _active > 0


@contextlib.contextmanager
def _traced(session: Any) -> Iterator[None]:
    """Install the tracer for the block: the patches, the hooks, CUDA's emulation, the two modes; put every global
    back after it (modes, patched functions, dispatcher registrations, autocast state, grad mode, the RNG),
    whatever happens."""
    import torch
    import torch._dynamo

    from . import patches
    from .autocast import CudaEmulation
    from .capture import Capture
    from .distributed import rank_environment
    from .hooks import install_hooks
    from .redirect import Redirect
    from .rules.autograd import last_reference_counts

    last_reference_counts()  # measured once, before any mode of ours is active
    saved_rng = torch.get_rng_state()
    saved_grad = torch.is_grad_enabled()
    saved_autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cuda", "cpu")]
    saved_cache = torch.is_autocast_cache_enabled()
    session.emulation = CudaEmulation(session.is_device, session.choose_sdpa, session.forget)
    hooks: list[Any] = []
    try:
        with contextlib.ExitStack() as stack:
            if session.world_size is not None:
                stack.enter_context(rank_environment(session.world_size, session.rank))
            stack.enter_context(patches.applied(session))
            hooks.extend(install_hooks(session))
            session.emulation.enter()
            stack.callback(session.emulation.exit)
            stack.enter_context(Capture(session))
            stack.enter_context(Redirect(session))
            yield
    finally:
        session.closed = True
        for handle in hooks:
            handle.remove()
        torch.set_rng_state(saved_rng)
        torch.set_grad_enabled(saved_grad)
        for d, enabled, dtype in saved_autocast:
            torch.set_autocast_enabled(d, enabled)
            torch.set_autocast_dtype(d, dtype)
        torch.set_autocast_cache_enabled(saved_cache)
        torch.clear_autocast_cache()


def predict(fn: Callable[..., Any], *args: Any, device: Any = "A100-40GB", cap: int | str | None = None,
            alloc_conf: str | None = None, on_progress: Progress | None = None, world_size: int | None = None,
            rank: int | str = 0, **kwargs: Any) -> Prediction | RankPredictions:
    """Run ``fn(*args, **kwargs)`` with no GPU and predict its memory on ``device``.

    With ``world_size``, ``fn`` is a program written for ``torchrun`` (``init_process_group``,
    ``torch.cuda.set_device(local_rank)``, ``init_device_mesh``, FSDP2's ``fully_shard``, DDP) and runs as rank
    ``rank`` of ``world_size`` against torch's fake process group, one GPU per process
    (:mod:`memviz.predictor.distributed`): the prediction is that rank's allocator. ``rank="all"`` predicts every
    rank (:class:`memviz.predictor.RankPredictions`).

    Args:
        fn: the program, unchanged: it uses ``"cuda"`` as it would on a GPU.
        device: a preset (:data:`memviz.predictor.DEVICES`: ``"T4"``, ``"A100-40GB"``, ``"H200"``...) or a size
            (``"24 GiB"``, bytes; taken as a Hopper for the rules).
        cap: the allocator's limit in bytes or as ``"4 GiB"`` (what ``set_per_process_memory_fraction``
            gives), default None: the whole device less the CUDA context.
        alloc_conf: a ``PYTORCH_CUDA_ALLOC_CONF`` string (default: torch's defaults).
        on_progress: called as ``on_progress(calls_so_far, None, phase)`` every 1024 allocations.
        world_size: the number of ranks of a distributed job (default None: a single-GPU program).
        rank: the rank to predict, in ``[0, world_size)`` (default 0), or ``"all"``.

    Returns:
        A :class:`memviz.predictor.Prediction` (with ``rank="all"``, a :class:`memviz.predictor.RankPredictions`
        of one per rank). An allocation that does not fit raises ``torch.OutOfMemoryError`` inside ``fn`` at that
        op, as on the GPU; if ``fn`` lets it out, the prediction says ``fits=False`` and
        ``oom`` names the request, op, module and line.

    Raises:
        memviz.errors.DataDependentError: ``fn`` needs tensor values (``.item()``, ``nonzero``...) — see its message.
        Whatever ``fn`` raises (with a note saying where the prediction stopped).
        memviz.errors.InputError / ValueError: a bad device, cap, alloc_conf, world size or rank; a torch older than
            the predictor supports (:func:`memviz.predictor.patches.check_torch`); a world size on a torch without
            the fake process group.
    """
    from .patches import check_torch

    check_torch(distributed=world_size is not None)
    dev, arch = arch_for(device)
    cap_bytes = None if cap is None else parse_size(cap)
    if world_size is None:
        if rank not in (0, "all"):
            raise InputError(f"rank={rank!r} needs world_size (the number of ranks of the job)")
        return _predict_one(fn, args, kwargs, dev, arch, cap_bytes, alloc_conf, on_progress, None, 0)
    ranks = _ranks(world_size, rank)
    if rank != "all":
        return _predict_one(fn, args, kwargs, dev, arch, cap_bytes, alloc_conf, on_progress, world_size, ranks[0])
    return RankPredictions(world_size, {r: _predict_one(fn, args, kwargs, dev, arch, cap_bytes, alloc_conf,
                                                        on_progress, world_size, r) for r in ranks})


def _ranks(world_size: Any, rank: Any) -> list[int]:
    """The ranks ``rank`` names (``"all"``: every one), checked; refuses a torch without the fake group."""
    from .distributed import check_rank, fake_pg_available

    check_rank(world_size, 0 if rank == "all" else rank)
    if not fake_pg_available():
        raise InputError("predicting a rank needs torch.distributed and torch's fake process group "
                         "(torch.testing._internal.distributed.fake_pg, torch >= 2.9); this torch has neither")
    return list(range(world_size)) if rank == "all" else [rank]


def _predict_one(fn: Callable[..., Any], args: tuple, kwargs: dict, dev: Any, arch: Any, cap_bytes: int | None,
                 alloc_conf: str | None, on_progress: Progress | None, world_size: int | None,
                 rank: int) -> Prediction:
    global _active
    from .session import Session

    session = Session(dev, arch, cap_bytes, alloc_conf or "", on_progress)
    if world_size is not None:
        session.world_size, session.rank = world_size, rank
    start = time.perf_counter()
    _active += 1
    try:
        import torch

        with _traced(session):
            try:
                fn(*args, **kwargs)
            except torch.OutOfMemoryError:
                if session.oom is None:
                    raise
            except Exception as e:
                if hasattr(e, "add_note"):  # Python 3.11+
                    as_rank = "" if world_size is None else f" as rank {rank} of {world_size}"
                    e.add_note(f"memviz.predict: the program stopped{as_rank} after {len(session.calls)} allocator "
                               f"events, in phase {session.phase!r}")
                raise
    finally:
        _active -= 1
    return session.result(time.perf_counter() - start)


def max_batch(fn_of_batch: Callable[[int], Any], device: Any = "A100-40GB", cap: int | str | None = None,
              alloc_conf: str | None = None, lo: int = 1, hi: int | None = None,
              on_progress: Progress | None = None, world_size: int | None = None, rank: int | str = 0) -> int:
    """The largest batch ``b`` in ``[lo, hi]`` for which ``fn_of_batch(b)`` fits (0 if ``lo`` does not).

    Doubles from ``lo`` until a batch does not fit (or ``hi``), then bisects; one :func:`predict` per try.
    Assumes memory grows with the batch. ``on_progress(tries_done, None, "batch B: fits"/"OOM")`` after
    each try. ``world_size`` / ``rank``: a torchrun program's batch per rank, as :func:`predict` takes them
    (``rank="all"``: the largest batch every rank fits).

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
        ok = predict(fn_of_batch, b, device=device, cap=cap, alloc_conf=alloc_conf, world_size=world_size,
                     rank=rank).fits
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
