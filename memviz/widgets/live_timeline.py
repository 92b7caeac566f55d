"""The live timeline: memory over seconds, drawn in the page as samples arrive while a cell still runs.

A small anywidget, not a plotly figure: a plotly update resends every point of every trace (plotly's widget
has no "extend"), and that serializing runs in the watched process, on its GIL, several times a second. Here
the kernel sends only the new samples (:meth:`LiveTimeline.append`: one custom comm message with a few rows);
the page keeps every row it was sent (per model, so a second view of the widget shows the same) and redraws
an SVG at most once per animation frame, through each pixel column's first, lowest, highest and last sample
(every peak stays visible however long the run). Comm messages are sent by ipykernel's IOPub thread from any
thread, and the page's widget manager applies them as they come, busy kernel or not: that is what lets the
timeline grow during one cell.

Rows are :data:`~memviz.watching.samples.FIELDS`: seconds, allocated, reserved, active, peak allocated, peak
reserved, the driver's used memory (-1: none), steps. Lines: allocated, reserved, active, the peak allocated
so far (the allocator's own peak, exact even for a spike between two samples; drawn as a step up at the start
of the interval in which it was reached, so it is never below the other lines) and the driver's
used memory when there is one; a dashed red line at the cap once the data comes within half of it; ticks for
the steps (every 1, 2, 5, 10, ... so that about 20 show); ``marks`` (the peak, OOMs) as labelled points.

When the watch ends, ``rows`` is set to the whole run (thinned to at most ``FINAL_POINTS`` rows through the
same envelope, every peak kept), so a view drawn later (the notebook reopened) shows the run too.
"""

from __future__ import annotations

import json
from typing import Any

import anywidget
import traitlets

__all__ = ["SERIES", "LiveTimeline"]

SERIES = (  # (row index, name, colour, width in px, SVG dash pattern or "")
    (1, "allocated", "#1f77b4", 2, ""),
    (2, "reserved", "#ff7f0e", 2, ""),
    (3, "active", "#2ca02c", 1.5, "2,3"),
    (4, "peak allocated", "#1f77b4", 1, "6,4"),
    (6, "driver used", "#7f7f7f", 1.5, ""),
)

_ESM = r"""
const SERIES = SERIES_JSON;
const PEAK = 4, DRIVER = 6, STEPS = 7;
const H = 250, M = { l: 64, r: 18, t: 12, b: 34 };
const MiB = 1048576, GiB = 1073741824;

function bytesText(b) {
  if (b >= GiB) return (b / GiB).toFixed(2) + " GiB";
  if (b >= MiB) return (b / MiB).toFixed(2) + " MiB";
  if (b >= 1024) return (b / 1024).toFixed(2) + " KiB";
  return b + " B";
}
function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}
function byteTicks(top) { // MiB or GiB steps of 1, 2, 5 x 10^k
  const unit = top >= 4 * GiB ? GiB : MiB;
  const step = niceStep(top / unit, 4) * unit;
  const ticks = [];
  for (let v = 0; v <= top * 1.0001; v += step) ticks.push(v);
  return { ticks, unit };
}
function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
// indices of the rows drawn for column k of `width`: each column's first, lowest, highest and last row
function envelope(rows, col, x, width) {
  const n = rows.length;
  if (n <= 4 * width) return rows.map((_, i) => i);
  const out = [];
  let i = 0;
  while (i < n) {
    const c = Math.floor(x(rows[i][0]));
    let lo = i, hi = i, j = i;
    while (j < n && Math.floor(x(rows[j][0])) === c) {
      if (rows[j][col] < rows[lo][col]) lo = j;
      if (rows[j][col] > rows[hi][col]) hi = j;
      j++;
    }
    for (const k of [...new Set([i, lo, hi, j - 1])].sort((a, b) => a - b)) out.push(k);
    i = j;
  }
  return out;
}

export default () => {
  const data = { rows: [], views: new Set() };
  const redraw = () => data.views.forEach((f) => f());
  return {
    initialize({ model }) {
      data.rows = (model.get("rows") || []).slice();
      model.on("msg:custom", (msg) => {
        if (!msg || !msg.rows) return;
        for (const r of msg.rows) data.rows.push(r);
        const max = model.get("max_points");
        if (data.rows.length > max) data.rows = data.rows.filter((_, i) => i % 2 === 1);
        redraw();
      });
      model.on("change:rows", () => { data.rows = (model.get("rows") || []).slice(); redraw(); });
      for (const name of ["marks", "limit_bytes", "state", "title"]) model.on("change:" + name, redraw);
    },
    render({ model, el }) {
      el.classList.add("memviz-live");
      const head = document.createElement("div");
      head.className = "memviz-live-head";
      const plot = document.createElement("div");
      plot.className = "memviz-live-plot";
      el.append(head, plot);
      let frame = 0;
      const draw = () => {
        frame = 0;
        const rows = data.rows;
        const state = model.get("state");
        const last = rows.length ? rows[rows.length - 1] : null;
        el.dataset.points = String(rows.length);
        el.dataset.state = state;
        el.dataset.lastT = last ? String(last[0]) : "";
        let text = model.get("title");
        if (last) {
          text += (state === "running" ? " · live " : " · ") + last[0].toFixed(1) + " s · " + last[STEPS] +
            " steps · allocated " + bytesText(last[1]) + " (peak " + bytesText(last[PEAK]) + ") · reserved " +
            bytesText(last[2]);
        } else if (state === "running") text += " · waiting for the first sample";
        head.textContent = text;
        head.className = "memviz-live-head memviz-live-" + state;
        const width = Math.max(320, Math.round(plot.getBoundingClientRect().width || el.clientWidth || 640));
        const w = width - M.l - M.r, h = H - M.t - M.b;
        const t0 = rows.length ? rows[0][0] : 0;
        const t1 = Math.max(t0 + 1, last ? last[0] : 1);
        const limit = model.get("limit_bytes");
        let top = 1;
        for (const r of rows) for (const [c] of SERIES) if (r[c] > top) top = r[c];
        const showLimit = limit > 0 && top >= 0.5 * limit;
        if (showLimit) top = Math.max(top, limit);
        top *= 1.06;
        const x = (t) => M.l + ((t - t0) / (t1 - t0)) * w;
        const y = (b) => M.t + h - (b / top) * h;
        const parts = [];
        const { ticks, unit } = byteTicks(top);
        for (const v of ticks) {
          parts.push(`<line x1="${M.l}" x2="${M.l + w}" y1="${y(v)}" y2="${y(v)}" stroke="#EBF0F8"/>` +
            `<text x="${M.l - 6}" y="${y(v) + 4}" text-anchor="end" class="memviz-live-tick">` +
            `${+(v / unit).toFixed(2)}</text>`);
        }
        parts.push(`<text x="14" y="${M.t + h / 2}" transform="rotate(-90 14 ${M.t + h / 2})" ` +
          `text-anchor="middle" class="memviz-live-tick">${unit === GiB ? "GiB" : "MiB"}</text>`);
        const tstep = niceStep(t1 - t0, 6);
        for (let t = Math.ceil(t0 / tstep) * tstep; t <= t1 + 1e-9; t += tstep) {
          parts.push(`<text x="${x(t)}" y="${M.t + h + 16}" text-anchor="middle" class="memviz-live-tick">` +
            `${+t.toFixed(2)}</text>`);
        }
        parts.push(`<text x="${M.l + w / 2}" y="${H - 2}" text-anchor="middle" class="memviz-live-tick">` +
          `seconds since the watch began</text>`);
        if (showLimit) {
          parts.push(`<line class="memviz-live-limit" x1="${M.l}" x2="${M.l + w}" y1="${y(limit)}" ` +
            `y2="${y(limit)}" stroke="#d62728" stroke-dasharray="5,4"/>`);
        }
        if (rows.length) {  // step ticks: every 1, 2, 5, 10, ... steps, about 20 in all
          const total = last[STEPS] - rows[0][STEPS];
          const every = total > 20 ? niceStep(total, 20) : 1;
          let next = (Math.floor(rows[0][STEPS] / every) + 1) * every;
          const marks = [];
          for (const r of rows) {
            if (r[STEPS] >= next) {
              marks.push([r[0], r[STEPS]]);
              next = (Math.floor(r[STEPS] / every) + 1) * every;
            }
          }
          for (const [t, s] of marks) {
            parts.push(`<line class="memviz-live-step" x1="${x(t)}" x2="${x(t)}" y1="${M.t + h - 6}" ` +
              `y2="${M.t + h}" stroke="#555"><title>step ${s}</title></line>`);
          }
          el.dataset.stepMarks = String(marks.length);
        }
        for (const [col, name, color, lw, dash] of SERIES) {
          if (col === DRIVER && !rows.some((r) => r[DRIVER] >= 0)) continue;
          const picks = envelope(rows, col, x, w);
          const pts = [];
          let prev = null;
          for (const i of picks) {
            const r = rows[i];
            if (r[col] < 0) continue;
            const px = x(r[0]).toFixed(1), py = y(r[col]).toFixed(1);
            // the peak so far, as a step up at the start of the interval it was reached in: never below a line
            if (col === PEAK && prev !== null) pts.push(`${prev},${py}`);
            pts.push(`${px},${py}`);
            prev = px;
          }
          const cls = "memviz-live-" + name.replace(/ /g, "-");
          parts.push(`<polyline class="${cls}" fill="none" stroke="${color}" stroke-width="${lw}"` +
            `${dash ? ` stroke-dasharray="${dash}"` : ""} points="${pts.join(" ")}"/>`);
        }
        for (const m of model.get("marks")) {
          const mx = x(m.t_s), my = y(m.bytes);
          const color = m.kind === "oom" ? "#d62728" : "#1f77b4";
          const symbol = m.kind === "oom"
            ? `<path d="M${mx - 5},${my - 5}L${mx + 5},${my + 5}M${mx - 5},${my + 5}L${mx + 5},${my - 5}" ` +
              `stroke="${color}" stroke-width="2.5"/>`
            : `<circle cx="${mx}" cy="${my}" r="4.5" fill="${color}"/>`;
          const anchor = mx > M.l + 0.7 * w ? "end" : "start";
          const dx = anchor === "end" ? -8 : 8;
          const ty = m.kind === "oom" ? Math.max(M.t + 10, my - 8) : my + 16; // OOM above, peak below: apart
          parts.push(`<g class="memviz-live-mark memviz-live-mark-${m.kind}">${symbol}<text x="${mx + dx}" ` +
            `y="${ty}" text-anchor="${anchor}" fill="${color}" ` +
            `class="memviz-live-mark-text">${esc(m.label)}</text><title>${esc(m.label)}</title></g>`);
        }
        plot.innerHTML = `<svg width="${width}" height="${H}" class="memviz-live-svg">${parts.join("")}</svg>`;
      };
      const later = () => { if (!frame) frame = requestAnimationFrame(draw); };
      data.views.add(later);
      const observer = new ResizeObserver(later);
      observer.observe(plot);
      draw();
      return () => { data.views.delete(later); observer.disconnect(); if (frame) cancelAnimationFrame(frame); };
    },
  };
};
"""

_CSS = """
.memviz-live { font: 12px/1.5 var(--jp-ui-font-family, sans-serif); color: var(--jp-ui-font-color1, #222);
  width: 100%; }
.memviz-live-head { font-family: var(--jp-code-font-family, monospace); white-space: pre-wrap; }
.memviz-live-running::before { content: "● "; color: #d62728; }
.memviz-live-plot { width: 100%; }
.memviz-live-tick { font-size: 11px; fill: #2a3f5f; }
.memviz-live-mark-text { font-size: 11px; font-weight: 600; }
"""


class LiveTimeline(anywidget.AnyWidget):
    """Memory over time, appended to while a watch runs (see the module docstring).

    Traits: ``title`` (the line's start), ``state`` (``"running"``, ``"done"``, ``"stopped"``),
    ``limit_bytes`` (the cap or the device, 0: none), ``marks`` (``[{"kind": "peak" | "oom", "t_s", "bytes",
    "label"}]``), ``rows`` (the whole run, set at the end), ``max_points`` (rows a page keeps; it halves them
    past this). ``sent_rows`` counts the rows sent by :meth:`append`.
    """

    _esm = _ESM.replace("SERIES_JSON", json.dumps(SERIES))
    _css = _CSS
    title = traitlets.Unicode("").tag(sync=True)
    state = traitlets.Unicode("running").tag(sync=True)
    limit_bytes = traitlets.Int(0).tag(sync=True)
    marks = traitlets.List(traitlets.Dict()).tag(sync=True)
    rows = traitlets.List().tag(sync=True)
    max_points = traitlets.Int(20_000).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent_rows = 0

    def append(self, rows: list[list[float | int]]) -> None:
        """Send new rows to the page (one custom comm message); nothing is kept here."""
        if rows:
            self.send({"rows": rows})
            self.sent_rows += len(rows)
