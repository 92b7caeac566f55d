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

A program written for ``torchrun`` runs on several GPUs, one process (rank) each: with **GPUs (ranks)** above 1
(``fit_panel(main, world_size=8)``), every change predicts every rank (:func:`memviz.predict` with ``world_size``
and ``rank``, torch's fake process group) and the panel adds:

- **the job's banner**: every rank fits, or the rank that runs out of memory first and its request;
- **a per-rank table**: each rank's peaks and fit, ranks whose predictions agree in one row (FSDP2's uneven shards
  make ranks differ), the first to run out marked;
- **outside the allocator**: the CUDA context and NCCL's buffers per rank, an estimate with its basis, kept apart
  from the allocator's peaks (and a warning when it would not fit beside the peak);
- **show rank**: which rank's gauges, timeline and segment map are drawn (a redraw, no prediction).

The configs table, the largest batches and "what would fit?" then hold for every rank (``rank="all"``); running
for real plays one GPU, so it is offered at one rank only.

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
from memviz.widgets.fit_controls import ProgramControls, RankControls, TargetControls
from memviz.widgets.fit_report import (
    BatchRow,
    ConfigRow,
    banner_html,
    batch_table_html,
    config_table_html,
    gauge_rows,
    gauge_title,
    job_banner_html,
    notes_html,
    outside_html,
    phase_spans,
    rank_table_html,
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
        world_size: the GPUs (ranks) the program runs on (default 1: a single-GPU program; more: a ``torchrun``
            program, every rank predicted, up to :data:`memviz.widgets.fit_controls.MAX_WORLD_SIZE`).
        rank: the rank whose gauges, timeline and segment map are shown first (default 0).
        defaults: control abbreviations per parameter of ``fn`` (see :mod:`memviz.widgets.fit_controls`).

    Attributes:
        prediction: the :class:`memviz.predictor.Prediction` shown now (None before the first one fits in; with
            several ranks, the shown rank's).
        ranks: with several ranks, the :class:`memviz.predictor.RankPredictions` of the job shown now; else None.
        refresh_seconds: seconds each refresh took, prediction and redraw, in order.
        status_text / error_text: the status line, and the last error ("" when the last refresh worked).
    """

    def __init__(self, fn: Callable[..., Any], *, device: str | int = "T4", cap: int | str | None = None,
                 alloc_conf: str = "", batch_arg: str | None = "", configs: Sequence[str] | None = None,
                 world_size: int = 1, rank: int = 0, **defaults: Any) -> None:  # fmt: skip
        self.fn = fn
        self.args = ProgramControls(fn, defaults)
        self.target = TargetControls(device, cap, alloc_conf)
        self.job = RankControls(world_size, rank)
        names = self.args.widgets
        self.batch_arg = next((n for n in BATCH_NAMES if n in names), None) if batch_arg == "" else batch_arg
        if self.batch_arg is not None and self.batch_arg not in names:
            raise TypeError(f"fit_panel: batch_arg={self.batch_arg!r} is not a parameter with a control; "
                            f"the controls: {', '.join(names) or '(none)'}")  # fmt: skip
        self.configs = tuple(configs) if configs is not None else ("", *CANDIDATE_CONFIGS)
        self.prediction: Any = None
        self.ranks: Any = None
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
        self.ranks_html = W.HTML()
        self.ranks_html.add_class("memviz-fit-ranks-box")
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
        self.real_html = W.HTML()
        self._show_real_button()

        self.args.observe(wrap(lambda _: self.refresh()))
        self.target.observe(wrap(lambda _: self.refresh()))
        self.job.observe(wrap(lambda _: self.refresh()))
        self.job.rank.observe(wrap(lambda change: self.show_rank(change["new"])), names="value")
        title = W.HTML(f"<b>Will it fit?</b> <code>{escape(getattr(fn, '__name__', 'program'))}</code>, predicted "
                       "with no GPU (memviz.predict)")  # fmt: skip
        actions = W.HBox([self.configs_button, self.configs_auto, self.batches_button, self.real_button],
                         layout=W.Layout(flex_flow="row wrap"))  # fmt: skip
        self.widget = W.VBox(
            [title, self.args.widget, self.target.widget, self.job.widget, W.HBox([self.progress, self.status]),
             self.banner, W.HBox([self.fix_button]), self.fix_html, self.ranks_html, self.gauges, self.area.widget,
             self.map_note, self.map.widget,
             actions, self.configs_html, self.batches_html, self.real_html, self.out],
            layout=W.Layout(width="100%"),
        )  # fmt: skip
        self.widget.add_class("memviz-fit-panel")
        self.refresh()

    # ---- the one update path

    def settings(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(target, kwargs)``: what the controls say now (``ValueError`` for a bad field); ``target`` holds
        ``world_size`` when the job has more than one rank."""
        return {**self.target.settings(), **self.job.settings()}, self.args.values()

    def refresh(self) -> Any:
        """Predict with the controls' values and redraw; returns the prediction (with several ranks, the
        :class:`memviz.predictor.RankPredictions`; None when it failed, and then nothing on screen changed but
        the status line)."""
        start = time.perf_counter()
        self._show_real_button()
        try:
            target, kwargs = self.settings()
        except ValueError as error:
            self._show_error(str(error))
            return None
        if "world_size" in target:
            result = self._predict_ranks(target, kwargs)
            if result is None:
                return None
            self.ranks = result
            self.prediction = result[self.job.shown_rank()]
            self._draw_job(result)
        else:
            result = self._predict(target, kwargs, "predicting")
            if result is None:
                return None
            self.ranks = None
            self.prediction = result
            self._draw_single(result)
        seconds = time.perf_counter() - start
        self.refresh_seconds.append(seconds)
        self._set_status(self._done_text(result, seconds))
        if self.configs_auto.value:  # after the result is on screen: the table follows
            self.compare_configs()
        return result

    @staticmethod
    def _done_text(result: Any, seconds: float) -> str:
        if getattr(result, "events", None) is not None:
            return (f"predicted in {seconds:.2f} s: {len(result.events):,} allocator events, "
                    f"{format_bytes(result.peak_reserved_bytes)} peak reserved")  # fmt: skip
        return (f"predicted {result.world_size} ranks in {seconds:.2f} s: the highest peak reserved "
                f"{format_bytes(result.peak_reserved_bytes)} (rank {result.worst_rank})")  # fmt: skip

    def _predict_ranks(self, target: dict[str, Any], kwargs: dict[str, Any], what: str = "", **over: Any) -> Any:
        """Every rank of the job, one :func:`memviz.predict` each (the status says which, after ``what``); None if
        one raised."""
        from memviz.predictor import RankPredictions

        n = target["world_size"]
        by_rank = {}
        for r in range(n):
            p = self._predict(target, kwargs, f"{what}rank {r} of {n}", rank=r, **over)
            if p is None:
                return None
            by_rank[r] = p
        return RankPredictions(n, by_rank)

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
            text = f"the program raised {type(error).__name__}: {error} {notes}".strip()
            if "world_size" not in {**target, **over} and _looks_distributed(text):
                text += " (a torchrun program? set GPUs (ranks) to the job's number of ranks)"
            self._show_error(text)
            return None
        finally:
            bar.layout.visibility = "hidden"

    def _draw_single(self, p: Any) -> None:
        self._clear()
        self.banner.value = banner_html(p) + notes_html(p.notes)
        self.fix_button.layout.display = "none" if p.fits else None
        self.ranks_html.value = ""
        self._draw_views(p)

    def _draw_job(self, ranks: Any) -> None:
        self._clear()
        notes = list(dict.fromkeys(note for r in ranks for note in ranks[r].notes))
        self.banner.value = job_banner_html(ranks) + notes_html(notes)
        self.fix_button.layout.display = "none" if ranks.fits else None
        self._draw_views(self.prediction)

    def _clear(self) -> None:
        self.error_text = ""
        self.fix_html.value = self.configs_html.value = self.batches_html.value = self.real_html.value = ""

    def show_rank(self, rank: int) -> None:
        """Draw rank ``rank``'s gauges, timeline and segment map (of the job predicted last; no prediction). While
        the world size changes (the job shown has another), nothing: the refresh that follows draws the picked rank.

        Raises:
            ValueError: the job shown has no rank ``rank``.
        """
        if self.ranks is None or self.ranks.world_size != self.job.world_size.value:
            return  # the world size is changing: the refresh that follows draws the picked rank
        if rank not in self.ranks:
            raise ValueError(f"show rank: the job has ranks 0 to {self.ranks.world_size - 1}, not {rank!r}")
        if self.job.rank.value != rank:
            self.job.rank.value = rank  # its observer comes back here
            return
        self.prediction = self.ranks[rank]
        self._draw_views(self.prediction)

    def _draw_views(self, p: Any) -> None:
        """The gauges, the area and the segment map of prediction ``p`` (and, for a rank, the per-rank table)."""
        who = "" if p.world_size is None else f"rank {p.rank} of {p.world_size} · "
        if self.ranks is not None:
            self.ranks_html.value = rank_table_html(self.ranks, shown=p.rank) + outside_html(p)
        with self.gauges.hold_sync():
            self.gauges.title = who + gauge_title(p)
            self.gauges.rows = gauge_rows(p)
            if p.world_size is None:
                self.gauges.note = (f"Peaks of the whole run. The CUDA context ({format_bytes(p.context_bytes)}) "
                                    "lives outside the allocator: a GPU's limit is its memory less the context.")
            else:
                self.gauges.note = (f"Peaks of rank {p.rank}'s allocator over the whole run. Outside it, not in these "
                                    f"bars: the CUDA context and NCCL's buffers, "
                                    f"{format_bytes(p.outside.total_bytes)} estimated (below the table).")
        layers: dict[str, list[int]] = {}
        for row in p.breakdown_over_time():
            for cat, nbytes in row.items():
                layers.setdefault(cat, []).append(nbytes)
        reserved = [e.reserved_bytes for e in p.events]
        oom = None if p.fits else (p.oom.event_index, f"{format_bytes(p.oom.requested_bytes)} for {p.oom.op}")
        self.area.show(layers, reserved, phase_spans(p), oom=oom,
                       title=f"{who}what is live over the run: {len(p.events):,} allocator events")  # fmt: skip
        at = p.peak_event_index
        segments, where = self._segments_at(p, at)
        self.map.show(segments)
        self.map_note.value = f"<small>{escape(who)}segment map {escape(where)}</small>"

    @staticmethod
    def _segments_at(p: Any, index: int) -> tuple[list[dict], str]:
        if not p.events:
            return [], "(no allocations)"
        return p.snapshot(at=index)["segments"], f"at the peak of allocated bytes (after event {index:,})"

    # ---- what costs several predictions: on demand

    def compare_configs(self) -> list[ConfigRow]:
        """The program under each of ``configs`` (same device, cap and arguments), as a table; with several
        ranks each row is the job's (:class:`memviz.predictor.RankPredictions`: every rank predicted)."""
        target, kwargs = self.settings()
        rows = []
        for i, conf in enumerate(self.configs):
            what = f"config {i + 1} of {len(self.configs)}"
            if "world_size" in target:
                p = self._predict_ranks(target, kwargs, f"{what}, ", alloc_conf=conf)
            else:
                p = self._predict(target, kwargs, what, alloc_conf=conf)
            if p is None:
                return rows
            rows.append(ConfigRow(conf, p))
        self.configs_html.value = "<b>the same program under other configs</b>" + config_table_html(
            rows, target["alloc_conf"])
        self._set_status(f"compared {len(rows)} configs")
        return rows

    def largest_batches(self, devices: Sequence[str] = TABLE_DEVICES) -> list[BatchRow]:
        """The largest ``batch_arg`` that fits on each of ``devices`` (cap and config as set), as a table; with
        several ranks, the largest that every rank fits."""
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
                              alloc_conf=target["alloc_conf"], **_every_rank(target),
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
                          cap=target["cap"], alloc_conf=target["alloc_conf"], hi=int(kwargs[self.batch_arg]) - 1,
                          **_every_rank(target))
            lines.append(f"largest {self.batch_arg} that fits under this config: {b}" if b else
                         f"not even {self.batch_arg}=1 fits under this config")  # fmt: skip
        text = "; ".join(lines)
        self.fix_html.value = f'<div class="memviz-fit-fixes" style="font-size:13px">{escape(text)}</div>'
        return text

    def run_real(self) -> dict[str, Any]:
        """Run the program on this GPU under the cap, and predict it for this GPU and config beside it.

        Raises:
            ValueError: the job has several ranks (a real run here plays one GPU, with no process group).
        """
        from memviz.widgets.fit_real import local_device, process_alloc_conf, run_for_real

        target, kwargs = self.settings()
        if "world_size" in target:
            raise ValueError("run for real plays one GPU: set GPUs (ranks) to 1 (a torchrun program's ranks each need "
                             "a GPU and a process group; memviz.predict's ranks are played on the fake one)")
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

    def _show_real_button(self) -> None:
        """Offered where there is a GPU, for one rank (a real run plays one GPU)."""
        self.real_button.layout.display = None if cuda_available() and self.job.world_size.value == 1 else "none"

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


def _every_rank(target: dict[str, Any]) -> dict[str, Any]:
    """:func:`memviz.max_batch`'s job arguments for ``target``: every rank of a job of several, else none."""
    return {} if "world_size" not in target else {"world_size": target["world_size"], "rank": "all"}


def _looks_distributed(text: str) -> bool:
    """Whether a program's error at one GPU reads like a ``torchrun`` program's: no ``RANK`` in the environment,
    torch.distributed's rendezvous or process group failing (the hint it earns names the world-size control)."""
    lowered = text.lower()
    return any(word in lowered for word in ("'rank'", "'world_size'", "'local_rank'", "variable rank",
                                            "process group", "torch.distributed"))


def _error_pct(predicted: int, measured: int) -> str:
    return f"{100 * (predicted - measured) / measured:+.1f}%" if measured else ""


def fit_panel(fn: Callable[..., Any], **defaults: Any) -> FitPanel:
    """``FitPanel(fn, **defaults)``: see :class:`FitPanel` (``device=``, ``cap=``, ``alloc_conf=``,
    ``batch_arg=``, ``configs=``, ``world_size=``, ``rank=`` set the panel; every other keyword is a control for
    ``fn``'s argument)."""
    return FitPanel(fn, **defaults)
