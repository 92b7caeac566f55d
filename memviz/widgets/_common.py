"""What every widget piece shares: exact byte text, guarded callbacks, and the refresh protocol."""

from __future__ import annotations

import html
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from memviz.errors import MemvizError
from memviz.sim.constants import MiB  # figure axes are in MiB: dividing by a power of two is exact in float64
from memviz.units import format_bytes

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = [
    "FIXED_AXIS", "TEMPLATE", "MiB", "Piece", "button", "close_tree", "exact_bytes", "guarded", "legend",
    "line_swatch", "marker_swatch", "mib", "wrap_row",
]  # fmt: skip

USER_ERRORS = (MemvizError, ValueError, KeyError, TypeError)  # bad input (memviz.errors and the lab's messages);
# a RuntimeError is a bug or a failure of torch itself, so it shows its traceback


FIXED_AXIS = {"automargin": False, "ticklabeloverflow": "allow", "tickangle": 0}
"""Axis settings for figures redrawn on every click: fixed margins and horizontal tick labels, so plotly.js
skips its auto-margin, tick-label-overflow and tick-angle passes (each measures every label in the DOM)."""

_GRID = {"gridcolor": "#EBF0F8", "linecolor": "#EBF0F8", "ticks": "", "zerolinecolor": "#EBF0F8", "zerolinewidth": 2}
TEMPLATE = {
    "layout": {
        "font": {"color": "#2a3f5f"}, "paper_bgcolor": "white", "plot_bgcolor": "white",
        "hoverlabel": {"align": "left"}, "title": {"x": 0.05}, "xaxis": _GRID, "yaxis": _GRID,
    }
}  # fmt: skip
"""The look of plotly's ``plotly_white`` for our figures, without what costs on every redraw: its axis-title
``standoff`` (plotly.js then measures every tick label to place the title) and ``automargin``, and its
defaults for two dozen trace types we do not draw (plotly.js applies the template on each update)."""


def legend(entries: list[tuple[str, str]]) -> W.HTML:
    """A static legend under a figure: ``entries`` of ``(label, swatch)``, a swatch being a :func:`line_swatch`
    or :func:`marker_swatch`.

    Plotly's own legend is redrawn, and its text measured in the DOM, on every update: about 4 ms a figure
    per click in Chromium. The legend never changes, so it is plain HTML, drawn once.
    """
    items = "".join(
        f'<span class="memviz-legend-item" style="margin-right:14px;white-space:nowrap">{swatch} {escape(label)}</span>'
        for label, swatch in entries
    )
    widget = W.HTML(f'<div style="font-size:12px;text-align:center;line-height:20px">{items}</div>')
    widget.add_class("memviz-legend")
    return widget


def line_swatch(color: str, width: float = 2, dash: str = "solid") -> str:
    """An inline SVG line, like a plotly line trace's legend symbol (``dash``: ``"solid"`` or ``"dot"``)."""
    pattern = ' stroke-dasharray="2,3"' if dash == "dot" else ""
    return (f'<svg width="26" height="10" style="vertical-align:middle"><line x1="1" y1="5" x2="25" y2="5" '
            f'stroke="{color}" stroke-width="{width}"{pattern}/></svg>')  # fmt: skip


def marker_swatch(color: str, symbol: str) -> str:
    """A marker as a coloured character (``symbol``: one of ``MARKER_CHARS``)."""
    return f'<span style="color:{color};font-size:13px">{MARKER_CHARS[symbol]}</span>'


MARKER_CHARS = {"triangle-down": "▼", "diamond": "◆", "x": "✕"}


def exact_bytes(nbytes: int) -> str:
    """``"512.00 MiB (536,870,912 B)"``: readable and exact, the text the browser test compares."""
    return f"{format_bytes(nbytes)} ({nbytes:,} B)"


def mib(nbytes: int) -> float:
    """Bytes as MiB for a plot axis (exact: ``mib(n) * 2**20 == n``)."""
    return nbytes / MiB


def error_text(error: BaseException) -> str:
    """The message of ``error`` without ``KeyError``'s extra quotes."""
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    return str(error) or type(error).__name__


def guarded(out: W.Output, on_error: Callable[[str], None] | None = None) -> Callable:
    """Wrap a widget callback so nothing raises out of it.

    Bad input (:class:`~memviz.errors.MemvizError`, ``ValueError``, ``KeyError``, ``TypeError``) goes to
    ``on_error`` as one line. Anything else is a bug: its traceback is printed into ``out`` so it shows in
    the notebook. The traceback is appended as text, not kept (``Output.capture`` would store it in
    ``sys.last_traceback``, whose frames could pin tensors, the very effect the lessons teach); appending
    to ``out.outputs`` also works outside a kernel, so tests see it.
    """

    def wrap(fn: Callable) -> Callable:
        def callback(*args: Any) -> Any:
            try:
                return fn(*args)
            except USER_ERRORS as error:
                if on_error is None:
                    out.append_stderr(f"{type(error).__name__}: {error_text(error)}\n")
                else:
                    on_error(error_text(error))
            except Exception:
                out.append_stderr(traceback.format_exc())
            return None

        callback.__name__ = getattr(fn, "__name__", "callback")
        callback.__wrapped__ = fn  # type: ignore[attr-defined]
        return callback

    return wrap


def wrap_row(children: list[W.Widget]) -> W.HBox:
    """A row of fields and buttons that wraps onto a second line when the page is narrow."""
    return W.HBox(children, layout=W.Layout(flex_flow="row wrap", align_items="center"))


def button(label: str, tip: str) -> W.Button:
    """A control's button: as wide as its label, with ``tip`` as its tooltip."""
    widget = W.Button(description=label, tooltip=tip, layout=W.Layout(width="auto", min_width="max-content"))
    widget.add_class("memviz-button")
    return widget


def close_tree(widget: W.Widget) -> None:
    """Close ``widget``, its children, and their layout/style models (ipywidgets keeps every open widget in a
    global registry, so one left open keeps its callbacks, and whatever they reference, alive)."""
    for child in getattr(widget, "children", ()):
        close_tree(child)
    for part in ("layout", "style"):
        sub = getattr(widget, part, None)
        if isinstance(sub, W.Widget):
            sub.close()
    widget.close()


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


class Piece:
    """A dashboard piece: owns one widget (``.widget``) and shows one ``Lab``.

    ``refresh(stats, segments)`` redraws from numbers the caller read once (the dashboard hands the same
    ``stats`` and ``segments`` to every piece); called with nothing, the piece reads what it needs itself.
    A piece displays itself in a notebook (``_repr_mimebundle_``), so ``SegmentMap(lab)`` alone works in a
    lesson. ``watch()`` makes it refresh after every cell, like the dashboard.
    """

    needs_segments = False
    widget: W.Widget

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self._hook = None
        self._seen_events = -1

    def refresh(self, stats: Mapping[str, int] | None = None, segments: list[dict] | None = None) -> None:
        """Redraw. ``stats``: ``lab.stats()`` (read here when None); ``segments``: ``lab.segments()`` (read
        here when None and the piece draws segments)."""
        if stats is None:
            stats = self.lab.stats()
        if segments is None and self.needs_segments:
            segments = self.lab.segments()
        self._seen_events = len(self.lab.events)
        self._draw(stats, segments)

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        raise NotImplementedError("The '_draw' method must be implemented.")

    def set_lab(self, lab: Lab, *, refresh: bool = True) -> None:
        """Show another lab (the dashboard's backend switch makes a fresh one): forget what was drawn of the
        old one, then redraw (``refresh=False``: the caller refreshes, as the dashboard does once for all)."""
        self.lab = lab
        self._seen_events = -1
        self._forget()
        if refresh:
            self.refresh()

    def _forget(self) -> None:
        """Drop what the piece keeps about its lab's past (a piece that caches something overrides this)."""

    def watch(self) -> Piece:
        """Refresh after every notebook cell (IPython ``post_run_cell``); ``close()`` stops it."""
        from memviz.widgets.live import CellHook

        if self._hook is None:
            self._hook = CellHook(self)
        return self

    def on_cell(self, execution_count: int | None) -> None:
        """After a notebook cell: log memory that plain code changed, and refresh if anything happened.

        Costs one ``memory_stats()`` read when nothing changed (``lab.observe``), and no second one when
        something did: the lab's last event holds the stats of now.
        """
        self.lab.observe(f"cell {execution_count}")
        if len(self.lab.events) != self._seen_events:
            self.refresh(self.lab.events[-1].stats_after)

    def close(self) -> None:
        """Stop watching cells and close the widget."""
        if self._hook is not None:
            self._hook.unregister()
            self._hook = None
        close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)
