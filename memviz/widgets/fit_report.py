"""The fit panel's words and tables: the fits / OOM banner, the gauges' rows, and the side-by-side tables.

Pure functions of :class:`memviz.predictor.Prediction` objects (no widgets), so tests read the same text the
panel shows. Bytes are printed exactly (``"1.33 GiB (1,433,124,352 B)"``) where a learner compares numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memviz.units import format_bytes
from memviz.widgets._common import escape, exact_bytes
from memviz.widgets.gauges import COLORS

__all__ = ["BatchRow", "ConfigRow", "banner_html", "batch_table_html", "config_table_html", "gauge_rows",
           "gauge_title", "limit_bytes", "notes_html", "phase_spans"]  # fmt: skip


def limit_bytes(p: Any) -> int:
    """What the allocator could get in prediction ``p``: the cap, else the device less the CUDA context."""
    device_limit = p.device.total_memory_bytes - p.context_bytes
    return device_limit if p.cap_bytes is None else min(p.cap_bytes, device_limit)


def gauge_rows(p: Any) -> list[dict]:
    """The gauges' rows (see :class:`memviz.widgets.gauges.GaugeWidget`): peak allocated and peak reserved
    against :func:`limit_bytes`."""
    limit = limit_bytes(p)
    rows = []
    for key, label, nbytes, tip in (
        ("allocated", "peak allocated", p.peak_allocated_bytes, "max_memory_allocated(): the most bytes in tensors"),
        ("reserved", "peak reserved", p.peak_reserved_bytes, "max_memory_reserved(): the most the cache held"),
    ):
        rows.append({"key": key, "label": label, "fraction": nbytes / limit if limit else 0.0, "peak_fraction": None,
                     "text": exact_bytes(nbytes), "color": COLORS[key], "tooltip": tip})  # fmt: skip
    return rows


def gauge_title(p: Any) -> str:
    """``"Tesla T4 16 GB: cap 4.00 GiB (4,294,967,296 B)"``, or the device's limit ``"… for the allocator"``."""
    device = p.device.name.replace(" (simulated)", "")
    if p.cap_bytes is not None:
        return f"{device}: cap {exact_bytes(p.cap_bytes)}"
    return f"{device}: {exact_bytes(limit_bytes(p))} for the allocator (the rest: CUDA context)"


def banner_html(p: Any, suggestions: str = "") -> str:
    """Green when the program fits, red with the failing request (size, op, module, line, phase) when not;
    ``suggestions`` (HTML: which config or batch would fit) goes under an OOM."""
    limit = limit_bytes(p)
    if p.fits:
        share = 100 * p.peak_reserved_bytes / limit if limit else 0.0
        return (f'<div class="memviz-fit-banner memviz-fit-ok" style="{_BOX}background:#e8f5e9;border-color:#2e7d32">'
                f"<b>fits</b>: peak reserved {escape(format_bytes(p.peak_reserved_bytes))} of "
                f"{escape(format_bytes(limit))} ({share:.0f}%), peak allocated "
                f"{escape(format_bytes(p.peak_allocated_bytes))}</div>")  # fmt: skip
    oom = p.oom
    where = f" in <code>{escape(oom.module)}</code>" if oom.module else ""
    line = f" at <code>{escape(oom.line)}</code>" if oom.line else ""
    return (f'<div class="memviz-fit-banner memviz-fit-oom" style="{_BOX}background:#ffebee;border-color:#c62828">'
            f"<b>OUT OF MEMORY</b> in the {escape(oom.phase)} phase: "
            f"{escape(format_bytes(oom.requested_bytes))} ({oom.requested_bytes:,} B) for "
            f"<code>{escape(oom.op)}</code>{where}{line}"
            f"<details><summary>torch's message</summary><pre style='white-space:pre-wrap'>{escape(oom.message)}"
            f"</pre></details>{suggestions}</div>")  # fmt: skip


def notes_html(notes: Sequence[str]) -> str:
    """What the prediction met but does not model (``Prediction.notes``), one line each; "" when none."""
    if not notes:
        return ""
    items = "".join(f"<li>{escape(note)}</li>" for note in notes)
    return (f'<div class="memviz-fit-notes" style="font-size:12px;color:#8a6d3b">what this prediction met and '
            f"does not model, or models from less (the figures may be off there):<ul style='margin:0'>{items}</ul>"
            "</div>")  # fmt: skip


_BOX = "border:1px solid;border-radius:3px;padding:4px 8px;margin:4px 0;font-size:13px;"


def phase_spans(p: Any) -> list[tuple[str, int, int]]:
    """``(phase, first event, last event)`` for each forward / backward / optimizer stretch of ``p``."""
    marks = list(p.phases)
    n = len(p.events)
    spans = []
    for i, (start, name) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else n
        if name in ("forward", "backward", "optimizer") and end > start:
            spans.append((name, start, end - 1))
    return spans


@dataclass(frozen=True)
class ConfigRow:
    """The program under one allocator config: its prediction."""

    config: str
    prediction: Any


@dataclass(frozen=True)
class BatchRow:
    """The largest batch that fits on one GPU (0: not even the smallest)."""

    device: str
    total_bytes: int
    largest_batch: int


def config_table_html(rows: Sequence[ConfigRow], current: str = "") -> str:
    """One row per config: fits, peak reserved, peak allocated, reserved above allocated; ``current`` in bold."""
    head = ("<tr><th>config</th><th>fits</th><th>peak reserved</th><th>peak allocated</th>"
            "<th>reserved − allocated</th></tr>")
    body = []
    for row in rows:
        p = row.prediction
        bold = ' style="font-weight:600"' if row.config == current else ""
        body.append(f"<tr{bold}><td><code>{escape(row.config or 'default')}</code></td>"
                    f"<td>{'yes' if p.fits else 'OOM'}</td><td>{escape(format_bytes(p.peak_reserved_bytes))}</td>"
                    f"<td>{escape(format_bytes(p.peak_allocated_bytes))}</td>"
                    f"<td>{escape(format_bytes(p.peak_reserved_bytes - p.peak_allocated_bytes))}</td></tr>")
    return _table("memviz-fit-configs", head, body)


def batch_table_html(rows: Sequence[BatchRow], batch_arg: str) -> str:
    """One row per GPU: its memory and the largest ``batch_arg`` that fits."""
    head = f"<tr><th>GPU</th><th>memory</th><th>largest {escape(batch_arg)}</th></tr>"
    body = [f"<tr><td>{escape(r.device)}</td><td>{escape(format_bytes(r.total_bytes))}</td>"
            f"<td>{r.largest_batch if r.largest_batch else 'none fits'}</td></tr>" for r in rows]  # fmt: skip
    return _table("memviz-fit-batches", head, body)


def _table(cls: str, head: str, body: list[str]) -> str:
    return (f'<table class="{cls}" style="border-collapse:collapse;font-size:12px">'
            f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table>")  # fmt: skip
