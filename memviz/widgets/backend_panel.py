"""The backend switch: simulator or real GPU, with device, cap and allocator config; "new lab" starts a fresh
lab with them (the current lab's tensors are freed first). On a machine with several GPUs, the GPU picker says
which CUDA device the real-GPU lab watches; it is hidden with one GPU, and for the simulator (whose lab keeps
the device index it has, see :func:`memviz.backends.select_backend`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from memviz.backends import GpuInfo, cuda_devices
from memviz.devices import PRESETS, simulated_device
from memviz.oom import CANDIDATE_CONFIGS
from memviz.units import format_bytes

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = ["CONFIG_PRESETS", "REAL", "SIM", "BackendPanel"]

CONFIG_PRESETS = ("default", *CANDIDATE_CONFIGS)
"""Allocator configs offered by the picker ("default" is ``""``); any other string can be typed."""

SIM, REAL = "simulator", "real GPU"


class BackendPanel:
    """The fields that describe a lab (``kind``, ``gpu``, ``device``, ``cap``, ``config``) and the "new lab" button.

    Args:
        lab: the lab shown now (the fields start from its settings).
        wrap: the guard every callback goes through (:func:`memviz.widgets._common.guarded`).
        new_lab: called by "new lab" (the controls make the lab and hand it on).
        gpus: the machine's CUDA devices (default None: :func:`memviz.backends.cuda_devices`, asked once).

    ``cuda`` says whether there is a GPU: without one the "real GPU" choice is a disabled button whose tooltip
    says why. ``gpu`` picks the CUDA device by index (options ``"cuda:1 · NVIDIA H200 · 139.81 GiB"``); it shows
    only for the real GPU on a machine with several. Picking changes nothing until "new lab".
    """

    def __init__(self, lab: Lab, wrap: Callable, new_lab: Callable[[], None], *,
                 gpus: Sequence[GpuInfo] | None = None) -> None:  # fmt: skip
        self.gpus = list(cuda_devices() if gpus is None else gpus)
        self.cuda = bool(self.gpus)
        backend = lab.backend
        self._sim_index = backend.index if backend.kind != "cuda" else 0  # kept by "new lab" on the simulator
        self.kind = W.ToggleButtons(
            options=[SIM, REAL] if self.cuda else [SIM],
            value=REAL if backend.kind == "cuda" else SIM,
            style={"button_width": "auto"},
            tooltips=["memviz.sim: an exact replica of the allocator", "torch.cuda"],
        )
        self.kind.add_class("memviz-backend")
        parts: list[W.Widget] = [self.kind]
        if not self.cuda:
            no_gpu = W.Button(
                description=REAL,
                disabled=True,
                layout=W.Layout(width="auto", min_width="max-content"),
                tooltip="No CUDA GPU here (torch.cuda.is_available() is False): the simulator runs",
            )
            no_gpu.add_class("memviz-real-disabled")
            parts.append(no_gpu)
        self.gpu = W.Dropdown(
            options=[(f"cuda:{g.index} · {g.name} · {format_bytes(g.total_memory_bytes)}", g.index) for g in self.gpus],
            description="GPU", layout=W.Layout(width="auto"),
            tooltip="which CUDA device the lab watches (torch.cuda.device_count() GPUs here)",
        )  # fmt: skip
        indices = [g.index for g in self.gpus]
        if indices:
            self.gpu.value = backend.index if backend.kind == "cuda" and backend.index in indices else indices[0]
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
            layout=W.Layout(width="320px"),
            placeholder="PYTORCH_CUDA_ALLOC_CONF",
        )
        for widget, cls in ((self.gpu, "memviz-gpu"), (self.device, "memviz-device"), (self.cap, "memviz-cap"),
                            (self.config, "memviz-config")):  # fmt: skip
            widget.add_class(cls)
        self.new_button = W.Button(description="new lab", tooltip="start a fresh lab with these settings",
                                   button_style="warning", layout=W.Layout(min_width="max-content"))  # fmt: skip
        self.new_button.add_class("memviz-button")
        self.new_button.on_click(wrap(lambda _: new_lab()))
        self.kind.observe(wrap(lambda _: self._sync()), names="value")
        note = W.HTML(
            "<small>“new lab” starts a fresh lab with these settings: the current lab's tensors are "
            "freed and its timeline starts over.</small>"
        )
        self._sync()
        self.row = W.HBox([*parts, self.gpu, self.device, self.cap, self.config, self.new_button],
                          layout=W.Layout(flex_flow="row wrap", align_items="center"))  # fmt: skip
        self.widget = W.VBox([self.row, note])

    def _sync(self) -> None:
        simulated = self.kind.value == SIM
        self.gpu.layout.display = None if not simulated and len(self.gpus) > 1 else "none"
        self.device.layout.display = None if simulated else "none"
        self.config.disabled = not simulated  # on a GPU the config is fixed when CUDA starts

    def show(self, lab: Lab) -> None:
        """Point the switch at ``lab``'s kind and device (after a new lab)."""
        backend = lab.backend
        self.kind.value = REAL if backend.kind == "cuda" else SIM
        if backend.kind == "cuda":
            self.gpu.value = backend.index
        else:
            self._sim_index = backend.index

    def lab_settings(self) -> dict[str, Any]:
        """The ``Lab(...)`` arguments the fields describe now."""
        cap = self.cap.value.strip()
        conf = self.config.value.strip()
        if self.kind.value == REAL:
            return {"backend": "cuda", "device": self.gpu.value, "cap": cap or None}
        device: Any = self.device.value
        if self._sim_index:  # the same GPU of the simulated node as the lab shown
            device = dataclasses.replace(simulated_device(device), index=self._sim_index)
        return {
            "backend": "sim",
            "device": device,
            "cap": cap or None,
            "alloc_conf": "" if conf in ("", "default") else conf,
        }
