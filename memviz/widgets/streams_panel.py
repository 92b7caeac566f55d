"""The dashboard's streams-and-pools panel: where the next allocation goes (a stream, a private pool), and the
buttons of :mod:`memviz.lab_streams` — new stream, ``record_stream``, queue work, synchronize, new / release pool,
begin / end capture, replay, delete graph.

Shown by ``dashboard(lab, streams=True)`` (and ``Controls(lab, streams=True)``). Every button is one lab call,
through the controls' one path (the lab action, the redraw, the status line); a bad pick (an unknown name, a
released pool, a synchronize during a capture) shows the lab's message and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import ipywidgets as W

from memviz.widgets._common import button as _button
from memviz.widgets._common import wrap_row as _row

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["NO_POOL", "StreamsPanel"]

NO_POOL = "(device's own)"
QUEUED_WORK_S = 30.0  # how long "queue work" keeps the picked stream busy


class StreamsPanel:
    """Fields ``stream`` (the stream to allocate on, or record on), ``pool`` (the pool to allocate into, or to
    capture into: a ``MemPool`` or a graph's), ``graph`` (for replay / delete), ``new_name`` (for new stream,
    new pool, begin capture) and the ``buttons`` by label (:attr:`ACTIONS`).

    ``record_stream`` acts on the tensor picked in the controls' free picker, which the controls pass in.
    """

    ACTIONS: ClassVar[dict[str, str]] = {  # label -> tooltip
        "new stream": "torch.cuda.Stream(): a side stream named as the name field says",
        "record_stream": "tensor.record_stream(stream): its free waits for the picked stream's work",
        "queue work": f"keep the picked stream busy for {QUEUED_WORK_S:g} s (a sleep kernel on a GPU)",
        "synchronize": "torch.cuda.synchronize(): wait for every stream's work",
        "new pool": "torch.cuda.MemPool(), named as the name field says",
        "release pool": "del the picked MemPool (releasePool, then emptyCache of its id)",
        "begin capture": "enter torch.cuda.graph(g, pool=the picked pool): allocations go to the graph's pool",
        "end capture": "leave the torch.cuda.graph block",
        "replay": "graph.replay(): allocates nothing",
        "delete graph": "del the picked graph: it lets go of its pool",
    }

    def __init__(self) -> None:
        self.stream = W.Dropdown(options=["default"], value="default", description="stream",
                                 layout=W.Layout(width="190px"))
        self.pool = W.Dropdown(options=[NO_POOL], value=NO_POOL, description="pool", layout=W.Layout(width="230px"))
        self.graph = W.Dropdown(options=[], description="graph", layout=W.Layout(width="170px"))
        self.new_name = W.Text(value="", description="new", placeholder="side, p, g1 ...",
                               layout=W.Layout(width="170px"))
        for widget, cls in ((self.stream, "memviz-stream"), (self.pool, "memviz-pool"), (self.graph, "memviz-graph"),
                            (self.new_name, "memviz-new-name")):  # fmt: skip
            widget.add_class(cls)
        self.buttons = {label: _button(label, tip) for label, tip in self.ACTIONS.items()}
        b = self.buttons
        self.widget = W.VBox([
            _row([self.stream, self.pool, self.new_name, b["new stream"], b["new pool"], b["release pool"]]),
            _row([b["record_stream"], b["queue work"], b["synchronize"], self.graph, b["begin capture"],
                  b["end capture"], b["replay"], b["delete graph"]]),
        ])  # fmt: skip
        self.widget.add_class("memviz-streams")

    # -- what the fields say ----------------------------------------------------------------------------

    def placement(self, lab: Lab) -> dict[str, str | None]:
        """``allocate``'s ``stream`` and ``pool`` as the fields say (during a capture: none, the capture's)."""
        if lab.capturing is not None:
            return {"stream": None, "pool": None}
        pool = self.pool.value
        return {"stream": self.stream.value, "pool": None if pool in (None, NO_POOL) else pool}

    def runs(self, lab: Callable[[], Lab], picked_tensor: Callable[[], str | None]) -> dict[str, Callable[[], Event]]:
        """Each button's lab call; ``lab`` returns the lab shown now, ``picked_tensor`` the free picker's pick."""
        def name() -> str:
            return self.new_name.value.strip()

        def pool_or_none() -> str | None:
            return None if self.pool.value in (None, NO_POOL) else self.pool.value

        def record() -> Event:
            tensor = picked_tensor()
            if not tensor:
                raise ValueError("record_stream: pick a tensor in the tensor picker first")
            return lab().record_stream(tensor, self.stream.value)

        def graph() -> str:
            if not self.graph.value:
                raise ValueError("no graph picked: begin and end a capture first")
            return self.graph.value

        return {
            "new stream": lambda: lab().new_stream(name()),
            "record_stream": record,
            "queue work": lambda: lab().queue_work(self.stream.value, QUEUED_WORK_S),
            "synchronize": lambda: lab().synchronize(),
            "new pool": lambda: lab().new_pool(name()),
            "release pool": lambda: lab().release_pool(self.pool.value),
            "begin capture": lambda: lab().begin_capture(name(), pool_or_none()),
            "end capture": lambda: lab().end_capture(),
            "replay": lambda: lab().replay(graph()),
            "delete graph": lambda: lab().delete_graph(graph()),
        }

    # -- showing a lab ------------------------------------------------------------------------------------

    def show(self, lab: Lab) -> None:
        """Offer ``lab``'s streams, live pools and live graphs, keeping each pick while it exists."""
        streams = [n for n in lab.streams if n != "capture"]
        pools = [NO_POOL] + [n for n, p in lab.pools.items() if p.held]
        graphs = [n for n, g in lab.graphs.items() if g.alive]
        for field, options in ((self.stream, streams), (self.pool, pools), (self.graph, graphs)):
            if list(field.options) != options:
                keep = field.value
                field.options = options
                field.value = keep if keep in options else (options[-1] if field is self.graph and options
                                                            else options[0] if options else None)  # fmt: skip
        capturing = lab.capturing is not None
        self.buttons["end capture"].disabled = not capturing
        self.buttons["begin capture"].disabled = capturing

