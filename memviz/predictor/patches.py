"""Every torch attribute a prediction replaces while it runs, in one table, with the torch versions it was verified on.

Modes and dispatch keys cover most of what the tracer does; these few functions of torch's decide things from the
device type (``"meta"`` is not ``"cuda"``) or touch the CUDA runtime, so for the length of one prediction they are
replaced, and put back afterwards whatever happens (:func:`applied`). Each :class:`Patch` names its targets
(``module:attribute``) and says why; ``VERIFIED`` lists the torch builds the whole test suite ran on with them.
:func:`check_torch` refuses a torch older than :data:`TORCH_FLOOR`, the oldest version the patches, the dispatch
keys and the private APIs the tracer uses were checked on.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memviz.errors import InputError

from .cuda_shim import cuda_modules, cuda_replacements
from .distributed import patches as distributed_patches
from .redirect import is_cuda
from .session import Session

__all__ = ["DISTRIBUTED_FLOOR", "PATCHES", "TORCH_FLOOR", "VERIFIED", "Patch", "applied", "check_torch"]

VERIFIED = ("2.9.1+cu128 (no GPU)", "2.11.0+cu130 (on an H200)", "2.13.0+cpu", "2.14.1+cu130 (no GPU)")
"""The torch builds every patch was verified on: the predictor's tests passed there."""

TORCH_FLOOR = (2, 9)
"""The oldest torch the predictor runs on: the oldest of :data:`VERIFIED`."""


@dataclass(frozen=True)
class Patch:
    """One replacement of torch attributes for the length of a prediction.

    Attributes:
        name: what it makes true, in a few words.
        why: the torch behaviour that needs it.
        make: ``make(session, original)`` → ``{"module:attribute": replacement}``; ``original(target)`` is the
            attribute as torch has it.
        verified: the torch builds it was verified on.
        applies: ``applies(session)``: whether the prediction needs it (default: always); the distributed patches
            apply when the prediction plays a rank (:mod:`memviz.predictor.distributed`).
    """

    name: str
    why: str
    make: Callable[[Session, Callable[[str], Any]], dict[str, Any]]
    verified: tuple[str, ...] = VERIFIED
    applies: Callable[[Session], bool] = lambda session: True


def _resolve(target: str) -> tuple[Any, str]:
    """``"module.path:Class.attribute"`` → (the object holding the attribute, the attribute's name)."""
    module_name, _, attribute = target.partition(":")
    obj: Any = importlib.import_module(module_name.split(".", 1)[0])
    for part in module_name.split(".")[1:]:
        obj = getattr(obj, part, None) or importlib.import_module(f"{obj.__name__}.{part}")
    *owners, attribute = attribute.split(".")
    for owner in owners:
        obj = getattr(obj, owner)
    return obj, attribute


def _original(target: str) -> Any:
    obj, attribute = _resolve(target)
    return obj.__dict__[attribute] if isinstance(obj, type) and attribute in obj.__dict__ else getattr(obj, attribute)


def _foreach_defaults(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    foreach = original("torch.utils._foreach_utils:_get_foreach_kernels_supported_devices")
    fused = original("torch.utils._foreach_utils:_get_fused_kernels_supported_devices")

    def foreach_devices() -> list[str]:
        return [*foreach(), "meta"]

    def fused_devices() -> list[str]:
        return [*fused(), "meta"]

    return {"torch.utils._foreach_utils:_get_foreach_kernels_supported_devices": foreach_devices,
            "torch.utils._foreach_utils:_get_fused_kernels_supported_devices": fused_devices,
            "torch.optim.optimizer:_get_foreach_kernels_supported_devices": foreach_devices,
            "torch.optim.optimizer:_get_fused_kernels_supported_devices": fused_devices}


def _checkpoint_device(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    infer = original("torch.utils.checkpoint:_infer_device_type")

    def infer_device_type(*args: Any) -> str:
        device = infer(*args)
        return "cuda" if device == "meta" else device

    return {"torch.utils.checkpoint:_infer_device_type": infer_device_type}


def _autocast_cache(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    clear = original("torch:clear_autocast_cache")

    def clear_autocast_cache() -> None:
        session.emulation.clear_cache()
        clear()

    return {"torch:clear_autocast_cache": clear_autocast_cache}


def _default_device(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    set_default, get_default = original("torch:set_default_device"), original("torch:get_default_device")

    def set_default_device(device: Any) -> None:
        session.default_cuda = device is not None and is_cuda(device)
        if not session.default_cuda:
            set_default(device)

    def get_default_device() -> torch.device:
        return torch.device("cuda", 0) if session.default_cuda else get_default()

    return {"torch:set_default_device": set_default_device, "torch:get_default_device": get_default_device}


def _compile_eagerly(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    def compile_eagerly(model: Any = None, **kwargs: Any) -> Any:
        session.note("torch.compile: predicted as eager PyTorch (compiled kernels fuse, and may hold less)")
        return model if model is not None else (lambda fn: fn)

    return {"torch:compile": compile_eagerly}


def _data_parallel(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    def data_parallel_forward(self: torch.nn.DataParallel, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    return {"torch.nn.DataParallel:forward": data_parallel_forward}


def _engine_with_redirect(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    run_backward = original("torch.autograd:_engine_run_backward")

    def engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        with session.redirect:
            return run_backward(*args, **kwargs)

    return {"torch.autograd:_engine_run_backward": engine_run_backward}


def _cuda_runtime(session: Session, original: Callable[[str], Any]) -> dict[str, Any]:
    replacements = cuda_replacements(session)
    return {f"{module.__name__}:{name}": value for name, value in replacements.items() for module in cuda_modules()
            if name in vars(module)}


PATCHES: tuple[Patch, ...] = (
    Patch("torch.cuda answers for the simulated GPU",
          "a CPU-only torch has no CUDA runtime and a CUDA torch must not touch the real one: availability, device "
          "queries, RNG, streams, events and the memory queries (which read the simulator), in torch.cuda, "
          "torch.cuda.memory and torch.accelerator (memviz.predictor.cuda_shim)", _cuda_runtime),
    Patch("the optimizers' foreach and fused defaults as on CUDA",
          "torch.optim picks foreach / fused kernels by the parameters' device type: meta tensors stand for CUDA ones",
          _foreach_defaults),
    Patch("checkpoint recomputes under CUDA's autocast state",
          "torch.utils.checkpoint saves and restores the autocast state of the inputs' device type",
          _checkpoint_device),
    Patch("torch.clear_autocast_cache clears the emulated cache",
          "the outermost autocast region's end clears the cast cache (memviz.predictor.autocast)", _autocast_cache),
    Patch("torch.set_default_device('cuda') lands factories on the device",
          "torch's default-device mode would make real CUDA tensors", _default_device),
    Patch("torch.compile runs eagerly (with a note)", "compiled kernels cannot be traced on meta tensors",
          _compile_eagerly),
    Patch("backward hooks see the GPU as forward does",
          "a TorchFunctionMode is off inside its own handler, and backward() is handled by it, so the autograd engine "
          "would capture a mode stack without it: what backward hooks ask of the GPU (FSDP2's all-gathers, "
          "torch.empty(device='cuda')) would not be redirected; the engine's entry runs with it pushed again",
          _engine_with_redirect),
    Patch("DataParallel on one GPU runs its module",
          "with one device id torch runs the module on the inputs; its scatter needs the CUDA runtime",
          _data_parallel),
    *distributed_patches(),
)
"""Every patch, applied in this order and put back in the reverse order."""


@contextlib.contextmanager
def applied(session: Session) -> Iterator[None]:
    """Apply every patch of :data:`PATCHES` for the block; put every attribute back after it, whatever happens."""
    saved: list[tuple[Any, str, Any, bool]] = []  # (owner, attribute, original, whether the owner itself had it)
    try:
        for patch in PATCHES:
            if not patch.applies(session):
                continue
            for target, value in patch.make(session, _original).items():
                obj, attribute = _resolve(target)
                own = not isinstance(obj, type) or attribute in obj.__dict__
                saved.append((obj, attribute, _original(target), own))
                setattr(obj, attribute, value)
        yield
    finally:
        for obj, attribute, value, own in reversed(saved):
            if own:
                setattr(obj, attribute, value)
            else:
                delattr(obj, attribute)  # inherited: the class's own entry goes, the base's shows again


DISTRIBUTED_FLOOR = (2, 11)
"""The oldest torch distributed programs are predicted on: the fake process group's collectives and FSDP2 as
torch 2.11 (the H200's) and 2.13 run them; on 2.9.1 c10d's collectives reach the tracer with no meta kernel."""


def check_torch(version: str | None = None, distributed: bool = False) -> None:
    """Refuse a torch older than :data:`TORCH_FLOOR` (``version``: default the installed one), or than
    :data:`DISTRIBUTED_FLOOR` for a distributed program.

    Raises:
        InputError: the torch is older; the message says which versions are supported.
    """
    version = version or torch.__version__
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        raise InputError(f"memviz.predict: cannot read the torch version {version!r}") from None
    if distributed and (major, minor) < DISTRIBUTED_FLOOR:
        floor = ".".join(map(str, DISTRIBUTED_FLOOR))
        raise InputError(f"memviz.predict(..., world_size=...) needs torch >= {floor} (verified on 2.11.0+cu130 and "
                         f"2.13.0+cpu); this is torch {version}. Single-GPU programs are predicted from "
                         f"{'.'.join(map(str, TORCH_FLOOR))}.")
    if (major, minor) < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        raise InputError(f"memviz.predict needs torch >= {floor} (verified on {', '.join(VERIFIED)}); this is "
                         f"torch {version}. Upgrade torch, or predict where a newer torch is installed: the "
                         "prediction needs no GPU.")
