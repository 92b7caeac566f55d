"""The fit panel's controls: the program's own keyword arguments as widgets, and the target it is predicted on.

:class:`ProgramControls` builds one widget per parameter of ``fn`` the way ``ipywidgets.interact`` does, from
the parameter's default or from an abbreviation passed to ``fit_panel(fn, name=...)``:

- ``True`` / ``False`` → a checkbox; an ``int`` → a whole-number box (from 1 when the default is positive:
  batch sizes, steps, lengths); a ``float`` → a number box; a ``str`` → a text box;
- ``(min, max)`` or ``(min, max, step)`` → a slider, a list → a dropdown (``interact``'s own rules,
  through :meth:`ipywidgets.interactive.widget_from_abbrev`); a widget → that widget;
- ``ipywidgets.fixed(value)``, and a default that is none of the above (``None``, an object) → passed as
  is, shown as text.

:class:`TargetControls` holds the target GPU (the presets of :mod:`memviz.devices` or a custom size), the cap
(empty: none) and the allocator config (``PYTORCH_CUDA_ALLOC_CONF``: the kit's presets, or typed).
:class:`RankControls` holds the job: how many GPUs (ranks) a ``torchrun`` program runs on, one per process, and
which rank the panel's views show.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as W
from ipywidgets import fixed, interactive

from memviz.devices import PRESETS, simulated_device
from memviz.sim import CANDIDATE_CONFIGS
from memviz.units import parse_size
from memviz.widgets._common import escape

__all__ = ["CUSTOM", "MAX_WORLD_SIZE", "ProgramControls", "RankControls", "TargetControls", "control_for"]

CUSTOM = "custom size"
INT_MAX = 2**31 - 1
MAX_WORLD_SIZE = 64
"""The most ranks the panel takes: each refresh predicts every rank (one :func:`memviz.predict` each), so a
refresh costs the world size times one prediction. Larger jobs: ``memviz.predict(..., world_size=N, rank=R)``."""
_STYLE = {"description_width": "initial"}


def control_for(name: str, abbrev: Any, default: Any = inspect.Parameter.empty) -> W.Widget | fixed:
    """The widget for parameter ``name`` from ``abbrev`` (see the module docstring); ``fixed`` for a value
    that gets no widget. ``default`` is the signature's default, the starting value of a slider or dropdown."""
    if isinstance(abbrev, fixed):
        return abbrev
    if isinstance(abbrev, W.ValueWidget):
        return abbrev
    if isinstance(abbrev, bool):
        return W.Checkbox(value=abbrev, description=name, indent=False, layout=W.Layout(width="auto"))
    if isinstance(abbrev, int):
        box = W.BoundedIntText if abbrev >= 1 else W.IntText
        bounds = {"min": 1, "max": max(INT_MAX, abbrev)} if abbrev >= 1 else {}
        return box(value=abbrev, description=name, style=_STYLE, layout=W.Layout(width="150px"), **bounds)
    if isinstance(abbrev, float):
        return W.FloatText(value=abbrev, description=name, style=_STYLE, layout=W.Layout(width="160px"))
    if isinstance(abbrev, str):
        return W.Text(value=abbrev, description=name, style=_STYLE, continuous_update=False)
    if isinstance(abbrev, (tuple, list, dict)):
        start = abbrev if default is inspect.Parameter.empty else default
        widget = interactive.widget_from_abbrev(abbrev, start)
        if widget is None:
            raise ValueError(f"fit_panel: cannot make a control for {name}={abbrev!r}; give a (min, max) tuple, "
                             "a list of choices, a widget, or ipywidgets.fixed(value)")  # fmt: skip
        widget.description = name
        widget.style = _STYLE
        if hasattr(widget, "continuous_update"):
            widget.continuous_update = False
        return widget
    return fixed(abbrev)


class ProgramControls:
    """One widget per keyword argument of ``fn``, the way ``ipywidgets.interact`` builds them.

    Args:
        fn: the program; every parameter it has needs a default or an entry in ``defaults``
            (``*args`` / ``**kwargs`` get no control).
        defaults: ``name → abbreviation`` (see the module docstring), overriding the signature's defaults.

    ``widgets`` maps name → widget (the fixed ones are in ``fixed``); ``values()`` is what ``fn`` gets;
    ``widget`` is the row of them.

    Raises:
        TypeError: a name in ``defaults`` that ``fn`` does not take, or a parameter with neither a default
            nor a value.
    """

    def __init__(self, fn: Callable, defaults: Mapping[str, Any]) -> None:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError) as error:
            raise TypeError(f"fit_panel: cannot read the parameters of {fn!r}: {error}") from None
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        unknown = sorted(set(defaults) - set(params))
        if unknown and not takes_any:
            raise TypeError(f"fit_panel: {_name(fn)}() takes no argument {', '.join(map(repr, unknown))}; "
                            f"its parameters: {', '.join(params) or '(none)'}")  # fmt: skip
        self.widgets: dict[str, W.ValueWidget] = {}
        self.fixed: dict[str, Any] = {}
        names = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)] + unknown
        for name in names:
            param = params.get(name)
            default = param.default if param is not None else inspect.Parameter.empty
            if name in defaults:
                abbrev = defaults[name]
            elif default is not inspect.Parameter.empty:
                abbrev = default
            else:
                raise TypeError(f"fit_panel: {_name(fn)}() needs a value for {name!r}: pass "
                                f"fit_panel({_name(fn)}, {name}=...)")  # fmt: skip
            control = control_for(name, abbrev, default)
            if isinstance(control, fixed):
                self.fixed[name] = control.value
            else:
                control.add_class(f"memviz-fit-arg-{name}")
                self.widgets[name] = control
        shown = [*self.widgets.values()]
        if self.fixed:
            text = ", ".join(f"{k}={v!r}" for k, v in self.fixed.items())
            shown.append(W.HTML(f"<small>fixed: <code>{escape(text)}</code></small>"))
        self.widget = W.HBox(shown, layout=W.Layout(flex_flow="row wrap", align_items="center"))
        self.widget.add_class("memviz-fit-args")

    def values(self) -> dict[str, Any]:
        """The keyword arguments ``fn`` gets now."""
        return {**{k: w.value for k, w in self.widgets.items()}, **self.fixed}

    def observe(self, handler: Callable) -> None:
        """Call ``handler(change)`` when any control's value changes."""
        for widget in self.widgets.values():
            widget.observe(handler, names="value")


class TargetControls:
    """The target GPU (a preset or a custom size), the cap and the allocator config.

    Args:
        device: a preset name of :data:`memviz.devices.PRESETS` or a size (``"12 GiB"``: the custom box).
        cap: ``None``, bytes or a size string.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` (``""``: the default config).

    ``settings()`` returns ``{"device", "cap", "alloc_conf"}`` for :func:`memviz.predict`, or raises
    ``ValueError`` naming the field that is wrong.
    """

    def __init__(self, device: str = "T4", cap: int | str | None = None, alloc_conf: str = "") -> None:
        preset = next((k for k in PRESETS if k.lower() == str(device).strip().lower()), None)
        self.device = W.Dropdown(options=[*PRESETS, CUSTOM], value=preset or CUSTOM, description="target GPU",
                                 style=_STYLE, layout=W.Layout(width="210px"))  # fmt: skip
        self.custom = W.Text(value="" if preset else str(device), placeholder="e.g. 12 GiB", continuous_update=False,
                             layout=W.Layout(width="110px"))  # fmt: skip
        self.cap = W.Text(value="" if cap is None else str(cap), description="cap", placeholder="none, or e.g. 4 GiB",
                          continuous_update=False, layout=W.Layout(width="170px"), style=_STYLE)  # fmt: skip
        self.config = W.Combobox(value=alloc_conf or "default", options=["default", *CANDIDATE_CONFIGS],
                                 description="config", ensure_option=False, placeholder="PYTORCH_CUDA_ALLOC_CONF",
                                 continuous_update=False,
                                 layout=W.Layout(width="420px"), style=_STYLE)  # fmt: skip
        for widget, cls in ((self.device, "memviz-fit-device"), (self.custom, "memviz-fit-custom"),
                            (self.cap, "memviz-fit-cap"), (self.config, "memviz-fit-config")):  # fmt: skip
            widget.add_class(cls)
        self.device.observe(lambda _: self._sync(), names="value")
        self._sync()
        self.widget = W.HBox([self.device, self.custom, self.cap, self.config],
                             layout=W.Layout(flex_flow="row wrap", align_items="center"))  # fmt: skip

    def _sync(self) -> None:
        self.custom.layout.display = None if self.device.value == CUSTOM else "none"

    def settings(self) -> dict[str, Any]:
        """``{"device": preset name or bytes, "cap": bytes or None, "alloc_conf": str}``, checked.

        Raises:
            ValueError: a custom size or cap that is not a size (the message names the field), or a cap
                larger than the device.
        """
        if self.device.value == CUSTOM:
            if not self.custom.value.strip():
                raise ValueError("custom GPU size: type the GPU's memory, e.g. 12 GiB")
            try:
                device: str | int = parse_size(self.custom.value.strip())
            except ValueError as error:
                raise ValueError(f"custom GPU size: {error}") from None
        else:
            device = self.device.value
        cap_text = self.cap.value.strip()
        cap = None
        if cap_text and cap_text.lower() != "none":
            try:
                cap = parse_size(cap_text)
            except ValueError as error:
                raise ValueError(f"cap: {error}") from None
            total = simulated_device(device).total_memory_bytes
            if cap > total:
                raise ValueError(f"cap {cap_text} is more than the target GPU's {simulated_device(device)}; "
                                 "leave it empty for no cap")  # fmt: skip
        conf = self.config.value.strip()
        return {"device": device, "cap": cap, "alloc_conf": "" if conf in ("", "default") else conf}

    def observe(self, handler: Callable) -> None:
        """Call ``handler(change)`` when the device, custom size, cap or config changes."""
        for widget in (self.device, self.custom, self.cap, self.config):
            widget.observe(handler, names="value")


class RankControls:
    """The job: how many GPUs the program runs on (``torchrun``'s ranks, one GPU each) and which rank is shown.

    Args:
        world_size: the number of ranks, 1 to :data:`MAX_WORLD_SIZE` (1: a single-GPU program, predicted as
            :func:`memviz.predict` without ``world_size``).
        rank: the rank whose timeline and segment map the panel shows, in ``[0, world_size)``.

    ``settings()`` returns ``{}`` for one GPU, else ``{"world_size": N}``; ``shown_rank()`` the rank picked.
    The rank picker and the note show only when the job has more than one rank.

    Raises:
        ValueError: ``world_size`` or ``rank`` out of range.
    """

    def __init__(self, world_size: int = 1, rank: int = 0) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD_SIZE:
            raise ValueError(f"fit_panel: world_size must be an int from 1 to {MAX_WORLD_SIZE} (the panel predicts "
                             f"every rank), got {world_size!r}; for more, memviz.predict(..., world_size=N, rank=R)")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"fit_panel: rank must be an int in [0, {world_size}), got {rank!r}")
        self.world_size = W.BoundedIntText(value=world_size, min=1, max=MAX_WORLD_SIZE, description="GPUs (ranks)",
                                           style=_STYLE, layout=W.Layout(width="170px"))  # fmt: skip
        self.rank = W.Dropdown(options=list(range(world_size)), value=rank, description="show rank", style=_STYLE,
                               layout=W.Layout(width="150px"))  # fmt: skip
        self.note = W.HTML("<small>a <code>torchrun</code> program, one GPU per rank: every rank is predicted "
                           "(torch's fake process group)</small>")  # fmt: skip
        for widget, cls in ((self.world_size, "memviz-fit-world-size"), (self.rank, "memviz-fit-rank"),
                            (self.note, "memviz-fit-rank-note")):  # fmt: skip
            widget.add_class(cls)
        self.world_size.observe(lambda _: self._sync(), names="value")
        self._sync()
        self.widget = W.HBox([self.world_size, self.rank, self.note],
                             layout=W.Layout(flex_flow="row wrap", align_items="center"))  # fmt: skip

    def _sync(self) -> None:
        n = self.world_size.value
        if list(self.rank.options) != list(range(n)):
            keep = self.rank.value if self.rank.value is not None and self.rank.value < n else 0
            self.rank.options = list(range(n))
            self.rank.value = keep
        shown = None if n > 1 else "none"
        self.rank.layout.display = self.note.layout.display = shown

    def settings(self) -> dict[str, Any]:
        """``{}`` for one GPU, ``{"world_size": N}`` for a job of N ranks."""
        n = self.world_size.value
        return {} if n == 1 else {"world_size": n}

    def shown_rank(self) -> int:
        """The rank the views show (0 for one GPU)."""
        return self.rank.value if self.world_size.value > 1 and self.rank.value is not None else 0

    def observe(self, handler: Callable) -> None:
        """Call ``handler(change)`` when the world size changes (the rank picker redraws; it predicts nothing)."""
        self.world_size.observe(handler, names="value")


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


