"""Will it fit? Predict a PyTorch program's GPU memory with no GPU.

:func:`memviz.predict` (this package's :func:`predict`) runs ``fn(*args, **kwargs)`` — an ordinary CUDA training or
inference script — on meta tensors (no GPU, no memory, no compute) and drives :class:`memviz.sim.CachingAllocator`
with every allocation it makes, as CUDA would; :func:`max_batch` bisects the largest batch that fits;
``python -m memviz.fit`` does both from a shell. Works on the CPU-only torch and on the CUDA one (it never touches
a GPU).

The parts, one idea each:

- :mod:`.run` — ``predict`` / ``max_batch``: install the tracer, run the program, put everything back;
- :mod:`.session` — one prediction's state, and the :class:`~.device.DeviceMemory` the rules see (:mod:`.device`);
- :mod:`.redirect` (a ``TorchFunctionMode``: requests for the GPU become meta tensors) and :mod:`.capture` (a
  ``TorchDispatchMode``: every aten op, its storages allocated, the rules applied); :mod:`.hooks` (module and
  phase); :mod:`.autocast` (CUDA's autocast on meta tensors); :mod:`.patches` (the torch attributes replaced
  meanwhile, :mod:`.cuda_shim` among them); :mod:`.fastmeta` (faster meta kernels, same outputs);
- :mod:`.rules` — what the GPU's kernels and libraries do beyond the meta kernels, by kernel family, each rule a
  record with its evidence, keyed by architecture (:mod:`.gpus`);
- :mod:`.streams` — CUDA streams and events: each stream's allocations in its own pools;
- :mod:`.distributed` — a ``torchrun`` program as rank R of N: the fake process group, DDP, FSDP2's ``resize_``,
  and the estimate of what a rank holds outside the allocator (CUDA context, NCCL);
- :mod:`.events` and :mod:`.result` — the immutable log and the :class:`Prediction` built from it
  (:class:`RankPredictions`: one per rank).
"""

from __future__ import annotations

from memviz.devices import PRESETS
from memviz.errors import DataDependentError

from .events import CATEGORIES, PHASES, AllocatorCall
from .gpus import ARCHS, GpuArch
from .result import OutOfMemory, Prediction, RankPredictions
from .run import max_batch, predict, predicting

__all__ = ["ARCHS", "CATEGORIES", "DEVICES", "PHASES", "AllocatorCall", "DataDependentError", "GpuArch",
           "OutOfMemory", "Prediction", "RankPredictions", "max_batch", "predict", "predicting"]

DEVICES: tuple[str, ...] = tuple(k for k in PRESETS if k in ARCHS)
"""The preset names ``device=`` accepts (any size such as ``"24 GiB"`` works too)."""
