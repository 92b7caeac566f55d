"""The views of a :class:`~memviz.widgets.whatif_table.WhatIfTable`: small functions of its replays' rows
(the plain-text table lessons print, the same table in HTML, the bar chart of peak reserved).

The words and numbers are the reports' own (:meth:`~memviz.snapshots.ReplayResult.cells`,
:func:`~memviz.snapshots.whatif.recorded_cells`, :meth:`~memviz.snapshots.FidelityReport.describe`); these
functions only lay them out, adding the device a replay ran on."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from memviz.snapshots.whatif import TABLE_HEADERS, recorded_cells
from memviz.tables import format_table
from memviz.widgets._common import TEMPLATE, MiB, escape
from memviz.widgets.figure import Figure

if TYPE_CHECKING:
    from memviz.widgets.whatif_table import WhatIfGrid

__all__ = ["grid_cells", "peaks_figure", "table_html", "table_text"]


def _several_devices(grid: WhatIfGrid) -> bool:
    return len({r.device for r in grid.rows}) > 1


def _label_columns(grid: WhatIfGrid) -> int:
    """How many columns name a row (left-aligned): the config, and the device when there are several."""
    return 2 if _several_devices(grid) else 1


def grid_cells(grid: WhatIfGrid) -> list[list[str]]:
    """The table as strings: :data:`~memviz.snapshots.whatif.TABLE_HEADERS`, the recording's peaks, then one
    row per replay; a ``device`` column after the config when the replays ran on more than one device."""
    rows = [list(TABLE_HEADERS), recorded_cells(grid.recorded_peak_reserved_bytes, grid.recorded_peak_allocated_bytes)]
    rows += [row.result.cells() for row in grid.rows]
    if _several_devices(grid):
        for row, device in zip(rows, ["device", "", *(r.device for r in grid.rows)], strict=True):
            row.insert(1, device)
    return rows


def _caption(grid: WhatIfGrid) -> str | None:
    """``device: …`` when every replay ran on the one device (the table then has no device column)."""
    return None if _several_devices(grid) or not grid.rows else f"device: {grid.rows[0].device}"


def table_text(grid: WhatIfGrid) -> str:
    """The results as plain text: the device (when there is one), one row per replay (MiB, counts, percent; the
    columns as :data:`~memviz.snapshots.whatif.TABLE_HEADERS` says), then the fidelity sentence."""
    footer = None if grid.fidelity is None else grid.fidelity.describe()
    table = format_table(grid_cells(grid), left_columns=_label_columns(grid), footer=footer)
    caption = _caption(grid)
    return table if caption is None else f"{caption}\n{table}"


def table_html(grid: WhatIfGrid) -> str:
    """The same table as HTML: cells never wrap (the table scrolls sideways when the page is narrow), the OOM
    cells of a replay that runs out of memory in red, the fidelity sentence below (green when it matched)."""
    head, *body = grid_cells(grid)
    left = _label_columns(grid)
    oom_columns = {k for k, h in enumerate(head) if "OOM" in h}
    cell = "padding:2px 8px;white-space:nowrap;text-align:"
    th = "".join(f'<th style="{cell}{"left" if k < left else "right"}">{escape(h.replace(chr(10), " "))}</th>'
                 for k, h in enumerate(head))  # fmt: skip
    bad_rows = [False] + [row.result.num_ooms > 0 for row in grid.rows]  # the recording's row first
    trs = "".join(
        "<tr>" + "".join(f'<td style="{cell}{"left" if k < left else "right"}'
                         f'{";color:#d62728;font-weight:600" if bad and k in oom_columns else ""}">{escape(text)}</td>'
                         for k, text in enumerate(cells)) + "</tr>"
        for cells, bad in zip(body, bad_rows, strict=True)
    )  # fmt: skip
    caption = _caption(grid)
    cap = "" if caption is None else f'<div style="margin-bottom:4px">{escape(caption)}</div>'
    fid = ""
    if grid.fidelity is not None:
        fid = (f'<div style="margin-top:4px;color:{"#2ca02c" if grid.fidelity.exact else "#d62728"}">'
               f"{escape(grid.fidelity.describe())}</div>")  # fmt: skip
    # width 0 / min-width 100%: the block takes the widget's width, not the table's, so the table scrolls sideways
    # and the fidelity sentence wraps at the page's edge
    return (f'<div style="font-size:12px;width:0;min-width:100%">{cap}<div style="overflow-x:auto">'
            f'<table style="border-collapse:collapse">'
            f"<thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table></div>{fid}</div>")  # fmt: skip


def peaks_figure(grid: WhatIfGrid, cap_bytes: int | None) -> go.FigureWidget:
    """A bar per replay: its peak reserved (red when it runs out of memory), the recording's peak and the cap
    as vertical lines."""
    rows = grid.rows
    several = _several_devices(grid)
    labels = [r.result.label + (f" ({r.device})" if several else "") for r in rows]
    peaks = [r.result.peak_reserved_bytes / MiB for r in rows]
    text = [f"{p:.0f} MiB" + (f", {r.result.num_ooms} OOMs" if r.result.num_ooms else "")
            for p, r in zip(peaks, rows, strict=True)]  # fmt: skip
    fig = Figure(
        [go.Bar(x=peaks, y=labels, orientation="h", text=text, textposition="auto",
                marker={"color": ["#d62728" if r.result.num_ooms else "#ff7f0e" for r in rows]},
                hovertemplate="%{y}: peak reserved %{x:.0f} MiB<extra></extra>")],
        layout={"height": 120 + 28 * len(rows), "autosize": True, "margin": {"l": 260, "r": 20, "t": 30, "b": 40},
                "title": {"text": "peak reserved per replay (red: would run out of memory)" if grid.replayable else
                          "no replay: the recording cannot be replayed exactly (the table says why)",
                          "font": {"size": 12}},
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
