"""Will it fit? A panel that predicts a program's GPU memory as you change its arguments and the target GPU.

``memviz.fit_panel(train, batch=(1, 256))`` shows ``train``'s keyword arguments as controls (the way
``ipywidgets.interact`` builds them), the target GPU (T4 … H200 or a custom size), a cap and an allocator
config. Every change runs :func:`memviz.predict` once and redraws, in one update path:

- **gauges**: peak allocated and peak reserved against what the allocator could get;
- **banner**: fits, or the request that ran out of memory (size, op, module, line, phase) with torch's
  message, and a button that finds which config or which batch would fit;
- **what is live over the step**: a stacked area per category (parameters, gradients, optimizer state,
  activations, temporaries, workspaces) with the forward / backward / optimizer phases behind it;
- **segment map at the peak**: the cache's segments and blocks when allocated bytes peaked;
- on demand (each costs several predictions): the program **under the other configs** side by side (also
  after every change, once its checkbox is ticked: the table follows the main result), and the **largest
  batch on each GPU** (:func:`memviz.max_batch`);
- on a machine with a GPU, **run for real**: the same program on this GPU under the cap, measured beside
  the prediction.

A progress bar moves while a prediction runs; the previous result stays on screen until the new one is
ready. Errors never escape a handler: bad input (a cap that is no size) and an exception of the program
show as one red line and change nothing; anything else prints its traceback under the panel.
``refresh_seconds`` holds how long each refresh took (prediction and redraw).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W

from memviz.backends import cuda_available
from memviz.devices import simulated_device
from memviz.sim import CANDIDATE_CONFIGS
from memviz.units import format_bytes
from memviz.widgets._common import close_tree, escape, exact_bytes, guarded
from memviz.widgets.fit_area import StepArea
from memviz.widgets.fit_controls import ProgramControls, TargetControls
from memviz.widgets.fit_report import (
    BatchRow,
    ConfigRow,
    banner_html,
    batch_table_html,
    config_table_html,
    gauge_rows,
    gauge_title,
    notes_html,
    phase_spans,
)
from memviz.widgets.gauges import GaugeWidget
from memviz.widgets.segment_map import StateMap

__all__ = ["BATCH_NAMES", "FitPanel", "fit_panel"]

BATCH_NAMES = ("batch", "batch_size", "bs")
"""Parameter names taken as the batch size when ``batch_arg`` is not given."""
TABLE_DEVICES = ("T4", "L4", "A100-40GB", "A100-80GB", "H100", "H200")
"""The GPUs of the "largest batch" table."""


class FitPanel:
    """The panel (see the module docstring). ``widget`` is the whole of it; it also displays itself.

    Args:
        fn: the program: ``fn(**kwargs)`` runs one training or inference job on ``"cuda"``.
        device / cap / alloc_conf: the target the panel starts with (as :func:`memviz.predict` takes them).
        batch_arg: the parameter that is the batch size (default: the first of :data:`BATCH_NAMES` that
            ``fn`` takes; None hides the "largest batch" table).
        configs: the configs compared side by side (default: the default config and the kit's candidates).
        defaults: control abbreviations per parameter of ``fn`` (see :mod:`memviz.widgets.fit_controls`).

    Attributes:
        prediction: the :class:`memviz.predictor.Prediction` shown now (None before the first one fits in).
        refresh_seconds: seconds each refresh took, prediction and redraw, in order.
        status_text / error_text: the status line, and the last error ("" when the last refresh worked).
    """

    def __init__(self, fn: Callable[..., Any], *, device: str | int = "T4", cap: int | str | None = None,
                 alloc_conf: str = "", batch_arg: str | None = "", configs: Sequence[str] | None = None,
                 **defaults: Any) -> None:  # fmt: skip
        self.fn = fn
        self.args = ProgramControls(fn, defaults)
        self.target = TargetControls(device, cap, alloc_conf)
        names = self.args.widgets
        self.batch_arg = next((n for n in BATCH_NAMES if n in names), None) if batch_arg == "" else batch_arg
        if self.batch_arg is not None and self.batch_arg not in names:
            raise TypeError(f"fit_panel: batch_arg={self.batch_arg!r} is not a parameter with a control; "
                            f"the controls: {', '.join(names) or '(none)'}")  # fmt: skip
        self.configs = tuple(configs) if configs is not None else ("", *CANDIDATE_CONFIGS)
        self.prediction: Any = None
        self.refresh_seconds: list[float] = []
        self.status_text = self.error_text = ""
        self.out = W.Output()
        wrap = guarded(self.out, self._show_error)

        self.progress = W.FloatProgress(value=0, min=0, max=1, layout=W.Layout(width="220px", visibility="hidden"))
        self.progress.add_class("memviz-fit-progress")
        self.status = W.HTML()
        self.status.add_class("memviz-fit-status")
        self.banner = W.HTML()
        self.banner.add_class("memviz-fit-banner-box")
        self.fix_button = _button("what would fit?", "try the other configs and smaller batches (several predictions)")
        self.fix_button.layout.display = "none"
        self.fix_button.on_click(wrap(lambda _: self.find_fixes()))
        self.fix_html = W.HTML()
        self.gauges = GaugeWidget()
        self.gauges.add_class("memviz-fit-gauges")
        self.area = StepArea()
        self.map = StateMap(max_height=360)
        self.map_note = W.HTML()
        self.configs_button = _button("compare configs", f"predict under {len(self.configs)} allocator configs")
        self.configs_button.on_click(wrap(lambda _: self.compare_configs()))
        self.configs_auto = W.Checkbox(value=False, description="after every change", indent=False,
                                       layout=W.Layout(width="auto"))  # fmt: skip
        self.configs_auto.add_class("memviz-fit-configs-auto")
        self.configs_auto.observe(wrap(lambda change: change["new"] and self.compare_configs()), names="value")
        self.configs_html = W.HTML()
        self.batches_button = _button("largest batch on each GPU", "memviz.max_batch on T4 … H200 (many predictions)")
        self.batches_button.on_click(wrap(lambda _: self.largest_batches()))
        self.batches_button.layout.display = None if self.batch_arg else "none"
        self.batches_html = W.HTML()
        self.real_button = _button("run for real on this GPU", "run the program on this GPU under the cap, measured")
        self.real_button.on_click(wrap(lambda _: self.run_real()))
        self.real_button.layout.display = None if cuda_available() else "none"
        self.real_html = W.HTML()

        self.args.observe(wrap(lambda _: self.refresh()))
        self.target.observe(wrap(lambda _: self.refresh()))
        title = W.HTML(f"<b>Will it fit?</b> <code>{escape(getattr(fn, '__name__', 'program'))}</code>, predicted "
                       "with no GPU (memviz.predict)")  # fmt: skip
        actions = W.HBox([self.configs_button, self.configs_auto, self.batches_button, self.real_button],
                         layout=W.Layout(flex_flow="row wrap"))  # fmt: skip
        self.widget = W.VBox(
            [title, self.args.widget, self.target.widget, W.HBox([self.progress, self.status]), self.banner,
             W.HBox([self.fix_button]), self.fix_html, self.gauges, self.area.widget, self.map_note, self.map.widget,
             actions, self.configs_html, self.batches_html, self.real_html, self.out],
            layout=W.Layout(width="100%"),
        )  # fmt: skip
        self.widget.add_class("memviz-fit-panel")
        self.refresh()

    # ---- the one update path

    def settings(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(target, kwargs)``: what the controls say now (``ValueError`` for a bad field)."""
        return self.target.settings(), self.args.values()

    def refresh(self) -> Any:
        """Predict with the controls' values and redraw; returns the prediction (None when it failed, and
        then nothing on screen changed but the status line)."""
        start = time.perf_counter()
        try:
            target, kwargs = self.settings()
        except ValueError as error:
            self._show_error(str(error))
            return None
        p = self._predict(target, kwargs, "predicting")
        if p is None:
            return None
        self.prediction = p
        self._draw(p)
        seconds = time.perf_counter() - start
        self.refresh_seconds.append(seconds)
        self._set_status(f"predicted in {seconds:.2f} s: {len(p.events):,} allocator events, "
                         f"{format_bytes(p.peak_reserved_bytes)} peak reserved")  # fmt: skip
        if self.configs_auto.value:  # after the result is on screen: the table follows
            self.compare_configs()
        return p

    def _predict(self, target: dict[str, Any], kwargs: dict[str, Any], what: str, **over: Any) -> Any:
        """One :func:`memviz.predict` with the progress bar moving; None (and the error shown) if it raised."""
        from memviz.predictor import predict

        expected = len(self.prediction.events) if self.prediction is not None else 0
        bar = self.progress
        bar.max, bar.value = max(expected, 1), 0
        bar.layout.visibility = "visible"
        self._set_status(f"{what}…")

        def on_progress(done: int, total: int | None, phase: str) -> None:
            if done >= bar.max:
                bar.max = 2 * done
            bar.value = done
            self.status.value = f"<small>{escape(what)}… {done:,} allocator events ({escape(phase)})</small>"

        try:
            return predict(self.fn, on_progress=on_progress, **{**target, **over}, **kwargs)
        except Exception as error:  # the program's own exception: shown, the previous result stays
            notes = " ".join(getattr(error, "__notes__", ()))
            self._show_error(f"the program raised {type(error).__name__}: {error} {notes}".strip())
            return None
        finally:
            bar.layout.visibility = "hidden"

    def _draw(self, p: Any) -> None:
        self.error_text = ""
        self.banner.value = banner_html(p) + notes_html(p.notes)
        self.fix_button.layout.display = "none" if p.fits else None
        self.fix_html.value = self.configs_html.value = self.batches_html.value = self.real_html.value = ""
        with self.gauges.hold_sync():
            self.gauges.title = gauge_title(p)
            self.gauges.rows = gauge_rows(p)
            self.gauges.note = (f"Peaks of the whole run. The CUDA context ({format_bytes(p.context_bytes)}) lives "
                                "outside the allocator: a GPU's limit is its memory less the context.")  # fmt: skip
        layers: dict[str, list[int]] = {}
        for row in p.breakdown_over_time():
            for cat, nbytes in row.items():
                layers.setdefault(cat, []).append(nbytes)
        reserved = [e.reserved_bytes for e in p.events]
        oom = None if p.fits else (p.oom.event_index, f"{format_bytes(p.oom.requested_bytes)} for {p.oom.op}")
        self.area.show(layers, reserved, phase_spans(p), oom=oom,
                       title=f"what is live over the run: {len(p.events):,} allocator events")  # fmt: skip
        at = p.peak_event_index
        segments, where = self._segments_at(p, at)
        self.map.show(segments)
        self.map_note.value = f"<small>segment map {escape(where)}</small>"

    @staticmethod
    def _segments_at(p: Any, index: int) -> tuple[list[dict], str]:
        if not p.events:
            return [], "(no allocations)"
        return p.snapshot(at=index)["segments"], f"at the peak of allocated bytes (after event {index:,})"

    # ---- what costs several predictions: on demand

    def compare_configs(self) -> list[ConfigRow]:
        """The program under each of ``configs`` (same device, cap and arguments), as a table."""
        target, kwargs = self.settings()
        rows = []
        for i, conf in enumerate(self.configs):
            p = self._predict(target, kwargs, f"config {i + 1} of {len(self.configs)}", alloc_conf=conf)
            if p is None:
                return rows
            rows.append(ConfigRow(conf, p))
        self.configs_html.value = "<b>the same program under other configs</b>" + config_table_html(
            rows, target["alloc_conf"])
        self._set_status(f"compared {len(rows)} configs")
        return rows

    def largest_batches(self, devices: Sequence[str] = TABLE_DEVICES) -> list[BatchRow]:
        """The largest ``batch_arg`` that fits on each of ``devices`` (cap and config as set), as a table."""
        from memviz.predictor import max_batch

        if self.batch_arg is None:
            raise ValueError("this panel has no batch argument (pass fit_panel(fn, batch_arg='...'))")
        target, kwargs = self.settings()
        rows = []
        bar = self.progress
        bar.layout.visibility = "visible"
        try:
            for i, device in enumerate(devices):
                bar.max, bar.value = len(devices), i
                self._set_status(f"largest batch on {device} ({i + 1} of {len(devices)})…")
                dev = simulated_device(device)
                cap = target["cap"] if target["cap"] is None or target["cap"] <= dev.total_memory_bytes else None
                b = max_batch(lambda batch: self.fn(**{**kwargs, self.batch_arg: batch}), device=device, cap=cap,
                              alloc_conf=target["alloc_conf"],
                              on_progress=lambda n, _t, what, d=device: self._set_status(f"{d}: try {n}, {what}"))
                rows.append(BatchRow(dev.name.replace(" (simulated)", ""), dev.total_memory_bytes, b))
        finally:
            bar.layout.visibility = "hidden"
        cap_words = f", cap {format_bytes(target['cap'])}" if target["cap"] else ""
        self.batches_html.value = (f"<b>largest {escape(self.batch_arg)} on each GPU</b> "
                                   f"<small>(config {escape(target['alloc_conf'] or 'default')}{cap_words})</small>"
                                   + batch_table_html(rows, self.batch_arg))  # fmt: skip
        self._set_status(f"largest batch on {len(rows)} GPUs")
        return rows

    def find_fixes(self) -> str:
        """After an OOM: which of ``configs`` fit, and the largest batch that fits under this config."""
        from memviz.predictor import max_batch

        target, kwargs = self.settings()
        fitting = [row.config or "default" for row in self.compare_configs() if row.prediction.fits]
        lines = [f"configs that fit: {', '.join(fitting)}" if fitting else "no config fits"]
        if self.batch_arg is not None and int(kwargs[self.batch_arg]) > 1:
            b = max_batch(lambda batch: self.fn(**{**kwargs, self.batch_arg: batch}), device=target["device"],
                          cap=target["cap"], alloc_conf=target["alloc_conf"], hi=int(kwargs[self.batch_arg]) - 1)
            lines.append(f"largest {self.batch_arg} that fits under this config: {b}" if b else
                         f"not even {self.batch_arg}=1 fits under this config")  # fmt: skip
        text = "; ".join(lines)
        self.fix_html.value = f'<div class="memviz-fit-fixes" style="font-size:13px">{escape(text)}</div>'
        return text

    def run_real(self) -> dict[str, Any]:
        """Run the program on this GPU under the cap, and predict it for this GPU and config beside it."""
        from memviz.widgets.fit_real import local_device, process_alloc_conf, run_for_real

        target, kwargs = self.settings()
        conf = process_alloc_conf()
        predicted = self._predict({"device": local_device(), "cap": target["cap"], "alloc_conf": conf}, kwargs,
                                  "predicting for this GPU")  # fmt: skip
        if predicted is None:
            return {}
        self._set_status("running for real…")
        measured = run_for_real(self.fn, kwargs, target["cap"])
        rows = ""
        for label, key in (("peak allocated", "peak_allocated_bytes"), ("peak reserved", "peak_reserved_bytes")):
            want, got = getattr(predicted, key), getattr(measured, key)
            rows += (f"<tr><td>{label}</td><td>{exact_bytes(want)}</td><td>{exact_bytes(got)}</td>"
                     f"<td>{_error_pct(want, got)}</td></tr>")  # fmt: skip
        fits = f"<tr><td>fits</td><td>{predicted.fits}</td><td>{measured.fits}</td><td></td></tr>"
        self.real_html.value = (
            f"<b>predicted vs measured on this GPU</b> <small>(config {escape(conf or 'default')}: this process's; "
            f"ran in {measured.seconds:.1f} s, with the cap for itself above what this process held before)"
            f"</small><table class='memviz-fit-real'><tr><th></th><th>predicted</th><th>measured</th><th>error</th>"
            f"</tr>{rows}{fits}</table>{escape(measured.oom_message)}"
        )  # fmt: skip
        self._set_status("ran for real")
        return {"predicted": predicted, "measured": measured}

    # ---- status

    def _set_status(self, text: str) -> None:
        self.status_text = text
        self.status.value = f"<small>{escape(text)}</small>"

    def _show_error(self, text: str) -> None:
        self.error_text = self.status_text = text
        self.status.value = f'<span class="memviz-error" style="color:#c62828">{escape(text)}</span>'

    def close(self) -> None:
        """Close every widget of the panel."""
        close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)


def _button(label: str, tip: str) -> W.Button:
    button = W.Button(description=label, tooltip=tip, layout=W.Layout(width="auto", min_width="max-content"))
    button.add_class("memviz-button")
    return button


def _error_pct(predicted: int, measured: int) -> str:
    return f"{100 * (predicted - measured) / measured:+.1f}%" if measured else ""


def fit_panel(fn: Callable[..., Any], **defaults: Any) -> FitPanel:
    """``FitPanel(fn, **defaults)``: see :class:`FitPanel` (``device=``, ``cap=``, ``alloc_conf=``,
    ``batch_arg=``, ``configs=`` set the panel; every other keyword is a control for ``fn``'s argument)."""
    return FitPanel(fn, **defaults)
