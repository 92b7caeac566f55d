"""What if: a recorded run's requests replayed under other allocator configs and devices, side by side.

``WhatIfTable(source, configs=("expandable_segments:True",), cap="6000 MiB")`` replays the recorded
``alloc``/``free`` sequence through :func:`memviz.snapshots.what_if` (the recorded config first, then each
config, on each device size) and shows one row per replay: peak reserved, peak allocated, OOMs and the
first OOM event, ``cudaMalloc``/``cudaFree`` counts, retries and the fragmentation at peak reserved; then the
fidelity line (does replaying under the recorded config reproduce the recorded segment states?) and a
bar chart of peak reserved per replay. :meth:`WhatIfTable.table` is the same table as plain text, for
notebooks whose saved output a test compares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from memviz.devices import simulated_device
from memviz.snapshots import FidelityReport, ReplayResult, SnapshotHistory, WhatIfReport, check_fidelity, what_if
from memviz.units import format_bytes, parse_size
from memviz.widgets._common import TEMPLATE, MiB, close_tree, escape
from memviz.widgets.figure import Figure
from memviz.widgets.snapshot_viewer import history_of

__all__ = ["WhatIfRow", "WhatIfTable", "fidelity_line", "what_if_widget"]

AUTO_PROGRESS_REQUESTS = 100_000  # show a tqdm.auto bar over the replays from this many replayed requests


@dataclass(frozen=True)
class WhatIfRow:
    """One replay: a config on a device. ``result`` holds every number (bytes)."""

    config: str
    device: str
    result: ReplayResult


def fidelity_line(fidelity: FidelityReport) -> str:
    """One line: does replaying under the recorded config reproduce the recorded segment states?"""
    same = fidelity.states_matching == fidelity.states_compared and fidelity.states_compared > 0
    line = (
        f"replaying under the recorded config ({fidelity.alloc_conf or 'default'}) reproduces the recorded "
        f"segment states: {'yes' if same else 'no'}, {fidelity.states_matching} of {fidelity.states_compared} "
        f"checked; reserved bytes match at {fidelity.reserved_matches:,} of {fidelity.events_compared:,} "
        "requests"
    )
    if fidelity.first_state_mismatch is not None:
        line += f" (first differing state at event {fidelity.first_state_mismatch:,})"
    return line


def _size_label(nbytes: int) -> str:
    """A cap as people write it: ``"6000 MiB"``, ``"12 GiB"``; other sizes as :func:`format_bytes` prints them."""
    if nbytes % (1 << 30) == 0:
        return f"{nbytes >> 30} GiB"
    if nbytes % MiB == 0:
        return f"{nbytes // MiB} MiB"
    return format_bytes(nbytes)


def _device_spec(device: Any) -> tuple[int | None, str]:
    """``(device_total_bytes or None, label)`` from None (no device limit), a preset name or a size."""
    if device is None:
        return None, "unlimited"
    d = simulated_device(device)
    label = d.name.replace(" (simulated)", "").replace("Simulated GPU ", "")
    return d.total_memory_bytes, label


def _configs(configs: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    if isinstance(configs, str):
        configs = (configs,)
    named = dict(configs) if isinstance(configs, Mapping) else {c or "default": c for c in configs}
    for name, conf in named.items():
        if not isinstance(conf, str):
            raise TypeError(f"config {name!r} must be a PYTORCH_CUDA_ALLOC_CONF string, got {type(conf).__name__}")
    return named


class WhatIfTable:
    """Replay a recorded run under other allocator configs and device sizes; show the results side by side.

    Args:
        source: a snapshot (path, bytes, file, dict) or a :class:`~memviz.snapshots.SnapshotHistory`.
        configs: ``PYTORCH_CUDA_ALLOC_CONF`` strings, or a mapping name → string; the recorded config is
            always replayed first, as ``recorded`` (default: ``("expandable_segments:True",)``).
        device_sizes: simulated devices, each a preset name (``"T4"``), a size (``"24 GiB"``, bytes) or None
            for no device limit (default: ``(None,)``).
        cap: cap every replay at this size (``"6000 MiB"``, bytes), as
            ``torch.cuda.set_per_process_memory_fraction(cap / device)`` does (default: None).
        check: run the fidelity check, i.e. replay under the recorded config and compare segment states with
            the recording (default: True).
        recorded_device, recorded_cap: the device and cap the recording ran with, for the fidelity check
            (default: None, no limit; give them when the recording itself ran out of memory).
        progress: ``tqdm.auto`` bars (default: None: from 100,000 replayed requests in all).

    Attributes: ``history``, ``rows`` (:class:`WhatIfRow` list, in table order), ``reports`` (one
    :class:`~memviz.snapshots.WhatIfReport` per device), ``fidelity`` (or None), ``figure`` (bar chart of
    peak reserved), ``widget`` (the ``VBox`` displayed).

    Raises:
        TypeError / SnapshotError: ``source`` is not a snapshot, or has no events to replay.
        ValueError: a bad device, cap or size (e.g. a cap above a device's memory).
    """

    HEADERS = (
        "config",
        "device",
        "peak reserved",
        "peak alloc",
        "OOMs",
        "first OOM",
        "cudaMalloc",
        "cudaFree",
        "retries",
        "frag@peak",
    )

    def __init__(
        self,
        source: Any,
        configs: Mapping[str, str] | Iterable[str] = ("expandable_segments:True",),
        *,
        device_sizes: Sequence[Any] = (None,),
        cap: int | str | None = None,
        check: bool = True,
        recorded_device: int | str | None = None,
        recorded_cap: int | str | None = None,
        progress: bool | None = None,
    ) -> None:
        self.history: SnapshotHistory = history_of(source, progress=progress)
        named = _configs(configs)
        if isinstance(device_sizes, (str, int)):
            device_sizes = (device_sizes,)
        devices = [_device_spec(d) for d in device_sizes] or [(None, "unlimited")]
        self.cap_bytes = parse_size(cap) if cap is not None else None
        rec_total = _device_spec(recorded_device)[0]
        rec_cap = parse_size(recorded_cap) if recorded_cap is not None else None
        requests = len(self.history.events) + len(self.history.initial_blocks)
        n_replays = len(devices) * (1 + len(named)) + (1 if check else 0)
        if progress is None:
            progress = requests * n_replays >= AUTO_PROGRESS_REQUESTS
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(devices), desc="what-if replays", unit="device", leave=False)
        self.fidelity: FidelityReport | None = None
        self.reports: list[WhatIfReport] = []
        self.rows: list[WhatIfRow] = []
        for total, label in devices:
            if self.cap_bytes is not None:
                cap_text = f"cap {_size_label(self.cap_bytes)}"
                label = cap_text if total is None else f"{label}, {cap_text}"
            here = check and self.fidelity is None and (total, self.cap_bytes) == (rec_total, rec_cap)
            report = what_if(
                self.history, named, device_total_bytes=total, cap_bytes=self.cap_bytes, check=here, progress=progress
            )
            if here:
                self.fidelity = report.fidelity
            self.reports.append(report)
            self.rows.extend(WhatIfRow(name, label, r) for name, r in report.results.items())
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        if check and self.fidelity is None:
            self.fidelity = check_fidelity(
                self.history, device_total_bytes=rec_total, cap_bytes=rec_cap, progress=progress
            )
        tl = self.history.timeline
        self.recorded_peak_reserved_bytes = max(tl.reserved_bytes, default=tl.initial["reserved_bytes"])
        self.recorded_peak_allocated_bytes = max(tl.allocated_bytes, default=tl.initial["allocated_bytes"])
        self.figure = self._figure()
        self.html = W.HTML(self._html())
        self.widget = W.VBox([self.html, self.figure])
        self.widget.add_class("memviz-what-if")

    # -- output ---------------------------------------------------------------------------------
    def _label(self, row: WhatIfRow) -> str:
        conf = row.result.alloc_conf or "default"
        return row.config if row.config == conf else f"{row.config}: {conf}"

    def _cells(self, row: WhatIfRow) -> list[str]:
        r = row.result
        first = f"{r.oom_event_indices[0]:,}" if r.oom_event_indices else "-"
        return [
            self._label(row),
            row.device,
            f"{r.peak_reserved_bytes / MiB:.0f} MiB",
            f"{r.peak_allocated_bytes / MiB:.0f} MiB",
            str(r.num_ooms),
            first,
            str(r.num_device_alloc),
            str(r.num_device_free),
            str(r.num_alloc_retries),
            f"{100 * r.fragmentation_at_peak:.1f}%",
        ]

    def table(self) -> str:
        """The results as plain text: one row per replay (MiB, counts, percent), then the fidelity line.

        ``cudaMalloc`` counts segment allocations (page maps under ``expandable_segments``); ``retries`` the
        mallocs that freed the whole cache and tried again; ``frag@peak`` is ``(reserved - allocated) /
        reserved`` when reserved peaked.
        """
        rows = [list(self.HEADERS)]
        rows.append(
            [
                "(recorded)",
                "",
                f"{self.recorded_peak_reserved_bytes / MiB:.0f} MiB",
                f"{self.recorded_peak_allocated_bytes / MiB:.0f} MiB",
                "",
                "",
                "",
                "",
                "",
                "",
            ]
        )
        rows += [self._cells(r) for r in self.rows]
        widths = [max(len(row[k]) for row in rows) for k in range(len(self.HEADERS))]
        lines = []
        for n, row in enumerate(rows):
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
            lines.append("  ".join(cells).rstrip())
            if n == 0:
                lines.append("-" * len(lines[0]))
        if self.fidelity is not None:
            lines.append(fidelity_line(self.fidelity))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _html(self) -> str:
        th = "".join(
            f'<th style="text-align:{"left" if k < 2 else "right"};padding:2px 8px">{escape(h)}</th>'
            for k, h in enumerate(self.HEADERS)
        )
        body = []
        recorded = [
            ("(recorded)", ""),
            (f"{self.recorded_peak_reserved_bytes / MiB:.0f} MiB", ""),
            (f"{self.recorded_peak_allocated_bytes / MiB:.0f} MiB", ""),
        ]
        cells = [recorded[0], ("", ""), *recorded[1:], *([("", "")] * (len(self.HEADERS) - 4))]
        body.append(cells)
        for row in self.rows:
            texts = self._cells(row)
            bad = row.result.num_ooms > 0
            body.append(
                [(t, "color:#d62728;font-weight:600" if bad and k in (4, 5) else "") for k, t in enumerate(texts)]
            )
        trs = []
        for cells in body:
            tds = "".join(
                f'<td style="text-align:{"left" if k < 2 else "right"};padding:2px 8px;{style}">{escape(text)}</td>'
                for k, (text, style) in enumerate(cells)
            )
            trs.append(f"<tr>{tds}</tr>")
        fid = ""
        if self.fidelity is not None:
            ok = self.fidelity.states_matching == self.fidelity.states_compared
            fid = (
                f'<div style="margin-top:4px;color:{"#2ca02c" if ok else "#d62728"}">'
                f"{escape(fidelity_line(self.fidelity))}</div>"
            )
        return (
            f'<div style="font-size:12px"><table style="border-collapse:collapse">'
            f"<thead><tr>{th}</tr></thead><tbody>{''.join(trs)}</tbody></table>{fid}</div>"
        )

    def _figure(self) -> go.FigureWidget:
        labels = [
            self._label(r) + (f" ({r.device})" if len({x.device for x in self.rows}) > 1 else "") for r in self.rows
        ]
        peaks = [r.result.peak_reserved_bytes / MiB for r in self.rows]
        colors = ["#d62728" if r.result.num_ooms else "#ff7f0e" for r in self.rows]
        text = [
            f"{p:.0f} MiB" + (f", {r.result.num_ooms} OOMs" if r.result.num_ooms else "")
            for p, r in zip(peaks, self.rows, strict=True)
        ]
        fig = Figure(
            [
                go.Bar(
                    x=peaks,
                    y=labels,
                    orientation="h",
                    marker={"color": colors},
                    text=text,
                    textposition="auto",
                    hovertemplate="%{y}: peak reserved %{x:.0f} MiB<extra></extra>",
                )
            ],
            layout={
                "height": 120 + 28 * len(self.rows),
                "width": 720,
                "margin": {"l": 260, "r": 20, "t": 30, "b": 40},
                "title": {"text": "peak reserved per replay (red: would run out of memory)", "font": {"size": 12}},
                "xaxis": {"title": {"text": "MiB"}, "rangemode": "tozero"},
                "yaxis": {"autorange": "reversed"},
                "template": TEMPLATE,
                "showlegend": False,
            },
        )
        fig.add_vline(
            x=self.recorded_peak_reserved_bytes / MiB,
            line={"dash": "dash", "color": "#444"},
            annotation_text="recorded",
            annotation_position="top",
        )
        if self.cap_bytes is not None:
            fig.add_vline(
                x=self.cap_bytes / MiB,
                line={"dash": "dot", "color": "#d62728"},
                annotation_text="cap",
                annotation_position="bottom",
            )
        fig.add_class("memviz-what-if-bars")
        return fig

    def result(self, config: str = "recorded", device: int = 0) -> ReplayResult:
        """The :class:`ReplayResult` of ``config`` on the ``device``-th device size (for the viewer's ``replay=``)."""
        return self.reports[device].results[config]

    def close(self) -> None:
        """Close the table's widgets."""
        close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)


def what_if_widget(
    source: Any,
    configs: Mapping[str, str] | Iterable[str] = ("expandable_segments:True",),
    *,
    device_sizes: Sequence[Any] = (None,),
    cap: int | str | None = None,
    **kwargs: Any,
) -> WhatIfTable:
    """Run the what-if replays and return the :class:`WhatIfTable` (it displays itself; ``.table()`` is text)."""
    return WhatIfTable(source, configs, device_sizes=device_sizes, cap=cap, **kwargs)
