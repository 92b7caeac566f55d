"""The segment map: every segment of the cache as a row, its blocks as bars coloured by state.

Five states, the things a learner must tell apart:

- **live tensor** (``active_allocated``): memory in use;
- **free, stuck**: a free block in a segment that still holds a live tensor; the allocator can reuse it
  for a request that fits, but ``empty_cache()`` cannot give it back to the driver;
- **free, releasable**: a segment that is one whole free block, or, in an expandable segment, the whole
  free pages: exactly what ``empty_cache()`` would release (the same rule as
  :func:`memviz.fragmentation.fragmentation`, so the green bars add up to its ``releasable_bytes``);
- **freed, waiting for another stream** (``active_pending_free``): a tensor freed after ``record_stream``,
  whose block stays taken until the streams it was used on are done;
- **free, held by a private pool**: a free block of a CUDA graph's or a ``MemPool``'s pool that something
  still holds; ``empty_cache()`` leaves the pool alone, and only allocations into that pool can reuse it.

Rows are grouped by (pool, stream), each group in address order; when the cache has more than one group,
each row's label starts with its place (``"stream side"``, ``"graph pool g1 · stream capture"``, ...), as
:meth:`memviz.lab.Lab.place_of` names it: a side stream's cached segments serve only that stream.

Drawn as one trace per state, never one shape per block: each block is a thick horizontal line from its
offset to its end (x in MiB) on its segment's row, a state's blocks are one line trace (NaN between
blocks), plus one trace of thin white edges between blocks. Up to ``SVG_MAX_BLOCKS`` blocks the traces are
SVG (``go.Scatter``), above it WebGL (``go.Scattergl``). SVG lines with gaps make one path per block: in
headless Chromium 10,000 blocks took about 1.9 s to draw (as ``go.Bar``, 1.5 s), while WebGL draws a trace
in one call (a 10,500-block click: 0.3-0.37 s to drawn). A small map is as fast in SVG (dashboard click to
drawn, paired medians: 74 vs 71 ms with 3 blocks; 93 vs 79 ms with 300) and stays sharp on any screen,
where the WebGL canvases are drawn at one pixel per CSS pixel (see :mod:`memviz.widgets.figure`). The
hover (at a block's ends) shows the tensor's name and the exact size, requested size and address. The
figure holds both sets of traces and shows one (the hidden set costs a redraw nothing measurable: 59.7 vs
59.4 ms); crossing ``SVG_MAX_BLOCKS`` swaps them in the same update, so an update is always one
``Plotly.update`` message.

Runtime complexity: O(blocks) per refresh.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memviz.sim.constants import LARGE_BUFFER as LARGE_PAGE_BYTES  # the default large page
from memviz.sim.constants import SMALL_BUFFER as SMALL_PAGE_BYTES
from memviz.units import format_bytes
from memviz.widgets._common import FIXED_AXIS, TEMPLATE, MiB, Piece, legend, line_swatch, mib
from memviz.widgets.figure import Figure

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = ["CATEGORIES", "SegmentMap", "StateMap", "segment_bars"]

CATEGORIES = (  # (key, legend name, colour)
    ("live", "live tensor", "#1f77b4"),
    ("stuck", "free, stuck beside live tensors", "#ff7f0e"),
    ("releasable", "free, releasable by empty_cache()", "#2ca02c"),
    ("pending", "freed, waiting for another stream", "#9467bd"),
    ("held", "free, held by a private pool", "#7f7f7f"),
)
LIVE_STATES = ("active_allocated",)
PENDING_STATES = ("active_pending_free",)
DEFAULT_PLACE = "default stream"
MIN_LABELLED_ROW_PX = 14  # rows thinner than this get plain row numbers on the y axis, not one label each
TRACE_NAMES = (*(label for _, label, _ in CATEGORIES), "block edges")
SVG_MAX_BLOCKS = 500  # up to this many blocks the map is SVG, above it WebGL (see the module docstring)


def _whole_pages(offset: int, size: int, page: int) -> tuple[int, int]:
    """``(start, end)`` of the pages lying entirely inside ``[offset, offset + size)`` (pages aligned at 0)."""
    first = -(-offset // page) * page
    last = (offset + size) // page * page
    return (first, last) if last > first else (0, 0)


def _private(segment: Mapping) -> bool:
    return tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0)


def row_order(segments: list[Mapping]) -> list[Mapping]:
    """The map's rows: grouped by (pool id, stream), the device's own pools and the default stream first, each
    group in address order."""
    return sorted(segments, key=lambda s: (tuple(s.get("segment_pool_id", (0, 0))), s.get("stream", 0), s["address"]))


def segment_bars(segments: list[Mapping], names: Mapping[int, str] | None = None,
                 held: Callable[[tuple[int, int]], bool] | None = None) -> dict[str, dict[str, list]]:
    """The bars of the map, per category of ``CATEGORIES``: ``{"live": {"row", "offset", "size", "requested",
    "address", "name"}, "stuck": {...}, ...}``, every value a list (bytes exact, ints).

    Args:
        segments: ``snapshot()["segments"]``, drawn in :func:`row_order` (row 0 at the top).
        names: block address -> tensor name, for the hover.
        held: whether a private pool's id is still held (its free blocks are then "held", not stuck or
            releasable); default: every private pool is (a snapshot does not say what holds its pools).
    """
    names = names or {}
    held = held or _private_pool_held
    out: dict[str, dict[str, list]] = {
        key: {"row": [], "offset": [], "size": [], "requested": [], "address": [], "name": []}
        for key, _, _ in CATEGORIES
    }

    def add(key: str, row: int, offset: int, size: int, requested: int, address: int, name: str) -> None:
        bars = out[key]
        bars["row"].append(row)
        bars["offset"].append(offset)
        bars["size"].append(size)
        bars["requested"].append(requested)
        bars["address"].append(address)
        bars["name"].append(name)

    for row, seg in enumerate(row_order(segments)):
        blocks = seg["blocks"]
        in_held_pool = _private(seg) and held(tuple(seg["segment_pool_id"]))
        expandable = seg.get("is_expandable", False)
        page = SMALL_PAGE_BYTES if seg.get("segment_type") == "small" else LARGE_PAGE_BYTES
        whole = len(blocks) == 1
        offset = 0
        seg_address = seg["address"]
        for block in blocks:
            size = block["size"]
            address = block.get("address", seg_address + offset)
            if block["state"] in LIVE_STATES or block["state"] in PENDING_STATES:
                add("live" if block["state"] in LIVE_STATES else "pending", row, offset, size,
                    block.get("requested_size", size), address, names.get(address, "(not a lab tensor)"))
            elif in_held_pool:
                add("held", row, offset, size, 0, address, "")
            elif expandable:
                first, last = _whole_pages(offset, size, page)
                if last <= first:
                    add("stuck", row, offset, size, 0, address, "")
                else:  # the free block's whole pages are releasable, its ragged ends are not
                    for start, end, key in ((offset, first, "stuck"), (first, last, "releasable"),
                                            (last, offset + size, "stuck")):  # fmt: skip
                        if end > start:
                            add(key, row, start, end - start, 0, seg_address + start, "")
            else:
                add("releasable" if whole else "stuck", row, offset, size, 0, address, "")
            offset += size
    return out


class StateMap:
    """The map of any segments list (a lab's, or a snapshot's state at an event): see the module docstring.

    ``widget`` shows ``fig`` above ``legend`` (static HTML). ``traces`` are the four traces drawn now
    (``fig.data[0:4]`` in SVG, ``fig.data[4:8]`` in WebGL): ``traces[i]`` draws ``CATEGORIES[i]``, for each
    block the points ``(start, row), (end, row), NaN`` (x in MiB, exact) and the hover text of the block at
    both ends; ``traces[3]`` the block edges. ``bars`` holds the exact ints as drawn last (see
    :func:`segment_bars`). ``svg_max_blocks`` (default ``SVG_MAX_BLOCKS``) is where SVG gives way to WebGL.

    The figure's height grows with the segments, ``row_px`` a row, up to ``max_height`` px (default 440, so
    the axis and the legend stay in view): beyond that the rows get thinner, down to a line each. Its width
    follows the page. An empty cache shows "no segments" instead of a bare axis.

    Args:
        row_px: height of a row while the map is below ``max_height`` (default 22).
        max_height: the figure's height cap in px (default 440).
    """

    def __init__(self, *, row_px: int = 22, max_height: int = 440) -> None:
        self.row_px, self.max_height = row_px, max_height
        self.svg_max_blocks = SVG_MAX_BLOCKS
        self.fig = Figure(
            _traces(go.Scatter) + _traces(go.Scattergl, visible=False),
            layout={
                "height": 200, "autosize": True, "margin": {"l": 160, "r": 24, "t": 30, "b": 44},
                "title": {"text": "segments and blocks", "font": {"size": 13}},
                "xaxis": {"title": {"text": "offset in segment (MiB)"}, "rangemode": "tozero", "zeroline": False,
                          **FIXED_AXIS},
                "yaxis": {"autorange": "reversed", "title": {"text": ""}, "zeroline": False, "showgrid": False,
                          **FIXED_AXIS},
                "showlegend": False, "hovermode": "closest", "hoverdistance": -1,  # the legend is HTML, below
                "template": TEMPLATE,
            },
        )  # fmt: skip
        self.fig.add_class("memviz-segment-map")
        self.legend = legend([(label, line_swatch(color, 8)) for _, label, color in CATEGORIES])
        self.widget = W.VBox([self.fig, self.legend], layout=W.Layout(width="100%"))
        self.bars: dict[str, dict[str, list]] = {}
        self._drawn_key: object = None
        self._shown = 0  # index of the first trace drawn now: 0 (SVG) or len(TRACE_NAMES) (WebGL)

    @property
    def webgl(self) -> bool:
        """Whether the map is drawn with its WebGL traces now (more than ``svg_max_blocks`` blocks)."""
        return self._shown == len(TRACE_NAMES)

    @property
    def traces(self) -> tuple:
        """The traces drawn now: one per category in ``CATEGORIES`` order, then the block edges."""
        return self.fig.data[self._shown : self._shown + len(TRACE_NAMES)]

    def show(self, segments: list[Mapping], names: Mapping[int, str] | None = None,
             place: Callable[[Mapping], str] | None = None,
             held: Callable[[tuple[int, int]], bool] | None = None) -> None:
        """Draw ``segments`` (``_snapshot()["segments"]``-shaped) with ``names`` (block address -> label) in
        the hover; nothing is sent when nothing changed since the last draw.

        Args:
            place: a segment's place for its row label (:meth:`memviz.lab.Lab.place_of`); default: its stream
                and pool id, shown only when the cache has more than one (pool, stream).
            held: whether a private pool is still held (see :func:`segment_bars`).
        """
        names = names or {}
        place = place or _place
        places = tuple(place(s) for s in row_order(segments))
        pools = tuple(held(tuple(s["segment_pool_id"])) if held else True for s in segments if _private(s))
        key = (tuple((b["address"], b["size"], b["state"]) for s in segments for b in s["blocks"]), names, places,
               pools)  # fmt: skip
        if key == self._drawn_key:  # nothing moved (gc with nothing to collect, reset_peak, ...)
            return
        self._drawn_key = key
        self._draw(segments, names, places, held)

    def forget(self) -> None:
        """Redraw on the next :meth:`show` even if the segments look the same."""
        self._drawn_key = None

    def _draw(self, segments: list[Mapping], names: Mapping[int, str], places: tuple[str, ...],
              held: Callable[[tuple[int, int]], bool] | None) -> None:
        bars = segment_bars(segments, names, held)
        self.bars = bars
        webgl = sum(len(b["size"]) for b in bars.values()) > self.svg_max_blocks
        shown = len(TRACE_NAMES) if webgl else 0
        ordered = row_order(segments)
        n = len(ordered)
        grouped = len(set(places)) > 1 or any(p != DEFAULT_PLACE for p in places)
        layout_y: dict = {"autorange": False, "title": {"text": ""}, "zeroline": False, "showgrid": False,
                          "visible": n > 0, **FIXED_AXIS}  # fmt: skip
        height = min(self.max_height, 110 + self.row_px * max(n, 2))
        row_px = (height - 74) / max(n, 1)  # plot area over rows
        if row_px >= MIN_LABELLED_ROW_PX:
            exp = {True: " (exp.)", False: ""}
            labels = [f"{s['segment_type']} {format_bytes(s['total_size'])}{exp[bool(s.get('is_expandable'))]}"
                      for s in ordered]  # fmt: skip
            if grouped:  # which (pool, stream) each row is: a side stream's segments serve that stream alone
                labels = [f"{where} · {label}" for where, label in zip(places, labels, strict=True)]
            layout_y.update(tickmode="array", tickvals=list(range(n)), ticktext=labels, range=[max(n, 1) - 0.5, -0.5])
        else:
            layout_y.update(tickmode="auto", tickvals=None, ticktext=None, title={"text": "segment #"},
                            range=[n - 0.5, -0.5])  # fmt: skip
        width = max(1.0, min(18.0, 0.8 * row_px))
        edges_x: list = []
        edges_y: list = []
        half = 0.45
        gap = math.nan  # a NaN point breaks the line between two blocks (connectgaps=False)
        restyle: dict[str, list] = {"x": [], "y": [], "hovertext": [], "line.width": []}
        for cat, _, _ in CATEGORIES:
            b = bars[cat]
            xs: list = []
            ys: list = []
            texts: list = []
            for row, off, size, req, addr, name in zip(b["row"], b["offset"], b["size"], b["requested"],
                                                       b["address"], b["name"], strict=True):  # fmt: skip
                start, end = mib(off), mib(off + size)
                xs += (start, end, gap)
                ys += (row, row, gap)
                text = _hover(cat, name, size, req, addr, off)
                texts += (text, text, None)
                edges_x += (start, start, gap)
                edges_y += (row - half, row + half, gap)
            for k, v in (("x", _floats(xs)), ("y", _floats(ys)), ("hovertext", np.array(texts, dtype=object)),
                         ("line.width", width)):  # fmt: skip
                restyle[k].append(v)
        for k, v in (("x", _floats(edges_x)), ("y", _floats(edges_y)), ("hovertext", None), ("line.width", 1)):
            restyle[k].append(v)
        indexes = list(range(shown, shown + len(TRACE_NAMES)))
        if shown != self._shown:  # switch sets in the same update: show the new one, empty and hide the old
            restyle["visible"] = [True] * len(TRACE_NAMES) + [False] * len(TRACE_NAMES)
            for k, v in (("x", _floats([])), ("y", _floats([])), ("hovertext", None), ("line.width", None)):
                restyle[k] += [v] * len(TRACE_NAMES)
            indexes += range(self._shown, self._shown + len(TRACE_NAMES))
            self._shown = shown
        title = f"{n} segments, {sum(len(s['blocks']) for s in segments):,} blocks" if n else "segments and blocks"
        empty = [{"text": "no segments: the cache is empty (reserved 0 B)", "showarrow": False, "xref": "paper",
                  "yref": "paper", "x": 0.5, "y": 0.5, "font": {"size": 13, "color": "#666"}}]  # fmt: skip
        # One Plotly.update for data and layout. plotly_update skips the per-element validation that trace
        # property setters (and batch_update) run: 40,000 points cost 0.2 s there, a few ms here.
        relayout: dict = {"yaxis": layout_y, "title.text": title, "xaxis.visible": n > 0}
        if height != self.fig.layout.height:  # a new height re-lays the whole figure out: only when it changes
            relayout["height"] = height
        margin = _left_margin(layout_y.get("ticktext"))
        if margin != self.fig.layout.margin.l:
            relayout["margin.l"] = margin
        self.fig.plotly_update(restyle_data=restyle, relayout_data=relayout, trace_indexes=indexes)
        if bool(self.fig.layout.annotations) != (n == 0):  # the cache became empty, or stopped being empty
            self.fig.layout.annotations = () if n else empty

    def drawn_bytes(self, category: str) -> int:
        """Bytes the figure draws for ``category`` (sum of its lines' lengths, back in bytes)."""
        trace = self.traces[[c for c, _, _ in CATEGORIES].index(category)]
        xs = () if trace.x is None else trace.x
        return round(sum((xs[i + 1] - xs[i]) * MiB for i in range(0, len(xs), 3)))


class SegmentMap(Piece):
    """The lab's segment map, live: a :class:`StateMap` (``map``) drawing ``lab.segments()`` with the lab's
    tensor names in the hover. ``widget``, ``fig``, ``legend``, ``traces``, ``bars``, ``webgl`` and
    ``drawn_bytes`` are the map's (see :class:`StateMap`)."""

    needs_segments = True

    def __init__(self, lab: Lab, *, row_px: int = 22, max_height: int = 440) -> None:
        super().__init__(lab)
        self.map = StateMap(row_px=row_px, max_height=max_height)
        self.widget, self.fig, self.legend = self.map.widget, self.map.fig, self.map.legend
        self.refresh()

    @property
    def svg_max_blocks(self) -> int:
        return self.map.svg_max_blocks

    @svg_max_blocks.setter
    def svg_max_blocks(self, value: int) -> None:
        self.map.svg_max_blocks = value

    @property
    def webgl(self) -> bool:
        return self.map.webgl

    @property
    def traces(self) -> tuple:
        return self.map.traces

    @property
    def bars(self) -> dict[str, dict[str, list]]:
        return self.map.bars

    def drawn_bytes(self, category: str) -> int:
        return self.map.drawn_bytes(category)

    def tensor_names(self) -> dict[int, str]:
        """Block address -> name, for the lab's tensors (``data_ptr()`` is the block's address)."""
        names = {}
        for name, entry in self.lab.tensors.items():
            try:
                names[entry.tensor.data_ptr()] = name
            except (AttributeError, RuntimeError):  # not a tensor with a device pointer
                continue
        return names

    def _forget(self) -> None:
        self.map.forget()

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        self.map.show(segments or [], self.tensor_names(), self.lab.place_of, self.lab.pool_is_held)


def _private_pool_held(pool_id: tuple[int, int]) -> bool:
    return True


def _place(segment: Mapping) -> str:
    """A segment's place without a lab to name it: its stream and private pool id."""
    stream, pool_id = segment.get("stream", 0), tuple(segment.get("segment_pool_id", (0, 0)))
    where = "default stream" if not stream else f"stream {stream:#x}"
    return where if pool_id == (0, 0) else f"pool {pool_id} · {where}"


def _left_margin(labels: list[str] | None) -> int:
    """Room for the row labels in px: 160 as before for plain ones, more (up to 420) for labels with a place."""
    longest = max(map(len, labels), default=0) if labels else 0
    return max(160, min(420, 20 + 7 * longest))


def _traces(kind: type, visible: bool = True) -> list:
    """The map's four traces, as ``go.Scatter`` (SVG) or ``go.Scattergl`` (WebGL): one per category, then
    the block edges."""
    return [
        kind(name=label, mode="lines", line={"color": color, "width": 16}, hoverinfo="text",
             hoverlabel={"bgcolor": color}, connectgaps=False, visible=visible)
        for _, label, color in CATEGORIES
    ] + [kind(name="block edges", mode="lines", line={"color": "white", "width": 1}, hoverinfo="skip",
              visible=visible)]  # fmt: skip


def _floats(values: list) -> np.ndarray:
    """As a float64 array: plotly compares arrays in C (lists element by element in Python) and sends them
    to the browser as binary buffers."""
    return np.asarray(values, dtype=float)


_HOVER_WHAT = {"stuck": "free", "releasable": "free, releasable", "held": "free, held by its pool"}


def _hover(category: str, name: str, size: int, requested: int, address: int, offset: int) -> str:
    what = _HOVER_WHAT.get(category, name)
    if category == "pending":
        what = f"{name}: freed, waiting for another stream"
    text = f"<b>{what}</b><br>block {size:,} B ({format_bytes(size)})"
    if category in ("live", "pending"):
        text += f"<br>requested {requested:,} B"
    return text + f"<br>address {address:#x}, offset {offset:,} B"
