"""The views of a :class:`~memviz.widgets.whatif_table.WhatIfTable`: small functions of its replays' rows
(the plain-text table lessons print, the same table in HTML, the bar chart of peak reserved)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from memviz.snapshots import FidelityReport
from memviz.widgets._common import TEMPLATE, MiB, escape
from memviz.widgets.figure import Figure

if TYPE_CHECKING:
    from memviz.widgets.whatif_table import WhatIfGrid, WhatIfRow

__all__ = ["HEADERS", "fidelity_line", "peaks_figure", "table_html", "table_text"]

HEADERS = ("config", "device", "peak reserved", "peak alloc", "OOMs", "first OOM", "cudaMalloc", "cudaFree",
           "retries", "frag@peak")



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


def _label(row: WhatIfRow) -> str:
    conf = row.result.alloc_conf or "default"
    return row.config if row.config == conf else f"{row.config}: {conf}"


def _cells(row: WhatIfRow) -> list[str]:
    """One row's cells, from the replay's :meth:`~memviz.snapshots.ReplayResult.summary`."""
    r = row.result.summary()
    first = r["first_oom_event"]
    return [_label(row), row.device, f"{r['peak_reserved_bytes'] / MiB:.0f} MiB",
            f"{r['peak_allocated_bytes'] / MiB:.0f} MiB", str(r["num_ooms"]), "-" if first is None else f"{first:,}",
            str(r["num_device_alloc"]), str(r["num_device_free"]), str(r["num_alloc_retries"]),
            f"{100 * r['fragmentation_at_peak']:.1f}%"]  # fmt: skip


def _recorded_cells(grid: WhatIfGrid) -> list[str]:
    return ["(recorded)", "", f"{grid.recorded_peak_reserved_bytes / MiB:.0f} MiB",
            f"{grid.recorded_peak_allocated_bytes / MiB:.0f} MiB"] + [""] * (len(HEADERS) - 4)  # fmt: skip


def table_text(grid: WhatIfGrid) -> str:
    """The results as plain text: one row per replay (MiB, counts, percent), then the fidelity line.

    ``cudaMalloc`` counts segment allocations (page maps under ``expandable_segments``); ``retries`` the
    mallocs that freed the whole cache and tried again; ``frag@peak`` is ``(reserved - allocated) /
    reserved`` when reserved peaked.
    """
    rows = [list(HEADERS), _recorded_cells(grid), *(_cells(r) for r in grid.rows)]
    widths = [max(len(row[k]) for row in rows) for k in range(len(HEADERS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("-" * len(lines[0]))
    if grid.fidelity is not None:
        lines.append(fidelity_line(grid.fidelity))
    return "\n".join(lines)


def table_html(grid: WhatIfGrid) -> str:
    """The same table as HTML: cells never wrap (the table scrolls sideways when the page is narrow), the OOM
    cells of a replay that runs out of memory in red, the fidelity line below (green when it matched)."""
    cell = "padding:2px 8px;white-space:nowrap;text-align:"
    th = "".join(f'<th style="{cell}{"left" if k < 2 else "right"}">{escape(h)}</th>' for k, h in enumerate(HEADERS))
    body = [[(t, "") for t in _recorded_cells(grid)]]
    for row in grid.rows:
        bad = row.result.num_ooms > 0
        body.append([(t, "color:#d62728;font-weight:600" if bad and k in (4, 5) else "")
                     for k, t in enumerate(_cells(row))])  # fmt: skip
    trs = "".join(
        "<tr>" + "".join(f'<td style="{cell}{"left" if k < 2 else "right"};{style}">{escape(text)}</td>'
                         for k, (text, style) in enumerate(cells)) + "</tr>"
        for cells in body
    )  # fmt: skip
    fid = ""
    if grid.fidelity is not None:
        ok = grid.fidelity.states_matching == grid.fidelity.states_compared
        fid = (f'<div style="margin-top:4px;color:{"#2ca02c" if ok else "#d62728"}">'
               f"{escape(fidelity_line(grid.fidelity))}</div>")  # fmt: skip
    # width 0 / min-width 100%: the block takes the widget's width, not the table's, so the table scrolls sideways
    # and the fidelity line wraps at the page's edge
    return ('<div style="font-size:12px;width:0;min-width:100%"><div style="overflow-x:auto">'
            f'<table style="border-collapse:collapse">'
            f"<thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table></div>{fid}</div>")  # fmt: skip


def peaks_figure(grid: WhatIfGrid, cap_bytes: int | None) -> go.FigureWidget:
    """A bar per replay: its peak reserved (red when it runs out of memory), the recording's peak and the cap
    as vertical lines."""
    rows = grid.rows
    several = len({r.device for r in rows}) > 1
    labels = [_label(r) + (f" ({r.device})" if several else "") for r in rows]
    peaks = [r.result.peak_reserved_bytes / MiB for r in rows]
    text = [f"{p:.0f} MiB" + (f", {r.result.num_ooms} OOMs" if r.result.num_ooms else "")
            for p, r in zip(peaks, rows, strict=True)]  # fmt: skip
    fig = Figure(
        [go.Bar(x=peaks, y=labels, orientation="h", text=text, textposition="auto",
                marker={"color": ["#d62728" if r.result.num_ooms else "#ff7f0e" for r in rows]},
                hovertemplate="%{y}: peak reserved %{x:.0f} MiB<extra></extra>")],
        layout={"height": 120 + 28 * len(rows), "autosize": True, "margin": {"l": 260, "r": 20, "t": 30, "b": 40},
                "title": {"text": "peak reserved per replay (red: would run out of memory)", "font": {"size": 12}},
                "xaxis": {"title": {"text": "MiB"}, "rangemode": "tozero"}, "yaxis": {"autorange": "reversed"},
                "template": TEMPLATE, "showlegend": False},
    )  # fmt: skip
    fig.add_vline(x=grid.recorded_peak_reserved_bytes / MiB, line={"dash": "dash", "color": "#444"},
                  annotation_text="recorded", annotation_position="top")  # fmt: skip
    if cap_bytes is not None:
        fig.add_vline(x=cap_bytes / MiB, line={"dash": "dot", "color": "#d62728"}, annotation_text="cap",
                      annotation_position="bottom")  # fmt: skip
    fig.add_class("memviz-what-if-bars")
    return fig
