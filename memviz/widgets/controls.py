"""Controls: allocate (bytes with units, or shape + dtype; count; name), free a pick, free all, gc.collect(),
empty_cache(), reset stats; and the backend switch (simulator / real GPU) with device, cap and allocator
config, which starts a fresh lab.

Every button calls one lab action. Bad input ("12 parsecs", a duplicate name, an unknown config key)
shows the lab's own message in the status line and changes nothing; nothing raises out of a callback.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from memviz.devices import PRESETS
from memviz.oom import CANDIDATE_CONFIGS
from memviz.shapes import DTYPE_SIZES
from memviz.units import format_bytes
from memviz.widgets._common import Piece, escape, guarded

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["CONFIG_PRESETS", "Controls", "parse_size_field"]

CONFIG_PRESETS = ("default", *CANDIDATE_CONFIGS)
"""Allocator configs offered by the picker ("default" is ``""``); any other string can be typed."""

SIM, REAL = "simulator", "real GPU"
_SHAPE_RE = re.compile(r"^[(\[]?\s*\d[\d_]*(\s*[,x×*]\s*\d[\d_]*)*\s*,?\s*[)\]]?$")


def parse_size_field(text: str) -> tuple[Any, bool]:
    """What the size box means: ``((2048, 4096), True)`` for a shape, ``("512 MiB", False)`` for bytes.

    A shape has brackets, a comma or an ``x`` between numbers (``"(100, 100)"``, ``"[8]"``, ``"100x100"``,
    ``"7,"``); anything else is a size for :func:`memviz.units.parse_size` (``"512 MiB"``, ``"40000"``).
    """
    t = text.strip()
    is_shape = t[:1] in "([" or any(c in t for c in ",x×*")
    if is_shape and _SHAPE_RE.match(t):
        dims = tuple(int(d.replace("_", "")) for d in re.findall(r"\d[\d_]*", t))
        return dims, True
    if is_shape and t[:1] in "([":
        raise ValueError(f"cannot read {text!r} as a shape; write e.g. (2048, 4096)")
    return t, False


def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, without importing torch (2-3 s) on a Linux machine with no NVIDIA device."""
    if "torch" not in sys.modules and sys.platform.startswith("linux") and not os.path.exists("/dev/nvidiactl"):
        return False
    from memviz.backends import cuda_available

    return cuda_available()


class Controls(Piece):
    """Buttons and fields that drive a lab.

    Args:
        lab: the lab to drive.
        on_event: called with each event after an action (the dashboard refreshes its pieces there).
        on_new_lab: called with the fresh lab the backend switch made (default: this piece shows it).
        out: the ``Output`` where unexpected errors print their traceback.

    Attributes: ``size``, ``dtype``, ``count``, ``name``, ``free_pick`` (fields) and ``buttons`` (by
    description: ``"Allocate"``, ``"Free"``, ``"Free all"``, ``"gc.collect()"``, ``"empty_cache()"``,
    ``"reset stats"``, ``"new lab"``); ``status`` shows the last event or error, ``error`` the last error.
    """

    def __init__(
        self,
        lab: Lab,
        *,
        on_event: Callable[[Event], None] | None = None,
        on_new_lab: Callable[[Lab], None] | None = None,
        out: W.Output | None = None,
    ) -> None:
        super().__init__(lab)
        self.on_event, self.on_new_lab = on_event, on_new_lab
        self.out = out if out is not None else W.Output()
        self.error = ""
        wrap = guarded(self.out, self._show_error)
        fw = W.Layout(width="auto")
        self.size = W.Text(
            value="512 MiB",
            description="size",
            placeholder="512 MiB or (1024, 1024)",
            layout=W.Layout(width="230px"),
            tooltip="bytes with a unit, or a shape with a dtype",
        )
        self.dtype = W.Dropdown(
            options=list(DTYPE_SIZES), value="float32", description="dtype", layout=W.Layout(width="170px")
        )
        self.count = W.BoundedIntText(
            value=1, min=1, max=1_000_000, description="count", layout=W.Layout(width="150px")
        )
        self.name = W.Text(
            value="", description="name", placeholder="auto: t0, t1, ...", layout=W.Layout(width="200px")
        )
        self.free_pick = W.Dropdown(options=[], description="tensor", layout=W.Layout(width="220px"))
        for widget, cls in (
            (self.size, "memviz-size"),
            (self.dtype, "memviz-dtype"),
            (self.count, "memviz-count"),
            (self.name, "memviz-name"),
            (self.free_pick, "memviz-free-pick"),
        ):
            widget.add_class(cls)
        actions = {
            "Allocate": (self._allocate, "allocate count tensors of this size (shape × dtype, or bytes)"),
            "Free": (self._free, "drop the lab's reference to the picked tensor or group"),
            "Free all": (lambda: self.lab.free_all(), "drop every tensor the lab holds"),
            "gc.collect()": (lambda: self.lab.gc(), "collect reference cycles (tensors kept only by cycles go)"),
            "empty_cache()": (lambda: self.lab.empty_cache(), "release every cached segment with no live block"),
            "reset stats": (lambda: self.lab.reset_stats(), "reset peak and accumulated stats"),
        }
        self.buttons: dict[str, W.Button] = {}
        for label, (action, tip) in actions.items():
            button = W.Button(description=label, tooltip=tip, layout=fw)
            button.add_class("memviz-button")
            button.on_click(wrap(self._action_handler(action)))
            self.buttons[label] = button
        self.buttons["Allocate"].button_style = "primary"
        self.status = W.HTML(value="")
        self.status.add_class("memviz-status")
        self._backend_box = self._backend_controls(wrap)
        self.widget = W.VBox(
            [
                W.HBox([self.size, self.dtype, self.count, self.name, self.buttons["Allocate"]]),
                W.HBox(
                    [
                        self.free_pick,
                        self.buttons["Free"],
                        self.buttons["Free all"],
                        self.buttons["gc.collect()"],
                        self.buttons["empty_cache()"],
                        self.buttons["reset stats"],
                    ]
                ),
                self.status,
                self._backend_box,
            ]
        )
        self.widget.add_class("memviz-controls")
        self.refresh()

    # -- the backend switch ---------------------------------------------------------------------------

    def _backend_controls(self, wrap: Callable) -> W.Widget:
        self.cuda = _cuda_available()
        backend = self.lab.backend
        self.kind = W.ToggleButtons(
            options=[SIM, REAL] if self.cuda else [SIM],
            value=REAL if backend.kind == "cuda" else SIM,
            style={"button_width": "90px"},
            tooltips=["memviz.sim: an exact replica of the allocator", "torch.cuda"],
        )
        self.kind.add_class("memviz-backend")
        parts: list[W.Widget] = [self.kind]
        if not self.cuda:
            no_gpu = W.Button(
                description=REAL,
                disabled=True,
                layout=W.Layout(width="90px"),
                tooltip="No CUDA GPU here (torch.cuda.is_available() is False): the simulator runs",
            )
            no_gpu.add_class("memviz-real-disabled")
            parts.append(no_gpu)
        self.device = W.Dropdown(options=list(PRESETS), description="device", layout=W.Layout(width="190px"))
        preset = next((k for k, p in PRESETS.items() if p.name == backend.device_name), None)
        if preset is None and backend.kind != "cuda":  # a custom simulated size
            self.device.options = [*PRESETS, format_bytes(backend.total_memory_bytes)]
            preset = self.device.options[-1]
        self.device.value = preset or "T4"
        self.cap = W.Text(
            value="" if backend.cap_bytes is None else format_bytes(backend.cap_bytes),
            description="cap",
            placeholder="none, or e.g. 2 GiB",
            layout=W.Layout(width="180px"),
        )
        self.config = W.Combobox(
            value=backend.alloc_conf or "default",
            options=list(CONFIG_PRESETS),
            description="config",
            ensure_option=False,
            layout=W.Layout(width="400px"),
            placeholder="PYTORCH_CUDA_ALLOC_CONF",
        )
        for widget, cls in ((self.device, "memviz-device"), (self.cap, "memviz-cap"), (self.config, "memviz-config")):
            widget.add_class(cls)
        new = W.Button(description="new lab", tooltip="start a fresh lab with these settings", button_style="warning")
        new.add_class("memviz-button")
        new.on_click(wrap(lambda _: self._new_lab()))
        self.buttons["new lab"] = new
        self.kind.observe(wrap(lambda _: self._sync_backend_fields()), names="value")
        note = W.HTML(
            "<small>“new lab” starts a fresh lab with these settings: the current lab's tensors are "
            "freed and its timeline starts over.</small>"
        )
        self._sync_backend_fields()
        return W.VBox([W.HBox([*parts, self.device, self.cap, self.config, new]), note])

    def _sync_backend_fields(self) -> None:
        simulated = self.kind.value == SIM
        self.device.layout.display = None if simulated else "none"
        self.config.disabled = not simulated  # on a GPU the config is fixed when CUDA starts

    def lab_settings(self) -> dict[str, Any]:
        """The ``Lab(...)`` arguments the backend fields describe now."""
        cap = self.cap.value.strip()
        conf = self.config.value.strip()
        if self.kind.value == REAL:
            return {"backend": "cuda", "cap": cap or None}
        return {
            "backend": "sim",
            "device": self.device.value,
            "cap": cap or None,
            "alloc_conf": "" if conf in ("", "default") else conf,
        }

    def _new_lab(self) -> None:
        from memviz.lab import Lab

        lab = Lab(**self.lab_settings())  # a bad config raises here, and nothing changes
        old = self.lab
        old.free_all()
        if old.backend.kind == "cuda":
            old.empty_cache()
        self._set_status(f"new lab: {lab.describe()}")
        if self.on_new_lab is not None:
            self.on_new_lab(lab)
        else:
            self.set_lab(lab)

    # -- actions --------------------------------------------------------------------------------------

    def _allocate(self) -> Event:
        size, is_shape = parse_size_field(self.size.value)
        name = self.name.value.strip() or None
        if is_shape:
            return self.lab.allocate(size, self.dtype.value, count=self.count.value, name=name)
        return self.lab.allocate(size, count=self.count.value, name=name)

    def _free(self) -> Event:
        if not self.free_pick.value:
            raise ValueError("nothing to free: the lab holds no tensors")
        return self.lab.free(self.free_pick.value)

    def _action_handler(self, action: Callable[[], Event]) -> Callable[[Any], None]:
        def handler(_button: Any) -> None:
            event = action()
            self.error = ""
            if self.on_event is not None:  # first the gauges and figures (the dashboard): what the click is for
                self.on_event(event)
            self._set_status(str(event), oom=not event.ok)
            self.refresh(event.stats_after)  # the free picker

        return handler

    def _set_status(self, text: str, *, oom: bool = False) -> None:
        color = "#d62728" if oom else "inherit"
        self.status.value = f'<span class="memviz-status-text" style="color:{color}">{escape(text)}</span>'

    def _show_error(self, message: str) -> None:
        self.error = message
        self.status.value = f'<span class="memviz-error" style="color:#d62728">⚠ {escape(message)}</span>'

    # -- refresh --------------------------------------------------------------------------------------

    def pickable(self) -> list[str]:
        """What the free picker offers: groups, then tensors that are in no group."""
        lab = self.lab
        return list(lab.groups) + [n for n, t in lab.tensors.items() if t.group is None]

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        options = self.pickable()
        if list(self.free_pick.options) != options:
            keep = self.free_pick.value
            self.free_pick.options = options
            self.free_pick.value = keep if keep in options else (options[-1] if options else None)

    def set_lab(self, lab: Lab) -> None:
        self.lab = lab
        self.kind.value = REAL if lab.backend.kind == "cuda" else SIM
        self.refresh()
