"""Run a CUDA program on meta tensors and drive the simulated allocator with what it allocates.

One :class:`Session` per prediction. While it is active:

- a ``TorchFunctionMode`` (:class:`_Redirect`) turns every request for the GPU (``device="cuda"``,
  ``.cuda()``, ``.to("cuda")``, ``torch.cuda.*``) into meta tensors, and marks the calls that touch GPU
  tensors, so that what they produce counts as device memory;
- a ``TorchDispatchMode`` (:class:`_Capture`) sees every aten op below autograd; each output whose storage
  is new is one ``malloc`` of the storage's bytes, and a weak reference on the storage frees it when the
  storage dies (storages, not tensors: views share one; in-place ops make none). The library workspaces
  the real kernels would ask for are added by rule (:mod:`memviz.predict.workspaces`);
- :class:`memviz.predict.autocast.CudaEmulation` applies CUDA's autocast and kernel choices;
- module hooks and optimizer hooks name the module and the phase (forward, backward, optimizer).

The allocator runs online, so ``torch.cuda.memory_allocated()`` inside the program reads the simulator,
and an allocation that fails raises ``torch.OutOfMemoryError`` in the program at the op that asked, as on
the GPU. Everything is put back when the session ends, whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode

from memviz.errors import OutOfMemoryError
from memviz.sim import CachingAllocator, fraction_for_cap

from . import accumulate, workspaces
from .autocast import CudaEmulation
from .cuda_shim import patched_cuda
from .fastmeta import shortcut
from .gpus import GpuArch

__all__ = ["DataDependentError", "Event", "Session"]

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""The predictor's own code: frames here are never the program's (memviz.examples' programs are)."""

PHASES = ("setup", "forward", "backward", "optimizer", "other")


class DataDependentError(RuntimeError):
    """The program needs a tensor's values (``.item()``, ``nonzero``, a branch on a tensor), which a
    prediction does not compute.

    Attributes: ``op`` (the aten op), ``line`` (the user's ``file:line``).
    """

    def __init__(self, op: str, line: str) -> None:
        self.op = op
        self.line = line
        super().__init__(
            f"memviz.predict: {op} needs the tensor's values, which a prediction does not compute "
            f"(at {line}). Memory does not depend on them: skip that code while predicting, e.g. "
            "`if not memviz.predicting(): print(loss.item())`, or pass the value in as a Python number.")


_DATA_DEPENDENT = {
    torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default, torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.repeat_interleave.Tensor, torch.ops.aten.bincount.default, torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default, torch.ops.aten.nonzero_static.default,
}


_RANDOM_FILL = {torch.ops.aten.uniform_.default, torch.ops.aten.normal_.default, torch.ops.aten.bernoulli_.float,
                torch.ops.aten.random_.default, torch.ops.aten.exponential_.default, torch.ops.aten.log_normal_.default}
"""In-place random fills skipped on host parameters (``nn.init``): the CPU work of building a model."""


class Event:
    """One allocator call of the prediction: an ``alloc`` or a ``free`` of ``nbytes`` (the request), or the
    program's ``empty_cache`` (0 bytes).

    ``alloc_index`` is, for a free, the index of its alloc; ``category`` is the alloc's (set when known:
    parameters, gradients, optimizer state, activations, temporaries, workspaces); ``allocated_bytes`` /
    ``reserved_bytes`` are the allocator's after the call.
    """

    __slots__ = ("action", "alloc_index", "allocated_bytes", "category", "line", "module", "nbytes", "op",
                 "phase", "ptr", "reserved_bytes")

    def __init__(self, action: str, nbytes: int, ptr: int, alloc_index: int, op: str, module: str, line: str,
                 phase: str, category: str | None, allocated_bytes: int, reserved_bytes: int) -> None:
        self.action = action
        self.nbytes = nbytes
        self.ptr = ptr
        self.alloc_index = alloc_index
        self.op = op
        self.module = module
        self.line = line
        self.phase = phase
        self.category = category
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"Event({self.action} {self.nbytes} B, {self.category}, {self.op}, {self.module}, {self.line})"


def _is_cuda(dev: Any) -> bool:
    if isinstance(dev, str):
        return dev.startswith("cuda")
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    return isinstance(dev, int) and not isinstance(dev, bool)


def _is_cpu(dev: Any) -> bool:
    return (isinstance(dev, str) and dev.startswith("cpu")) or (isinstance(dev, torch.device) and dev.type == "cpu")


class Session:
    """The state of one prediction: the allocator, the events, the live storages, the phase."""

    def __init__(self, device: Any, arch: GpuArch, cap_bytes: int | None, alloc_conf: str,
                 on_progress: Callable[[int, int | None, str], None] | None = None) -> None:
        self.device = device
        self.arch = arch
        total = device.total_memory_bytes
        context = min(arch.context_bytes, total // 4)
        self.allocator_args = (total, fraction_for_cap(cap_bytes, total), alloc_conf or "", context)
        self.allocator = self.new_allocator()
        self.events: list[Event] = []
        self.live: dict[int, list] = {}  # storage id -> [ptr, nbytes, alloc event index]
        self._refs: dict[int, tuple[weakref.ref, int]] = {}
        self.producers: dict[int, int] = {}  # storage id -> sequence number of the backward node that made it
        self.host_values: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # small device tensors' known values
        self.gpu_depth = 0
        self.default_cuda = False  # the program called torch.set_default_device("cuda")
        self.phase = "setup"
        self.phase_marks: list[tuple[int, str]] = [(0, "setup")]
        self.module_stack: list[str] = []  # the modules whose forward is running, outermost first
        self.module_stack_ids: list[int] = []
        self.module_names: dict[int, str] = {}
        self.modules: dict[int, torch.nn.Module] = {}
        self.workspaces: dict[tuple[str, str], int] = {}
        self.oom: dict[str, Any] | None = None
        self.notes: dict[str, None] = {}  # what this prediction could not model, in the order met
        if arch.capability < (9, 0):
            self.note(f"library workspaces on {arch.name}: cuBLAS sizes from torch's source, cuDNN's extrapolated "
                      "from the H200's measurements")
        self.closed = False
        self.on_progress = on_progress
        self.emulation = CudaEmulation(self.is_device, self._choose_sdpa, self.forget)

    def new_allocator(self) -> CachingAllocator:
        """A fresh allocator like this session's (capacity, cap, config, context)."""
        total, fraction, conf, context = self.allocator_args
        return CachingAllocator(total, fraction, conf, context_bytes=context, device_name="GPU 0")

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` in the program: recorded, so that a replay of the events agrees."""
        self.allocator.empty_cache()
        self.events.append(Event("empty_cache", 0, 0, len(self.events), "empty_cache", self.where(),
                                 self.user_line(), self.phase, "temporaries", self.allocator.memory_allocated(),
                                 self.allocator.memory_reserved()))

    # ---- what is on the device

    def is_device(self, t: torch.Tensor) -> bool:
        return t.is_meta and id(t.untyped_storage()) in self.live

    def any_device(self, args: tuple, kwargs: dict) -> bool:
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if a.is_meta and id(a.untyped_storage()) in self.live:
                    return True
            elif (isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor) and a[0].is_meta
                  and id(a[0].untyped_storage()) in self.live):
                return True
        return False

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        self.gpu_depth += 1
        try:
            yield
        finally:
            self.gpu_depth -= 1

    @contextlib.contextmanager
    def on_host(self) -> Iterator[None]:
        depth, self.gpu_depth = self.gpu_depth, 0
        try:
            yield
        finally:
            self.gpu_depth = depth

    def note(self, text: str) -> None:
        """Record something this prediction does not model (shown in ``Prediction.notes``)."""
        self.notes.setdefault(text, None)

    # ---- where the program is

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.phase_marks.append((len(self.events), phase))

    def user_line(self) -> str:
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if not (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR)
                    or name.startswith("<frozen")):
                return f"{name}:{f.f_lineno} ({f.f_code.co_name})"
            f = f.f_back
        return ""

    def where(self) -> str:
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                return node.name()
        return self.module_stack[-1] if self.module_stack else ""

    # ---- allocator calls

    def malloc(self, nbytes: int, op: str, category: str | None = None, soft: bool = False) -> tuple[int, int]:
        """Allocate in the simulator, record the event; raise ``torch.OutOfMemoryError`` as CUDA would.

        ``soft``: the caller survives an OOM (cuDNN tries its next plan): return ``(0, -1)`` instead (the
        failed attempt has still released the cache, as it does on the GPU).
        """
        alloc = self.allocator
        try:
            ptr = alloc.malloc(nbytes)
        except OutOfMemoryError as e:
            if soft:
                return 0, -1
            if self.oom is None:
                self.oom = {"requested_bytes": nbytes, "message": str(e), "op": op, "module": self.where(),
                            "line": self.user_line(), "phase": self.phase, "event_index": len(self.events)}
            raise torch.OutOfMemoryError(str(e)) from None
        index = len(self.events)
        self.events.append(Event("alloc", nbytes, ptr, index, op, self.where(), self.user_line(), self.phase,
                                 category, alloc.memory_allocated(), alloc.memory_reserved()))
        if self.on_progress is not None and not index & 1023:
            self.on_progress(index, None, self.phase)
        return ptr, index

    def free(self, ptr: int, index: int, op: str = "") -> None:
        alloc = self.allocator
        alloc.free(ptr)
        e = self.events[index]
        self.events.append(Event("free", e.nbytes, ptr, index, op, "", "", self.phase, e.category,
                                 alloc.memory_allocated(), alloc.memory_reserved()))

    def track(self, t: torch.Tensor, op: str) -> None:
        st = t.untyped_storage()
        key = id(st)
        entry = self.live.get(key)
        nbytes = st.nbytes()
        if entry is not None:
            if entry[1] == nbytes:
                return
            self.free(entry[0], entry[2], op)  # resized: CUDA reallocates
            del self.live[key]
        if nbytes == 0:
            return
        ptr, index = self.malloc(nbytes, op)
        self.live[key] = [ptr, nbytes, index]
        ref = weakref.ref(st, self._storage_died)
        self._refs[id(ref)] = (ref, key)

    def mark_producer(self, out: Any) -> None:
        """Remember which backward node made these outputs (:mod:`memviz.predict.accumulate`)."""
        node = accumulate.current_node()
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.is_meta:
                self.producers[id(t.untyped_storage())] = node

    def producer_of(self, t: torch.Tensor) -> int:
        """The sequence number of the backward node that made ``t``'s storage, or -1."""
        return self.producers.get(id(t.untyped_storage()), -1)

    def _storage_died(self, ref: weakref.ref) -> None:
        _, key = self._refs.pop(id(ref))
        self.producers.pop(key, None)
        entry = self.live.pop(key, None)
        if entry is not None and not self.closed:
            self.free(entry[0], entry[2])

    def forget(self, *tensors: torch.Tensor) -> None:
        """These outputs stay on the host on a GPU (e.g. flash attention's RNG seed): no device memory."""
        for t in tensors:
            entry = self.live.pop(id(t.untyped_storage()), None)
            if entry is not None:
                self.free(entry[0], entry[2])

    def remember_values(self, device_tensor: torch.Tensor, host: torch.Tensor) -> None:
        """``device_tensor`` holds ``host``'s values (a copy of a host tensor, a mask torch builds): torch's own
        decisions on them (:func:`_detect_is_causal_mask`) read the host copy. Forgotten when it dies."""
        key = id(device_tensor)
        self.host_values[key] = (weakref.ref(device_tensor, lambda ref: self.host_values.pop(key, None)), host)

    def values_of(self, device_tensor: torch.Tensor) -> torch.Tensor | None:
        """The host tensor with ``device_tensor``'s values, or None if they are not known."""
        entry = self.host_values.get(id(device_tensor))
        return entry[1] if entry is not None and entry[0]() is device_tensor else None

    def tag(self, t: Any, category: str, overwrite: bool = False) -> None:
        if isinstance(t, torch.Tensor) and t.is_meta:
            entry = self.live.get(id(t.untyped_storage()))
            if entry is not None:
                e = self.events[entry[2]]
                if e.category is None or overwrite:
                    e.category = category

    # ---- CUDA's decisions

    def _choose_sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout_p: float,
                     enable_gqa: bool) -> str:
        return workspaces.choose_sdpa_backend(self.arch, q, k, v, mask, dropout_p, enable_gqa)

    # ---- lifetime

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Install everything for the block; put everything back after it, whatever happens."""
        import torch._dynamo  # imported lazily by the dispatch machinery: it must see the real torch.cuda

        accumulate.last_reference_counts()  # measured once, before any mode of ours is active
        saved_rng = torch.get_rng_state()
        saved_grad = torch.is_grad_enabled()
        saved_autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cuda", "cpu")]
        saved_cache = torch.is_autocast_cache_enabled()
        hooks = []
        restore: list[tuple[Any, str, Any]] = []
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(patched_cuda(self))
                restore.extend(_patch_torch(self))
                hooks.extend(_install_hooks(self))
                self.emulation.enter()
                stack.callback(self.emulation.exit)
                stack.enter_context(_Capture(self))
                stack.enter_context(_Redirect(self))
                yield
        finally:
            self.closed = True
            for handle in hooks:
                handle.remove()
            for obj, name, value in reversed(restore):
                setattr(obj, name, value)
            torch.set_rng_state(saved_rng)
            torch.set_grad_enabled(saved_grad)
            for d, enabled, dtype in saved_autocast:
                torch.set_autocast_enabled(d, enabled)
                torch.set_autocast_dtype(d, dtype)
            torch.set_autocast_cache_enabled(saved_cache)
            torch.clear_autocast_cache()


def _patch_torch(session: Session) -> list[tuple[Any, str, Any]]:
    """Module attributes replaced for the session: (object, name, original) to put back."""
    import torch.optim.optimizer as optimizer
    import torch.utils._foreach_utils as foreach_utils
    import torch.utils.checkpoint as checkpoint

    saved = []

    def put(obj: Any, name: str, value: Any) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    original_foreach = foreach_utils._get_foreach_kernels_supported_devices
    original_fused = foreach_utils._get_fused_kernels_supported_devices
    # The optimizers' foreach/fused defaults as on CUDA: meta tensors stand for CUDA ones.
    put(foreach_utils, "_get_foreach_kernels_supported_devices", lambda: [*original_foreach(), "meta"])
    put(foreach_utils, "_get_fused_kernels_supported_devices", lambda: [*original_fused(), "meta"])
    put(optimizer, "_get_foreach_kernels_supported_devices", foreach_utils._get_foreach_kernels_supported_devices)
    put(optimizer, "_get_fused_kernels_supported_devices", foreach_utils._get_fused_kernels_supported_devices)
    original_infer = checkpoint._infer_device_type

    def infer_device_type(*args: Any) -> str:  # checkpoint recomputes under CUDA's autocast state
        device = original_infer(*args)
        return "cuda" if device == "meta" else device

    put(checkpoint, "_infer_device_type", infer_device_type)
    original_clear = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        session.emulation.clear_cache()
        original_clear()

    put(torch, "clear_autocast_cache", clear_autocast_cache)
    original_set_default, original_get_default = torch.set_default_device, torch.get_default_device

    def set_default_device(device: Any) -> None:  # "cuda" as the default: factories land on the device
        session.default_cuda = device is not None and _is_cuda(device)
        if not session.default_cuda:
            original_set_default(device)

    def get_default_device() -> torch.device:
        return torch.device("cuda", 0) if session.default_cuda else original_get_default()

    put(torch, "set_default_device", set_default_device)
    put(torch, "get_default_device", get_default_device)

    def compile_eagerly(model: Any = None, **kwargs: Any) -> Any:
        session.note("torch.compile: predicted as eager PyTorch (compiled kernels fuse, and may hold less)")
        return model if model is not None else (lambda fn: fn)

    put(torch, "compile", compile_eagerly)

    def data_parallel_forward(self: torch.nn.DataParallel, *inputs: Any, **kwargs: Any) -> Any:
        # one GPU: DataParallel runs the module on the inputs (its scatter of device inputs to the one device
        # makes views, no memory), as torch does with one device id
        return self.module(*inputs, **kwargs)

    put(torch.nn.DataParallel, "forward", data_parallel_forward)

    import torch.nn.modules.transformer as transformer

    original_generate = transformer._generate_square_subsequent_mask
    original_detect = transformer._detect_is_causal_mask

    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> torch.Tensor:
        mask = original_generate(sz, device=device, dtype=dtype)
        if mask.is_meta:
            with session.on_host():
                session.remember_values(mask, original_generate(sz, device="cpu", dtype=dtype))
        return mask

    def detect_is_causal_mask(mask: Any, is_causal: Any = None, size: Any = None) -> bool:
        """nn.Transformer* compare a mask with a causal one when not told (``is_causal=None``): on the host
        copy of its values where they are known (a mask torch built, or moved from the host), else not causal
        (the mask is used as given), said in the notes."""
        if is_causal is None and isinstance(mask, torch.Tensor) and mask.is_meta:
            host = session.values_of(mask)
            if host is None:
                session.note("nn.Transformer: a mask of unknown values was taken as not causal (pass "
                             "is_causal=True / tgt_is_causal=True when it is)")
                return False
            with session.on_host():
                return original_detect(host, is_causal, size)
        return original_detect(mask, is_causal, size)

    put(transformer, "_generate_square_subsequent_mask", generate_square_subsequent_mask)
    put(transformer, "_detect_is_causal_mask", detect_is_causal_mask)
    return saved


def _install_hooks(session: Session) -> list[Any]:
    """Global module and optimizer hooks naming the module and the phase; their handles to remove."""
    names = session.module_names

    def pre(module: torch.nn.Module, args: Any) -> None:
        key = id(module)
        name = names.get(key)
        if name is None:
            name = type(module).__name__
            if session.module_stack:
                parent = session.modules.get(session.module_stack_ids[-1])
                if parent is not None:
                    for child_name, child in parent._modules.items():
                        if child is module:
                            name = f"{session.module_stack[-1]}.{child_name}"
                            break
            names[key] = name
            session.modules[key] = module
            for p in module.parameters(recurse=False):
                session.tag(p, "parameters")
            for b in module.buffers(recurse=False):
                session.tag(b, "parameters")
        if session.phase not in ("backward", "forward"):
            session.set_phase("forward")
        session.module_stack.append(name)
        session.module_stack_ids.append(key)

    def post(module: torch.nn.Module, args: Any, output: Any) -> None:
        if session.module_stack:
            session.module_stack.pop()
            session.module_stack_ids.pop()

    def step_pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        session.set_phase("optimizer")
        for group in opt.param_groups:
            for p in group["params"]:
                session.tag(p, "parameters")
                session.tag(p.grad, "gradients")

    def step_post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for state in opt.state.values():
            for v in state.values():
                session.tag(v, "optimizer state")
        session.set_phase("other")

    import torch.optim.optimizer as optimizer
    from torch.nn.modules import module as module_mod

    return [module_mod.register_module_forward_pre_hook(pre),
            module_mod.register_module_forward_hook(post, always_call=True),
            optimizer.register_optimizer_step_pre_hook(step_pre),
            optimizer.register_optimizer_step_post_hook(step_post)]


_ADD, _ADD_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor


_OWN_CUDA_KERNEL = frozenset({torch.ops.aten.silu_backward.default})
"""Ops with a CompositeImplicitAutograd kernel (``math_silu_backward``: a sigmoid and five temporaries) that
CUDA does not use: it runs its own kernel, one output. From torch 2.14.1's CUDA build, the aten ops that
register both a composite and a CUDA kernel and reach this mode on meta tensors (``mish_backward`` has no
meta kernel, so autograd decomposes it before: Mish's backward is predicted with its composite's
temporaries)."""


class _Capture(TorchDispatchMode):
    """Every aten op: run it on meta, account the storages it creates, add the libraries' workspaces."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self._composite: dict[Any, bool] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        s = self.session
        kwargs = kwargs or {}
        composite = self._composite.get(func)
        if composite is None:
            composite = self._composite[func] = func not in _OWN_CUDA_KERNEL and \
                torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        if composite:  # reached undecomposed (inference mode): run its decomposition, op by op, as CUDA would
            with self:
                return func.decompose(*args, **kwargs)
        if func in _DATA_DEPENDENT and any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
            raise DataDependentError(func.__name__, s.user_line())
        if func is _ADD and s.gpu_depth and accumulate.runs_in_place(args, kwargs, s.producer_of):
            func = _ADD_  # the engine's gradient join, in place on the GPU (memviz.predict.accumulate)
        if func in _RANDOM_FILL and args[0].requires_grad and not args[0].is_meta:
            return args[0]  # a parameter's initialisation on the host: its values never reach the prediction
        out = shortcut(func, args, kwargs)
        if out is NotImplemented:
            out = func(*args, **kwargs)
        if s.gpu_depth:
            name = func.__name__
            rule = workspaces.RULES.get(func)
            if rule is not None and func in workspaces.TRACKS_OUTPUTS:
                rule(s, func, args, kwargs, out)
            else:
                if isinstance(out, torch.Tensor):
                    if out.is_meta:
                        s.track(out, name)
                elif isinstance(out, (tuple, list)):
                    for t in out:
                        if isinstance(t, torch.Tensor) and t.is_meta:
                            s.track(t, name)
                if rule is not None:
                    rule(s, func, args, kwargs, out)
            if torch._C._current_graph_task_id() != -1:
                s.mark_producer(out)
        return out


class _Redirect(TorchFunctionMode):
    """Requests for the GPU become meta tensors; calls on GPU tensors are marked as device work."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        s = self.session
        kwargs = kwargs or {}
        special = _SPECIAL.get(func)
        if special is not None:
            return special(s, func, args, kwargs)
        unmodelled = _UNMODELLED.get(getattr(func, "__name__", None))
        if unmodelled is not None and s.any_device(args, kwargs):
            s.note(unmodelled)
        device = kwargs.get("device")
        if device is None and s.default_cuda and func in _FACTORIES:
            device = "cuda"
        if device is not None and _is_cuda(device):
            kwargs["device"] = "meta"
            with s.on_device():
                return func(*args, **kwargs)
        if s.any_device(args, kwargs):
            with s.on_device():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def _to_device(s: Session, t: torch.Tensor, call: Callable[..., torch.Tensor], *args: Any,
               **kwargs: Any) -> torch.Tensor:
    if t.is_meta and not s.is_device(t):
        kwargs["copy"] = True  # a host meta tensor: the copy is the device allocation
    with s.on_device():
        out = call(t, *args, **kwargs)
    if isinstance(t, torch.nn.Parameter):
        s.tag(out, "parameters")
    elif not t.is_meta and t.device.type == "cpu" and t.numel() <= _KNOWN_VALUES_NUMEL and out is not t:
        s.remember_values(out, t)
    return out


_KNOWN_VALUES_NUMEL = 1 << 20
"""Host tensors up to this many elements keep their values for torch's decisions on the device copy (a
``tgt_mask`` built on the host and moved: 4 MiB of host memory at most each, while the copy lives)."""


def _tensor_cuda(s: Session, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    t = args[0]
    if s.is_device(t):
        return t
    memory_format = kwargs.get("memory_format", torch.preserve_format)
    return _to_device(s, t, torch.Tensor.to, "meta", memory_format=memory_format)


def _tensor_to(s: Session, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    t, rest = args[0], list(args[1:])
    target = None
    for i, a in enumerate(rest):
        if isinstance(a, torch.dtype):
            continue
        if _is_cuda(a):
            rest[i], target = "meta", "cuda"
        elif _is_cpu(a):
            target = "cpu"
        elif isinstance(a, torch.Tensor):
            target = "cuda" if s.is_device(a) else ("cpu" if a.device.type == "cpu" else None)
    if "device" in kwargs:
        if _is_cuda(kwargs["device"]):
            kwargs["device"], target = "meta", "cuda"
        elif _is_cpu(kwargs["device"]):
            target = "cpu"
    if target == "cuda":
        return _to_device(s, t, func, *rest, **kwargs)
    if target == "cpu" and s.is_device(t):
        return _to_host(s, t, next((a for a in (*rest, kwargs.get("dtype")) if isinstance(a, torch.dtype)), None))
    if s.is_device(t):
        with s.on_device():
            return func(t, *rest, **kwargs)
    return func(t, *rest, **kwargs)


def _to_host(s: Session, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``.cpu()`` of a device tensor: a host copy, no device memory (its values are not known)."""
    with s.on_host():
        return torch.empty_like(t, dtype=dtype or t.dtype, device="meta")


def _tensor_cpu(s: Session, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    t = args[0]
    return _to_host(s, t) if s.is_device(t) else func(*args, **kwargs)


def _tensor_backward(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    previous = s.phase
    s.set_phase("backward")
    try:
        with s.on_device():
            return func(*args, **kwargs)
    finally:
        for module in s.modules.values():
            for p in module.parameters(recurse=False):
                s.tag(p.grad, "gradients")
        s.set_phase("other" if previous == "forward" else previous)


def _linear(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.linear``. ``at::linear`` takes ``addmm`` for a 2-D input and a flattened ``addmm`` for a contiguous
    one; otherwise (a transposed input, as ``nn.MultiheadAttention`` with ``batch_first`` makes) it runs
    ``matmul`` and adds the bias in place — but out of place whenever a dispatch mode is active (it takes the
    mode for a tensor subclass), one output-sized temporary the GPU never allocates. Done here as on the GPU
    (under autocast the bias is added in its own dtype, without autocast's cast copy of a few KiB)."""
    inp, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if not s.any_device(args, kwargs):
        return func(*args, **kwargs)
    with s.on_device():
        if bias is None or inp.dim() == 2 or inp.is_contiguous():
            return func(*args, **kwargs)
        return torch.matmul(inp, weight.t()).add_(bias)


_CUDA0 = torch.device("cuda", 0)


def _tensor_device(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``t.device`` of a device tensor is ``cuda:0``, as on the GPU: ``torch.arange(n, device=x.device)``,
    ``device = next(model.parameters()).device`` and ``torch.autocast(x.device.type)`` land on the device.
    torch's pickling (``torch.save``, ``Tensor.__reduce_ex__``) sees ``meta``: it saves no values."""
    if not s.is_device(args[0]):
        return func(*args, **kwargs)
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_OWN_DIR):
        f = f.f_back
    if f is not None and f.f_code.co_filename in _SEES_META:
        return func(*args, **kwargs)
    return _CUDA0


_SEES_META = {os.path.join(_TORCH_DIR, "serialization.py"), os.path.join(_TORCH_DIR, "_tensor.py")}
"""Where a device tensor's ``.device`` stays ``meta``: torch's serialization and ``Tensor``'s pickling and
deep copy (which copy meta tensors with ``clone``, on the device, instead of reading their storage)."""


def _tensor_is_cuda(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    return True if s.is_device(args[0]) else func(*args, **kwargs)


def _tensor_get_device(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    return 0 if s.is_device(args[0]) else func(*args, **kwargs)


def _pass_through(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    return args[0]


def _data_dependent(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    if isinstance(t, torch.Tensor) and t.is_meta:
        frame = _torch_caller()
        if frame is not None:
            rel = os.path.relpath(frame.f_code.co_filename, _TORCH_DIR).replace(os.sep, "/")
            answer = _HEALTHY_READS.get(((rel, frame.f_code.co_name), func.__name__))
            if answer is not None:
                return answer(frame)
        raise DataDependentError(f"Tensor.{func.__name__}", s.user_line())
    return func(*args, **kwargs)


_PLUMBING = {os.path.join(_TORCH_DIR, *name.split("/")) for name in ("overrides.py", "_tensor.py", "utils/_device.py")}


def _torch_caller() -> Any:
    """The frame of torch's code that asked for the value (a generator expression's enclosing function), or None
    if the first frame outside memviz and torch's dispatch plumbing is the user's."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(_OWN_DIR) or name.startswith("<frozen") or name in _PLUMBING \
                or (name.startswith(_TORCH_DIR) and f.f_code.co_name.startswith("<")):
            f = f.f_back
            continue
        return f if name.startswith(_TORCH_DIR) else None
    return None


_HEALTHY_READS: dict[tuple[tuple[str, str], str], Callable[[Any], Any]] = {
    # GradScaler's step asks whether a gradient overflowed: a healthy step, as on the GPU
    (("amp/grad_scaler.py", "_maybe_opt_step"), "item"): lambda frame: 0.0,
    # get_scale() / state_dict(): no step overflowed, so no step lowered the scale (accelerate compares the
    # scale before and after update() to see a skipped step: none is)
    (("amp/grad_scaler.py", "get_scale"), "item"): lambda frame: float(frame.f_locals["self"]._init_scale),
    (("amp/grad_scaler.py", "_get_growth_tracker"), "item"): lambda frame: 0,
    # a distribution checks its arguments and samples (validate_args, on by default): a valid program's pass
    (("distributions/distribution.py", "__init__"), "__bool__"): lambda frame: True,
    (("distributions/distribution.py", "_validate_sample"), "__bool__"): lambda frame: True,
}
"""Values torch's own code reads from device tensors in an ordinary program: ((file under torch/, function),
Tensor method) → the answer a healthy run on the GPU gets, from the asking frame. Their memory does not depend
on the answer; the program's own reads (``loss.item()``) stay :class:`DataDependentError`."""


_FACTORIES = frozenset(_device_constructors())
"""The functions ``torch.set_default_device`` applies to (``torch.utils._device``)."""

_UNMODELLED = {
    **dict.fromkeys(("lstm", "gru", "rnn_tanh", "rnn_relu"),
                    "recurrent layers: cuDNN's packed weights, workspace and reserve space are not modelled "
                    "(the cell-by-cell composite is predicted instead)"),
    "conv_transpose2d": "transposed convolutions: cuDNN's workspace is not modelled",
}
"""Torch functions whose CUDA memory the prediction does not model, by name → the note it adds."""

_SPECIAL: dict[Any, Callable[[Session, Any, tuple, dict], Any]] = {
    torch.Tensor.cuda: _tensor_cuda,
    torch.Tensor.to: _tensor_to,
    torch.Tensor.cpu: _tensor_cpu,
    torch.Tensor.backward: _tensor_backward,
    torch.autograd.backward: _tensor_backward,
    torch.autograd.grad: _tensor_backward,
    torch.nn.functional.linear: _linear,
    torch.Tensor.pin_memory: _pass_through,
    torch.Tensor.device.__get__: _tensor_device,
    torch.Tensor.is_cuda.__get__: _tensor_is_cuda,
    torch.Tensor.get_device: _tensor_get_device,
    torch.Tensor.numpy: _data_dependent,
    torch.Tensor.tolist: _data_dependent,
    torch.Tensor.item: _data_dependent,
    torch.Tensor.__bool__: _data_dependent,
    torch.Tensor.__float__: _data_dependent,
    torch.Tensor.__int__: _data_dependent,
}
