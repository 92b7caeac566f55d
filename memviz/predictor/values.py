"""The values a prediction knows: small device tensors computed on the CPU beside their meta tensors.

Library code reads values to decide: transformers checks whether an attention mask is all ones and whether
position ids describe packed sequences, ``generate()`` stops when every sequence has produced an end token,
``GradScaler`` skips a step whose gradients overflowed, ``x[mask]`` and ``nonzero`` size their outputs by
what they select. A prediction computes no activations, but it can compute these: they come from host data or
from factories (``torch.tensor``, ``ones``, ``arange``, ``randint``...), and are small.

The rule (one policy, no per-library table):

- **Known values.** A device storage has a host copy of its values (a *shadow*, a real CPU storage of the same
  bytes) when it was copied from a host tensor whose values are real, or made by a factory, or written by an op
  whose inputs all have known values — each storage at most :data:`SHADOW_BYTES` and each op reading at most
  :data:`COMPUTE_BYTES`; the op then runs on the CPU too, on the shadows, and its outputs get theirs. Views share
  their storage's shadow; an in-place op updates it, or drops it when an input is unknown. An in-place random
  fill (a parameter's initialisation: ``nn.init``'s, skipped on the host while predicting) leaves values unknown,
  and so does ``empty`` until something writes all of it (``fill_``, ``zero_``, ``copy_``).
- **Unknown values read as zeros.** A read the program makes of values the prediction did not compute
  (``loss.item()``, ``bool(t)``, ``t.tolist()``, ``nonzero`` / ``x[mask]`` / ``unique`` on them) gets zeros:
  the read tensor's storage is given a zero shadow (up to :data:`READ_BYTES`; a larger read raises
  :class:`memviz.errors.DataDependentError`), and the prediction's notes say where it first happened. Where
  unknown values meet known ones in an op (a generated token combined with the sequences still running), the
  unknown ones are taken as zeros there too if they are integer or boolean (token ids, flags: the data programs
  branch on, not the numbers a model computes) and their storages at most :data:`SHADOW_BYTES`, so what is known
  stays known: ``generate()``'s length limit stops it even though its end-of-sequence check reads unknown tokens. So a
  logged loss is 0.0, ``GradScaler`` sees no overflow (a healthy step), greedy ``generate()`` runs to
  ``max_new_tokens`` unless 0 is an end token, a mask of unknown values selects nothing.
- **A decision on computed numbers holds.** A boolean computed from numbers a model computes (a comparison of
  scores, and what ``any`` / ``all`` / ``&`` / ``~`` make of such booleans alone) is a *decision*; where it meets
  known values it is taken as True, not zero: the loop it would end keeps going, to the limit the program sets
  (beam search's "can the open beams still improve?" test: it runs to ``max_new_tokens``, the longest and most
  memory-hungry run, as greedy decoding does under the zeros above). Noted apart.
- **An assertion holds.** ``torch._is_all_true`` of unknown values (what torch's own checks use:
  ``torch._check_tensor_all``, a distribution's ``validate_args``) is True, as in a healthy run.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from memviz.errors import DataDependentError

__all__ = ["COMPUTE_BYTES", "READ_BYTES", "SHADOW_BYTES", "Values"]

SHADOW_BYTES = 16 << 20
"""The largest device storage whose values are kept on the host (16 MiB: 4 Mi int32, 2 Mi int64 elements)."""

COMPUTE_BYTES = 64 << 20
"""The most bytes of known inputs an op may read to be computed on the CPU (bounds the host work per op)."""

READ_BYTES = 256 << 20
"""The largest storage of unknown values a read fills with zeros (beyond, the read is refused)."""

aten = torch.ops.aten

_ASSERTIONS = frozenset({aten._is_all_true.default})
"""Ops that check an assertion: on unknown values they hold."""

_NO_OP_ASSERTIONS = frozenset({aten._assert_async.default, aten._assert_async.msg})


class Values:
    """The shadows of one prediction: device storage → host storage of the same bytes.

    Args:
        is_device: whether a meta tensor stands for a device tensor (the session's).
        note: adds a note to the prediction.
        user_line: where in the program the current op was called.
    """

    def __init__(self, is_device: Callable[[torch.Tensor], bool], note: Callable[[str], None],
                 user_line: Callable[[], str]) -> None:
        self._is_device = is_device
        self._note = note
        self._user_line = user_line
        self._shadows: dict[int, tuple[weakref.ref, torch.UntypedStorage]] = {}
        self._unknown_host: dict[int, weakref.ref] = {}  # host storages whose values were never really written
        self.zero_reads = 0
        self._first_zero_read = ""
        self._decisions: dict[int, weakref.ref] = {}  # storages of booleans computed from a model's numbers
        self.decisions_taken = 0
        self._first_decision = ""

    # ---- host tensors

    def forget_host(self, t: torch.Tensor) -> None:
        """A host tensor's values were not really written (its random initialisation was skipped)."""
        if not t.is_meta:
            st = t.untyped_storage()
            key = id(st)
            self._unknown_host[key] = weakref.ref(st, lambda ref: self._unknown_host.pop(key, None))

    def host_known(self, t: torch.Tensor) -> bool:
        """Whether a host tensor's values are real (not meta, not a skipped initialisation)."""
        if t.is_meta:
            return False
        entry = self._unknown_host.get(id(t.untyped_storage()))
        return entry is None or entry() is None

    # ---- shadows

    def of(self, t: torch.Tensor) -> torch.Tensor | None:
        """The host tensor with ``t``'s values (a view of its storage's shadow), or None if they are unknown."""
        st = t.untyped_storage()
        entry = self._shadows.get(id(st))
        if entry is None or entry[0]() is not st:
            return None
        return torch.empty(0, dtype=t.dtype).set_(entry[1], t.storage_offset(), t.shape, t.stride())

    def drop(self, t: torch.Tensor) -> None:
        """``t``'s storage no longer has known values."""
        self._shadows.pop(id(t.untyped_storage()), None)

    def _new_shadow(self, t: torch.Tensor, zero: bool = True) -> torch.Tensor | None:
        """A shadow for ``t``'s storage (a view of it as ``t``; zeros, or left to be written when ``t`` covers the
        whole storage and ``zero`` is False), or None when the storage is too large."""
        st = t.untyped_storage()
        nbytes = st.nbytes()
        if nbytes > SHADOW_BYTES:
            return None
        host = torch.UntypedStorage(nbytes)
        if zero or t.numel() * t.element_size() != nbytes:
            host.fill_(0)
        key = id(st)
        self._shadows[key] = (weakref.ref(st, lambda ref: self._shadows.pop(key, None)), host)
        return self.of(t)

    def set_from(self, t: torch.Tensor, values: torch.Tensor) -> None:
        """``t`` (a device tensor with its own storage) holds ``values`` (a host tensor of its shape)."""
        shadow = self._new_shadow(t, zero=False)
        if shadow is not None:
            shadow.copy_(values)

    def _known(self, t: torch.Tensor) -> bool:
        if not t.is_meta:
            return self.host_known(t)
        st = t.untyped_storage()
        entry = self._shadows.get(id(st))
        return entry is not None and entry[0]() is st

    # ---- ops

    def after(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """An op ran on meta tensors and made ``out``: compute it on the shadows where its inputs are known."""
        kind = _kinds.get(func)
        if kind is None:
            kind = _kinds[func] = _kind(func)
        written = _written(kind[0], args, kwargs) if kind[0] else ()
        if kind[1] == "random_fill" or kind[1] == "empty":  # an initialisation, or no values yet: unknown
            return self._unknown(written)
        tensors = _tensors(args, kwargs)
        read_bytes = 0
        known_meta = False
        zeros: list[torch.Tensor] = []  # unknown inputs taken as zeros (decisions: as True) where they meet known ones
        for t in tensors:
            if self._known(t):
                known_meta = known_meta or t.is_meta
            elif not t.is_meta:
                return self._unknown(written)  # a host tensor of unknown values (a skipped initialisation)
            elif t.is_floating_point() or t.is_complex() or t.requires_grad:
                self._decide(out)  # numbers a model computes (weights, activations, gradients, state)
                return self._unknown(written)
            elif not (kind[1] == "overwrite" and any(w is t for w in written)):  # fill_ / copy_ read nothing
                zeros.append(t)
            read_bytes += t.numel() * t.element_size()
        if zeros and not known_meta:
            if all(self._is_decision(t) for t in zeros):
                self._decide(out)
            return self._unknown(written)
        if read_bytes > COMPUTE_BYTES or any(t.untyped_storage().nbytes() > SHADOW_BYTES for t in zeros):
            return self._unknown(written)
        inputs_storages = {id(t.untyped_storage()) for t in tensors if t.is_meta}
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        fresh = [o for o in outputs if isinstance(o, torch.Tensor) and o.is_meta
                 and id(o.untyped_storage()) not in inputs_storages]
        if any(o.untyped_storage().nbytes() > SHADOW_BYTES for o in fresh):
            return self._unknown(written)
        decisions = [t for t in zeros if self._is_decision(t)]
        if decisions:
            self._took_decision(func.__name__)
        if len(decisions) < len(zeros):
            self._took_zeros(func.__name__)
        shadows: dict[int, torch.Tensor] = {}
        for t in tensors:
            if t.is_meta:
                shadow = self.of(t) if self._known(t) else self._new_shadow(t)  # an overwritten one: zeros first
                if shadow is None:
                    return self._unknown(written)
                if any(d is t for d in decisions):
                    shadow.fill_(True)
                shadows[id(t)] = shadow
        try:
            result = func(*_host(args, shadows), **{k: _host_one(v, shadows) for k, v in kwargs.items()})
        except Exception:  # a kernel the CPU lacks (flash attention...): its outputs are unknown
            return self._unknown(written)
        results = result if isinstance(result, (tuple, list)) else (result,)
        fresh_ids = {id(o) for o in fresh}
        for meta, host in zip(outputs, results, strict=False):
            if id(meta) in fresh_ids and isinstance(host, torch.Tensor) and host.shape == meta.shape:
                self.set_from(meta, host)

    def _unknown(self, written: tuple | list) -> None:
        for w in written:
            if w.is_meta:
                self.drop(w)

    def _decide(self, out: Any) -> None:
        """The boolean outputs of an op on a model's numbers are decisions (see the module's policy)."""
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.is_meta and o.dtype is torch.bool:
                st = o.untyped_storage()
                key = id(st)
                self._decisions[key] = weakref.ref(st, lambda ref, key=key: self._decisions.pop(key, None))

    def _is_decision(self, t: torch.Tensor) -> bool:
        st = t.untyped_storage()
        entry = self._decisions.get(id(st))
        return entry is not None and entry() is st

    def _took_decision(self, what: str) -> None:
        self.decisions_taken += 1
        if not self._first_decision:
            self._first_decision = f"{what} at {self._user_line() or 'torch'}"

    def _took_zeros(self, what: str) -> None:
        self.zero_reads += 1
        if not self._first_zero_read:
            self._first_zero_read = f"{what} at {self._user_line() or 'torch'}"

    # ---- reads

    def read(self, t: torch.Tensor, what: str) -> torch.Tensor:
        """``t``'s values for a read (``what``: the op or method): known ones, else zeros (noted), else refused."""
        shadow = self.of(t)
        if shadow is not None:
            return shadow
        if t.untyped_storage().nbytes() > READ_BYTES:
            raise DataDependentError(what, self._user_line())
        self._took_zeros(what)
        shadow = self._new_shadow(t) if t.untyped_storage().nbytes() <= SHADOW_BYTES else None
        return shadow if shadow is not None else torch.zeros(t.shape, dtype=t.dtype)

    def assertion_holds(self, func: Any) -> bool:
        return func in _ASSERTIONS

    def notes(self) -> list[str]:
        """What the notes say of the reads of unknown values."""
        notes = []
        if self.zero_reads:
            notes.append(f"values the prediction does not compute were read as zeros ({self.zero_reads} reads, the "
                         f"first {self._first_zero_read}): a logged loss shows 0, a mask of unknown values selects "
                         "nothing, greedy generation runs to its length limit")
        if self.decisions_taken:
            notes.append(f"decisions on numbers the model computes were taken as true ({self.decisions_taken} times, "
                         f"the first {self._first_decision}): a loop they end keeps going to the program's own "
                         "limit (beam search to max_new_tokens), the longest run")
        return notes


def _host_one(a: Any, shadows: dict[int, torch.Tensor]) -> Any:
    if isinstance(a, torch.Tensor):
        return shadows.get(id(a), a) if a.is_meta else a
    if isinstance(a, (list, tuple)):
        return type(a)(_host_one(x, shadows) for x in a)
    if isinstance(a, torch.device) and a.type == "meta":
        return torch.device("cpu")
    if isinstance(a, str) and a == "meta":
        return "cpu"
    return a


def _host(args: tuple, shadows: dict[int, torch.Tensor]) -> list:
    return [_host_one(a, shadows) for a in args]


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


_RANDOM_FILLS = frozenset({"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "log_normal_",
                           "geometric_", "cauchy_"})
_OVERWRITES = frozenset({"fill_", "zero_", "copy_"})

_kinds: dict[Any, tuple[tuple, str]] = {}


def _kind(func: Any) -> tuple[tuple, str]:
    """(the positions and names of the arguments the op writes, what kind of op: "random_fill" — an in-place
    random initialisation —, "overwrite" — writes every element without reading them —, "empty", or "")."""
    written = tuple((i, arg.name, arg.kwarg_only) for i, arg in enumerate(func._schema.arguments)
                    if arg.alias_info is not None and arg.alias_info.is_write)
    name = func.__name__.split(".")[0]
    if name in _RANDOM_FILLS:
        return written, "random_fill"
    if name in _OVERWRITES:
        return written, "overwrite"
    if name.startswith(("empty", "new_empty")):
        return written, "empty"
    return written, ""


def _written(positions: tuple, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor arguments the op writes (in place or ``out=``)."""
    out = []
    for i, name, kwarg_only in positions:
        value = kwargs.get(name) if kwarg_only or i >= len(args) else args[i]
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out
