"""What the predictor knows about CUDA's kernels and libraries: one module per kernel family, each rule a record.

A meta tensor knows its shape, dtype and strides, and an aten op's meta kernel says what it returns. What a
GPU does beyond that is knowledge, and it all lives here, as :class:`Rule` records:

- :mod:`.cublas` — cuBLAS / cuBLASLt workspaces kept per thread;
- :mod:`.cudnn_conv` — cuDNN convolution workspaces, and the channels-last outputs cuDNN returns;
- :mod:`.attention` — which SDPA kernel runs on the target, and the workspaces of their backward passes;
- :mod:`.reductions` — the global-memory scratch of torch's reduction kernel;
- :mod:`.layer_norm` — the contiguous copies layer norm's kernels take;
- :mod:`.dropout` — the order in which dropout's fused kernel allocates its mask and output;
- :mod:`.kernels` — ops whose CUDA kernel is not their composite decomposition;
- :mod:`.autograd` — the engine's in-place gradient joins;
- :mod:`.unmodelled` — torch functions whose CUDA memory is not modelled (a note when a program calls them).

Each record says what it is (``name``, ``kind``, the ``ops``), how it is known (``basis``: ``"source"`` — a
port of the library's own code, true on every architecture given that architecture's figures; or
``"measured"`` — read off probes on a GPU, true where it was measured) and its ``evidence``
(:class:`Measurement`: the architecture, GPU, library versions and data). :func:`book_for` gives the rules for one
target architecture: for each op the rule measured on that architecture, else one that holds everywhere, else the
rule measured on another architecture — which then adds a note to the prediction the first time it applies
("measured on Hopper (sm90); applied to Ampere (sm80) unmeasured"). docs/predict.md says how to add an op or a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..gpus import GpuArch

__all__ = ["KINDS", "Measurement", "Rule", "RuleBook", "all_rules", "book_for"]

KINDS = ("allocates", "outputs", "own_kernel", "engine", "choice", "unmodelled")
"""What a rule's ``apply`` is, by ``Rule.kind``:

- ``"allocates"``: the kernel allocates beyond its outputs; ``apply(memory, op, args, kwargs, outputs)`` runs after
  the op's meta kernel (:class:`memviz.predictor.device.DeviceMemory` is what it may do); with
  ``tracks_outputs`` it accounts the outputs itself, to interleave them with its workspaces as the kernel does;
- ``"outputs"``: CUDA's kernel returns other outputs than the meta kernel (a layout): ``apply(op, args, kwargs)``
  returns them, or ``NotImplemented`` where the meta kernel is right;
- ``"own_kernel"``: CUDA runs its own kernel where the meta path would run the op's composite decomposition
  (``apply`` is None);
- ``"engine"``: the autograd engine's behaviour (``apply`` is the rule's own predicate);
- ``"choice"``: a kernel choice the target makes (``apply(arch, ...)``);
- ``"unmodelled"``: ``ops`` are torch function names, ``doc`` the note the prediction gets.
"""


@dataclass(frozen=True)
class Measurement:
    """Where a measured rule's numbers come from.

    Attributes:
        arch: the architecture key (:attr:`memviz.predictor.gpus.GpuArch.key`, e.g. ``"sm90"``).
        gpu: the card (``"H200"``).
        versions: the library versions it ran (``"torch 2.11.0+cu130, cuDNN 9.19"``).
        data: the recording and what in it (``"evaluation/recordings/h200_probe2.json.gz: ..."``).
    """

    arch: str
    gpu: str
    versions: str
    data: str


@dataclass(frozen=True)
class Rule:
    """One piece of knowledge about what a GPU does (see :data:`KINDS`).

    Attributes:
        name: what it is, in a few words (the notes name it).
        family: the kernel family (the module's name: ``"cudnn_conv"``...).
        kind: one of :data:`KINDS`.
        ops: the aten ops it applies to (or the keys its kind uses).
        apply: what it does (see :data:`KINDS`).
        basis: ``"source"`` (ported from the library's code; ``source`` names it) or ``"measured"``.
        source: the library code it follows or was read beside (file and function).
        evidence: the measurements behind it (empty for a port never measured).
        archs: the architecture keys it is for (None: every architecture: a port of source, or a fact the hardware
            does not change).
        tracks_outputs: an ``"allocates"`` rule that accounts the op's outputs itself.
        doc: the rule in words; for ``"unmodelled"`` the note a prediction gets.
    """

    name: str
    family: str
    kind: str
    ops: tuple[Any, ...]
    apply: Callable[..., Any] | None
    basis: str
    source: str = ""
    evidence: tuple[Measurement, ...] = ()
    archs: frozenset[str] | None = None
    tracks_outputs: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"rule {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.basis not in ("source", "measured"):
            raise ValueError(f"rule {self.name!r}: basis must be 'source' or 'measured', got {self.basis!r}")
        if self.basis == "measured" and not self.evidence:
            raise ValueError(f"rule {self.name!r}: a measured rule names its evidence")

    def holds_on(self, arch: GpuArch) -> bool:
        """Whether the rule was made for ``arch`` (a port, or measured on that architecture)."""
        if self.archs is not None:
            return arch.key in self.archs
        return self.basis == "source" or any(m.arch == arch.key for m in self.evidence)

    def unmeasured_note(self, arch: GpuArch) -> str:
        """The note a prediction for ``arch`` gets when this rule, measured elsewhere, applies."""
        where = ", ".join(sorted({f"{m.gpu} ({m.arch}, {m.versions})" for m in self.evidence}))
        return f"{self.name}: measured on {where}; applied to {arch.name} unmeasured"


def all_rules() -> tuple[Rule, ...]:
    """Every rule, from every family module."""
    from . import attention, autograd, cublas, cudnn_conv, dropout, kernels, layer_norm, reductions, unmodelled

    families = (cublas, cudnn_conv, attention, reductions, layer_norm, dropout, kernels, autograd, unmodelled)
    return tuple(rule for family in families for rule in family.RULES)


class RuleBook:
    """The rules for one target architecture, looked up by op (built by :func:`book_for`).

    Attributes:
        arch: the target.
        allocates: aten op → ``(apply, tracks_outputs)`` of its ``"allocates"`` rule.
        outputs: aten op → ``apply`` of its ``"outputs"`` rule.
        own_kernel: the ops whose composite CUDA does not run.
        unmodelled: torch function name → note.
        choices: rule name → the ``"choice"`` function.
        engine: rule name → the ``"engine"`` predicate.
        unmeasured: rule name → the note it adds when it applies (rules measured on another architecture).
    """

    def __init__(self, arch: GpuArch, rules: tuple[Rule, ...], note: Callable[[str], None]) -> None:
        self.arch = arch
        self.allocates: dict[Any, tuple[Callable[..., Any], bool]] = {}
        self.outputs: dict[Any, Callable[..., Any]] = {}
        self.own_kernel: frozenset[Any] = frozenset()
        self.unmodelled: dict[str, str] = {}
        self.choices: dict[str, Callable[..., Any]] = {}
        self.engine: dict[str, Callable[..., Any]] = {}
        self.unmeasured: dict[str, str] = {}
        own = set()
        for (kind, op), rule in _chosen(arch, rules).items():
            apply = rule.apply
            if not rule.holds_on(arch):
                self.unmeasured[rule.name] = rule.unmeasured_note(arch)
                apply = _noting(apply, self.unmeasured[rule.name], note)
            if kind == "allocates":
                self.allocates[op] = (apply, rule.tracks_outputs)
            elif kind == "outputs":
                self.outputs[op] = apply
            elif kind == "own_kernel":
                own.add(op)
            elif kind == "unmodelled":
                self.unmodelled[op] = rule.doc
            elif kind == "choice":
                self.choices[op] = apply
            else:
                self.engine[op] = apply
        self.own_kernel = frozenset(own)


def _chosen(arch: GpuArch, rules: tuple[Rule, ...]) -> dict[tuple[str, Any], Rule]:
    """Per ``(kind, op)`` (``op`` is the rule's name for rules of no op), the rule for ``arch``: one made for it,
    else one for every architecture, else the first declared."""
    best: dict[tuple[str, Any], Rule] = {}
    for rule in rules:
        for op in rule.ops or (rule.name,):
            key = (rule.kind, op)
            if key not in best or _rank(rule, arch) < _rank(best[key], arch):
                best[key] = rule
    return best


def _rank(rule: Rule, arch: GpuArch) -> int:
    if rule.archs is not None and arch.key in rule.archs:
        return 0
    return 1 if rule.holds_on(arch) else 2


def _noting(apply: Callable[..., Any] | None, text: str, note: Callable[[str], None]) -> Callable[..., Any] | None:
    if apply is None:
        return None

    def applied(*args: Any, **kwargs: Any) -> Any:
        note(text)
        return apply(*args, **kwargs)

    return applied


def book_for(arch: GpuArch, note: Callable[[str], None]) -> RuleBook:
    """The rules for ``arch``; ``note(text)`` is called when a rule measured on another architecture applies."""
    return RuleBook(arch, all_rules(), note)
