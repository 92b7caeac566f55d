"""The event log (every lab action, newest first) and the OOM banner (the allocator's message, explained)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import ipywidgets as W

from memviz.widgets._common import Piece, escape

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["EventLog", "OOMBanner"]


class EventLog(Piece):
    """The lab's events, newest first, one line each (``str(event)``: what, the size arithmetic, and the
    allocated/reserved change). Shows the last ``limit`` events; ``lines`` holds them as drawn."""

    def __init__(self, lab: Lab, *, limit: int = 200, height: str = "160px") -> None:
        super().__init__(lab)
        self.limit = limit
        self.widget = W.HTML(layout=W.Layout(max_height=height, overflow="auto", width="100%"))
        self.widget.add_class("memviz-event-log")
        self.lines: list[str] = []
        self.refresh()

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        events = self.lab.events[-self.limit :][::-1]
        self.lines = [str(e) for e in events]
        if not events:
            self.widget.value = '<div class="memviz-event">no events yet</div>'
            return
        rows = []
        for event, line in zip(events, self.lines, strict=True):
            cls = "memviz-event" + ("" if event.ok else " memviz-event-oom")
            style = "" if event.ok else ' style="color:#d62728;font-weight:600"'
            rows.append(f'<div class="{cls}"{style}>{escape(line)}</div>')
        self.widget.value = (
            '<div style="font-family:var(--jp-code-font-family,monospace);font-size:12px;line-height:1.45;'
            'white-space:pre">' + "".join(rows) + "</div>"
        )


class OOMBanner(Piece):
    """A red banner after an allocation ran out of memory: torch's message, then ``lab.explain_oom()``.

    It shows while the lab's latest action (``"observe"`` events aside) is the OOM, and hides after the next
    action. ``text`` is the plain text shown ("" when hidden). The explanation replays the lab's ops under
    other allocator configs in the simulator, once per OOM.
    """

    def __init__(self, lab: Lab) -> None:
        super().__init__(lab)
        self.widget = W.HTML(layout=W.Layout(display="none"))
        self.widget.add_class("memviz-oom")
        self.text = ""
        self._explained: dict[int, str] = {}
        self.refresh()

    def set_lab(self, lab: Lab) -> None:
        self._explained.clear()
        super().set_lab(lab)

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

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        event = self._last_action()
        if event is None or event.oom is None:
            if self.text:
                self.text = ""
                self.widget.layout.display = "none"
                self.widget.value = ""
            return
        explanation = self.explanation(event)
        self.text = f"Out of memory (event #{event.index})\n{event.oom.message}\n{explanation}"
        self.widget.value = (
            '<div style="border:2px solid #d62728;background:#fdecea;padding:6px 10px;border-radius:4px">'
            f'<b class="memviz-oom-title">Out of memory (event #{event.index}): {escape(event.detail)}</b>'
            '<pre class="memviz-oom-message" style="white-space:pre-wrap;margin:4px 0">'
            f"{escape(event.oom.message)}</pre>"
            '<pre class="memviz-oom-explanation" style="white-space:pre-wrap;margin:4px 0">'
            f"{escape(explanation)}</pre></div>"
        )
        self.widget.layout.display = None
