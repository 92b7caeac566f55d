"""The fit panel's words and tables: the fits / OOM banner, the gauges' rows, and the side-by-side tables.

Pure functions of :class:`memviz.predictor.Prediction` objects (and, for a job of several ranks, of
:class:`memviz.predictor.RankPredictions`: the per-rank table, the job's banner, the estimate of what a rank holds
outside the allocator), so tests read the same text the panel shows. Bytes are printed exactly
(``"1.33 GiB (1,433,124,352 B)"``) where a learner compares numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memviz.units import format_bytes
from memviz.widgets._common import escape, exact_bytes
from memviz.widgets.gauges import COLORS

__all__ = ["BatchRow", "ConfigRow", "banner_html", "batch_table_html", "config_table_html", "first_oom_rank",
           "gauge_rows", "gauge_title", "job_banner_html", "limit_bytes", "notes_html", "outside_html", "phase_spans",
           "rank_span", "rank_table_html"]  # fmt: skip


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


def banner_html(p: Any, suggestions: str = "", who: str = "") -> str:
    """Green when the program fits, red with the failing request (size, op, module, line, phase) when not;
    ``suggestions`` (HTML: which config or batch would fit) goes under an OOM; ``who`` (text, e.g. ``"rank 3 of
    4"``) says whose run it is."""
    limit = limit_bytes(p)
    whose = f"{escape(who)}: " if who else ""
    if p.fits:
        share = 100 * p.peak_reserved_bytes / limit if limit else 0.0
        return (f'<div class="memviz-fit-banner memviz-fit-ok" style="{_BOX}background:#e8f5e9;border-color:#2e7d32">'
                f"{whose}<b>fits</b>: peak reserved {escape(format_bytes(p.peak_reserved_bytes))} of "
                f"{escape(format_bytes(limit))} ({share:.0f}%), peak allocated "
                f"{escape(format_bytes(p.peak_allocated_bytes))}</div>")  # fmt: skip
    oom = p.oom
    where = f" in <code>{escape(oom.module)}</code>" if oom.module else ""
    line = f" at <code>{escape(oom.line)}</code>" if oom.line else ""
    return (f'<div class="memviz-fit-banner memviz-fit-oom" style="{_BOX}background:#ffebee;border-color:#c62828">'
            f"{whose}<b>OUT OF MEMORY</b> in the {escape(oom.phase)} phase: "
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


# ---- a job of several ranks


def rank_span(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"ranks 0–2, 5"``; ``[3]`` → ``"rank 3"`` (runs of consecutive ranks joined)."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return "ranks " + ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}" for run in runs)


def first_oom_rank(ranks: Any) -> int | None:
    """The rank that runs out of memory first, None when every rank fits.

    Of the ranks whose prediction ran out, the one that failed earliest in the program: in the earliest phase (the
    ranks run the same program, their collectives holding them in step, so their forward / backward / optimizer
    phases line up one to one), then after the fewest allocator events into that phase (ranks with different
    shards make a few different allocations, so a rank's place in its own log is compared from the phase's
    start, not from the run's), then the lowest rank.
    """
    def when(rank: int) -> tuple[int, int, int]:
        p = ranks[rank]
        starts = [i for i, _ in p.phases if i <= p.oom.event_index] or [0]
        return len(starts), p.oom.event_index - starts[-1], rank

    failing = [r for r in ranks if not ranks[r].fits]
    return min(failing, key=when) if failing else None


def job_banner_html(ranks: Any, suggestions: str = "") -> str:
    """The job's verdict: green when every rank fits (with the rank that comes closest), else the first rank to run
    out of memory, in :func:`banner_html`'s red banner with how many ranks ran out."""
    n = ranks.world_size
    first = first_oom_rank(ranks)
    if first is None:
        p = ranks[ranks.worst_rank]
        limit = limit_bytes(p)
        share = 100 * p.peak_reserved_bytes / limit if limit else 0.0
        return (f'<div class="memviz-fit-banner memviz-fit-ok" style="{_BOX}background:#e8f5e9;border-color:#2e7d32">'
                f"<b>every rank fits</b> ({n} ranks): the highest peak reserved is rank {ranks.worst_rank}'s, "
                f"{escape(format_bytes(p.peak_reserved_bytes))} of {escape(format_bytes(limit))} ({share:.0f}%)"
                "</div>")  # fmt: skip
    failing = [r for r in ranks if not ranks[r].fits]
    who = f"rank {first} of {n} runs out of memory first ({len(failing)} of {n} ranks run out: {rank_span(failing)})"
    return banner_html(ranks[first], suggestions, who=who)


def rank_table_html(ranks: Any, shown: int | None = None) -> str:
    """One row per group of ranks whose predictions agree (the same peaks and fit): the ranks, fits or OOM (the
    first to run out marked), the peaks, their share of :func:`limit_bytes`; the group of rank ``shown`` in bold."""
    first = first_oom_rank(ranks)
    pad = ' style="padding:0 8px;text-align:left"'
    head = "<tr>" + "".join(f"<th{pad}>{h}</th>" for h in ("ranks", "fits", "peak allocated", "peak reserved",
                                                            "of the limit")) + "</tr>"
    body = []
    for group in ranks.groups():
        p = ranks[group[0]]
        limit = limit_bytes(p)
        verdict = "yes" if p.fits else ("OOM, first" if first in group else "OOM")
        bold = ' style="font-weight:600"' if shown in group else ""
        share = f"{100 * p.peak_reserved_bytes / limit:.1f}%" if limit else ""
        cells = (rank_span(group).removeprefix("ranks ").removeprefix("rank "), verdict,
                 exact_bytes(p.peak_allocated_bytes), exact_bytes(p.peak_reserved_bytes), share)
        body.append(f"<tr{bold}>" + "".join(f"<td{pad}>{escape(c)}</td>" for c in cells) + "</tr>")
    groups = len(body)
    words = "every rank the same" if groups == 1 else f"{groups} different results"
    return (f"<b>each rank's allocator</b> <small>({ranks.world_size} ranks, {words}; ranks that agree share a row)"
            "</small>" + _table("memviz-fit-ranks", head, body))


def outside_html(p: Any) -> str:
    """What a rank's process holds outside the caching allocator (the CUDA context, NCCL's buffers): an estimate,
    labelled with its basis, never added to the allocator's peaks; and, when the estimate beside the rank's peak
    reserved is more than the GPU, a warning that the prediction's "fits" leaves NCCL no room."""
    out = p.outside
    text = (f"<b>outside the allocator, per rank</b> (an estimate, not in the peaks above): CUDA context "
            f"{escape(format_bytes(out.context_bytes))} + NCCL {escape(format_bytes(out.nccl_bytes))} = "
            f"{escape(format_bytes(out.total_bytes))}. <small>{escape(out.basis)}</small>")  # fmt: skip
    total = p.device.total_memory_bytes
    if p.peak_reserved_bytes + out.total_bytes > total:
        text += (f"<br><b style='color:#c62828'>tight</b>: peak reserved "
                 f"{escape(format_bytes(p.peak_reserved_bytes))} + this estimate is more than the GPU's "
                 f"{escape(format_bytes(total))}: NCCL's buffers may not fit beside this rank's peak")  # fmt: skip
    return f'<div class="memviz-fit-outside" style="font-size:12px;margin:4px 0">{text}</div>'


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
