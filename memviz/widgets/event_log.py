"""The event log (every lab action, newest first) and the OOM banner (a one-line summary, PyTorch's message
behind a disclosure, and the what-if explanation on demand)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import ipywidgets as W

from memviz.units import format_bytes
from memviz.widgets._common import Piece, escape, guarded

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["EventLog", "OOMBanner", "event_line", "short_detail"]

MAX_DETAIL_CHARS = 120
"""An event's detail longer than this is summarised (a list of names: the first two, then the count)."""
MAX_TOOLTIP_CHARS = 2000  # the full line in a log row's tooltip, cut here


def short_detail(event: Event, max_chars: int = MAX_DETAIL_CHARS) -> str:
    """``event.detail``, summarised when long: a list of names becomes its first two and the count
    (``"free chunk[0], chunk[2], … (408 tensors)"``); anything else is cut at ``max_chars`` with "…"."""
    detail = event.detail
    if len(detail) <= max_chars:
        return detail
    parts = detail.split(", ")
    if len(parts) > 3:
        count = len(event.names) or len(parts)
        what = "tensors" if event.names else "names"
        detail = f"{', '.join(parts[:2])}, … ({count:,} {what})"
    return detail if len(detail) <= max_chars else detail[: max_chars - 1] + "…"


def event_line(event: Event) -> str:
    """``str(event)`` with its detail summarised (:func:`short_detail`): one readable line, never thousands of
    px wide. The log, the timeline's hover and the banner show this."""
    line = str(event)
    short = short_detail(event)
    return line if short == event.detail else line.replace(event.detail, short, 1)


class EventLog(Piece):
    """The lab's events, newest first, one line each (:func:`event_line`: what, the size arithmetic, and the
    allocated/reserved change). Shows the last ``limit`` events; ``lines`` holds them as drawn. A line wider
    than the log is cut with "…"; its tooltip has the whole line."""

    def __init__(self, lab: Lab, *, limit: int = 200, height: str = "160px") -> None:
        super().__init__(lab)
        self.limit = limit
        self.widget = W.HTML(layout=W.Layout(max_height=height, overflow="auto", width="auto"))
        self.widget.add_class("memviz-event-log")
        self.lines: list[str] = []
        self._rows_of: Lab | None = None
        self._rows: dict[int, tuple[str, str]] = {}
        self.refresh()

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        events = self.lab.events[-self.limit :][::-1]
        if not events:
            self.lines = []
            self.widget.value = '<div class="memviz-event">no events yet</div>'
            return
        if self._rows_of is not self.lab:  # rows are cached per event: a click renders only the new one
            self._rows_of, self._rows = self.lab, {}
        rows = self._rows
        for event in events:
            if event.index not in rows:
                rows[event.index] = _row(event)
        if len(rows) > 2 * self.limit:
            for index in [i for i in rows if i < events[-1].index]:
                del rows[index]
        self.lines = [rows[e.index][0] for e in events]
        self.widget.value = (
            # width 0 / min-width 100%: the rows take the log's width, never their text's (so they cut with "…")
            '<div style="font-family:var(--jp-code-font-family,monospace);font-size:12px;line-height:1.45;'
            'width:0;min-width:100%">' + "".join(rows[e.index][1] for e in events) + "</div>"
        )

    def _forget(self) -> None:
        self._rows_of = None


def _row(event: Event) -> tuple[str, str]:
    """``(line, html)`` of one log row: the summarised line, shown; the whole line, in the tooltip."""
    line = event_line(event)
    cls = "memviz-event" + ("" if event.ok else " memviz-event-oom")
    style = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis;"
    style += "" if event.ok else "color:#d62728;font-weight:600;"
    tip = str(event)
    tip = tip if len(tip) <= MAX_TOOLTIP_CHARS else tip[: MAX_TOOLTIP_CHARS - 1] + "…"
    return line, f'<div class="{cls}" style="{style}" title="{escape(tip)}">{escape(line)}</div>'


_BANNER = "border:2px solid #d62728;background:#fdecea;padding:6px 10px;border-radius:4px;line-height:1.45"
_TEXT = "white-space:pre-wrap;word-break:normal;overflow-wrap:break-word;margin:4px 0;font-size:12px"


class OOMBanner(Piece):
    """A red banner after an allocation ran out of memory.

    First one line: what failed and how the cache stood (``summary``); then PyTorch's full message behind a
    disclosure (``<details>``); then the button ``explain_button`` ("why? replay under other configs"),
    which runs ``lab.explain_oom(event)`` (replays of the lab's ops in the simulator, so it costs time in the
    length of the history) only when clicked, once per OOM, and shows it in ``explanation_html``.

    It shows while the lab's latest action (``"observe"`` events aside) is the OOM, and hides after the next
    action. ``text`` is the plain text shown ("" when hidden): the summary, the message, and the
    explanation once asked for.
    """

    def __init__(self, lab: Lab, *, out: W.Output | None = None) -> None:
        super().__init__(lab)
        self.out = out if out is not None else W.Output()
        self.html = W.HTML()
        self.explain_button = W.Button(
            description="why? replay under other configs",
            tooltip="replay the lab's allocations in the simulator under other allocator configs",
            layout=W.Layout(width="max-content", margin="4px 0"),
        )
        self.explain_button.add_class("memviz-oom-explain")
        self.explain_button.on_click(guarded(self.out)(lambda _: self.explain()))
        self.explanation_html = W.HTML()
        self.widget = W.VBox([self.html, self.explain_button, self.explanation_html],
                             layout=W.Layout(display="none", width="100%"))  # fmt: skip
        self.widget.add_class("memviz-oom")
        self.text = ""
        self.summary = ""
        self.event: Event | None = None
        self._explained: dict[int, str] = {}
        self._drawn: tuple[Event, str | None] | None = None
        self.refresh()

    def _forget(self) -> None:
        self._explained.clear()
        self._drawn = None

    def _last_action(self) -> Event | None:
        for event in reversed(self.lab.events):
            if event.action != "observe":
                return event
        return None

    def explanation(self, event: Event) -> str:
        """``str(lab.explain_oom(event))``, computed once per event."""
        if event.index not in self._explained:
            try:
                self._explained[event.index] = str(self.lab.explain_oom(event))
            except Exception as error:  # the banner must still show the message
                self._explained[event.index] = f"(no explanation: {type(error).__name__}: {error})"
        return self._explained[event.index]

    def explain(self) -> str:
        """Explain the OOM shown now (the button's action); returns the explanation ("" when none shows)."""
        if self.event is None:
            return ""
        text = self.explanation(self.event)
        self.refresh()
        return text

    def summary_of(self, event: Event) -> str:
        """The banner's first line: the failed request, what the cache held, its largest free block, the limit."""
        oom = event.oom
        assert oom is not None
        f = oom.fragmentation
        backend = self.lab.backend
        limit = (f"cap {format_bytes(backend.cap_bytes)}" if backend.cap_bytes is not None
                 else f"device {format_bytes(backend.total_memory_bytes)}")  # fmt: skip
        return (f"Out of memory at event #{event.index}: {format_bytes(oom.request.nbytes)} requested; "
                f"{format_bytes(f.allocated_bytes)} in tensors, {format_bytes(f.free_bytes)} cached but free "
                f"(largest free block {format_bytes(f.largest_free_block_bytes)}), {limit}")  # fmt: skip

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        event = self._last_action()
        if event is None or event.oom is None:
            if self.event is not None:
                self.event, self.text, self.summary, self._drawn = None, "", "", None
                self.widget.layout.display = "none"
                self.html.value = self.explanation_html.value = ""
            return
        explanation = self._explained.get(event.index)
        if self._drawn is not None and self._drawn[0] is event and self._drawn[1] == explanation:
            return  # drawn as it is
        self._drawn = (event, explanation)
        self.event = event
        self.summary = self.summary_of(event)
        self.text = f"{self.summary}\n{event.oom.message}" + (f"\n{explanation}" if explanation else "")
        self.html.value = (
            f'<div style="{_BANNER}"><b class="memviz-oom-title">{escape(self.summary)}</b>'
            f'<div class="memviz-oom-detail" style="font-size:12px">{escape(event_line(event))}</div>'
            '<details class="memviz-oom-details"><summary style="cursor:pointer">PyTorch\'s message</summary>'
            f'<div class="memviz-oom-message" style="{_TEXT}">{escape(event.oom.message)}</div></details></div>'
        )
        self.explain_button.layout.display = "none" if explanation else None
        self.explanation_html.value = (
            f'<pre class="memviz-oom-explanation" style="{_TEXT};font-family:var(--jp-code-font-family,monospace)">'
            f"{escape(explanation)}</pre>"
            if explanation
            else ""
        )
        self.widget.layout.display = None
