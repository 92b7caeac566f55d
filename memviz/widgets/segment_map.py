"""The segment map: every segment of the cache as a row, its blocks as bars coloured by state.

Three states, the three things a learner must tell apart:

- **live tensor** (``active_allocated``, and ``active_pending_free``): memory in use;
- **free, stuck**: a free block in a segment that still holds a live tensor; the allocator can reuse it
  for a request that fits, but ``empty_cache()`` cannot give it back to the driver;
- **free, releasable**: a segment that is one whole free block, or, in an expandable segment, the whole
  free pages: exactly what ``empty_cache()`` would release (the same rule as
  :func:`memviz.fragmentation.fragmentation`, so the green bars add up to its ``releasable_bytes``).

Drawn as one ``go.Bar`` trace per state (``orientation="h"``, ``base`` = offset in the segment, ``x`` =
size, both in MiB), never as one shape per block: 10,000 blocks are three traces, and a redraw is one
``Plotly.update``. The hover shows the block's exact size, requested size, address and tensor name.

Runtime complexity: O(blocks) per refresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from memviz.fragmentation import LARGE_PAGE_BYTES, SMALL_PAGE_BYTES
from memviz.units import format_bytes
from memviz.widgets._common import Piece, mib

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = ["CATEGORIES", "SegmentMap", "segment_bars"]

CATEGORIES = (  # (key, legend name, colour)
    ("live", "live tensor", "#1f77b4"),
    ("stuck", "free, stuck beside live tensors", "#ff7f0e"),
    ("releasable", "free, releasable by empty_cache()", "#2ca02c"),
)
LIVE_STATES = ("active_allocated", "active_pending_free")
MAX_TICK_LABELS = 40  # above this many segments the y axis shows plain row numbers


def _whole_pages(offset: int, size: int, page: int) -> tuple[int, int]:
    """``(start, end)`` of the pages lying entirely inside ``[offset, offset + size)`` (pages aligned at 0)."""
    first = -(-offset // page) * page
    last = (offset + size) // page * page
    return (first, last) if last > first else (0, 0)


def segment_bars(segments: list[Mapping], names: Mapping[int, str] | None = None) -> dict[str, dict[str, list]]:
    """The bars of the map, per category: ``{"live": {"row", "offset", "size", "requested", "address",
    "name"}, "stuck": {...}, "releasable": {...}}``, every value a list (bytes exact, ints).

    Args:
        segments: ``snapshot()["segments"]``, drawn in address order (row 0 = lowest address).
        names: block address -> tensor name, for the hover.
    """
    names = names or {}
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

    for row, seg in enumerate(sorted(segments, key=lambda s: s["address"])):
        blocks = seg["blocks"]
        expandable = seg.get("is_expandable", False)
        page = SMALL_PAGE_BYTES if seg.get("segment_type") == "small" else LARGE_PAGE_BYTES
        whole = len(blocks) == 1
        offset = 0
        seg_address = seg["address"]
        for block in blocks:
            size = block["size"]
            address = block.get("address", seg_address + offset)
            if block["state"] in LIVE_STATES:
                add("live", row, offset, size, block.get("requested_size", size), address,
                    names.get(address, "(not a lab tensor)"))  # fmt: skip
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


class SegmentMap(Piece):
    """Every segment of the cache, its blocks coloured by state (see the module docstring).

    ``fig.data[i]`` is the ``go.Bar`` of ``CATEGORIES[i]``: ``y`` the segment's row, ``base`` and ``x`` the
    block's offset and size in MiB, ``customdata`` rows of exact ``[size, requested, address, offset]``
    bytes. ``bars`` holds the same numbers as ints, as drawn last.
    """

    needs_snapshot = True

    def __init__(self, lab: Lab, *, row_px: int = 22, max_height: int = 700) -> None:
        super().__init__(lab)
        self.row_px, self.max_height = row_px, max_height
        hover = ("<b>%{hovertext}</b><br>block %{customdata[0]:,} B, requested %{customdata[1]:,} B<br>"
                 "address 0x%{customdata[2]:x}, offset %{customdata[3]:,} B")  # fmt: skip
        traces = [
            go.Bar(name=label, orientation="h", marker={"color": color, "line": {"width": 0.5, "color": "white"}},
                   hovertemplate=hover + f"<extra>{label}</extra>", width=0.8)
            for _, label, color in CATEGORIES
        ]  # fmt: skip
        self.fig = go.FigureWidget(
            traces,
            layout={
                "barmode": "overlay", "height": 200, "margin": {"l": 150, "r": 10, "t": 30, "b": 40},
                "title": {"text": "segments and blocks", "font": {"size": 13}},
                "xaxis": {"title": {"text": "offset in segment (MiB)"}, "rangemode": "tozero"},
                "yaxis": {"autorange": "reversed", "title": {"text": ""}},
                "legend": {"orientation": "h", "y": -0.2}, "hovermode": "closest", "template": "plotly_white",
                "bargap": 0.1,
            },
        )  # fmt: skip
        self.fig.add_class("memviz-segment-map")
        self.widget = self.fig
        self.bars: dict[str, dict[str, list]] = {}
        self._drawn_key: object = None
        self.refresh()

    def tensor_names(self) -> dict[int, str]:
        """Block address -> name, for the lab's tensors (``data_ptr()`` is the block's address)."""
        names = {}
        for name, entry in self.lab.tensors.items():
            try:
                names[entry.tensor.data_ptr()] = name
            except (AttributeError, RuntimeError):  # not a tensor with a device pointer
                continue
        return names

    def _draw(self, stats: Mapping[str, int], snapshot: dict | None) -> None:
        segments = (snapshot or {}).get("segments", [])
        key = tuple((b["address"], b["size"], b["state"]) for s in segments for b in s["blocks"])
        key = (key, tuple(self.lab.tensors))
        if key == self._drawn_key:  # nothing moved (gc with nothing to collect, reset_peak, ...)
            return
        self._drawn_key = key
        bars = segment_bars(segments, self.tensor_names())
        self.bars = bars
        ordered = sorted(segments, key=lambda s: s["address"])
        n = len(ordered)
        layout_y: dict = {"autorange": "reversed", "title": {"text": ""}}
        if n <= MAX_TICK_LABELS:
            layout_y.update(tickmode="array", tickvals=list(range(n)),
                            ticktext=[f"{s['segment_type']} {format_bytes(s['total_size'])}"
                                      + (" (exp.)" if s.get("is_expandable") else "") for s in ordered])  # fmt: skip
        else:
            layout_y.update(tickmode="auto", tickvals=None, ticktext=None, title={"text": "segment #"})
        height = min(self.max_height, 110 + self.row_px * max(n, 2))
        with self.fig.batch_update():
            for trace, (cat, _, _) in zip(self.fig.data, CATEGORIES, strict=True):
                b = bars[cat]
                trace.y = b["row"]
                trace.x = [mib(s) for s in b["size"]]
                trace.base = [mib(o) for o in b["offset"]]
                trace.customdata = [list(t) for t in zip(b["size"], b["requested"], b["address"], b["offset"],
                                                         strict=True)]  # fmt: skip
                trace.hovertext = [nm or "free" for nm in b["name"]]
            self.fig.layout.yaxis = layout_y
            self.fig.layout.height = height
            self.fig.layout.title.text = (f"{n} segments, {sum(len(s['blocks']) for s in segments):,} blocks"
                                          if n else "no segments: the cache is empty")  # fmt: skip
