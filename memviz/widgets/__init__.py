"""Live widgets for the lab: gauges, timeline, segment map, controls, event log, and the dashboard of them all.

``memviz.widgets.dashboard(backend="sim", device="T4", cap="2 GiB")`` composes everything on one lab
(``streams=True`` adds the side-stream, ``record_stream``, ``MemPool`` and CUDA-graph controls; the segment map
groups its rows by pool and stream); each piece also works alone in a lesson (``SegmentMap(lab)``,
``MemoryGauges(lab)``, ``Timeline(lab)``): call ``.refresh()`` after changing the lab, or ``.watch()`` to
refresh after every cell. For a recorded run:
``SnapshotViewer("my_run.pickle")`` scrubs its events, ``WhatIfTable("my_run.pickle", configs)`` replays it
under other allocator configs, and ``RankViewer("DIR")`` shows a ``torchrun`` job's per-rank snapshots side by
side. ``fit_panel(train)`` predicts a program's memory as its arguments and the target GPU change
(:mod:`memviz.widgets.fit_panel`).
"""

from memviz.widgets.backend_panel import CONFIG_PRESETS
from memviz.widgets.controls import Controls
from memviz.widgets.dashboard import Dashboard, dashboard
from memviz.widgets.event_log import EventLog, OOMBanner
from memviz.widgets.fit_panel import FitPanel, fit_panel
from memviz.widgets.gauges import MemoryGauges
from memviz.widgets.live import CellHook
from memviz.widgets.rank_viewer import RankViewer
from memviz.widgets.segment_map import SegmentMap, StateMap, segment_bars
from memviz.widgets.snapshot_viewer import SnapshotViewer
from memviz.widgets.timeline import Timeline
from memviz.widgets.whatif_table import WhatIfTable, what_if_widget

__all__ = [
    "CONFIG_PRESETS",
    "CellHook",
    "Controls",
    "Dashboard",
    "EventLog",
    "FitPanel",
    "MemoryGauges",
    "OOMBanner",
    "RankViewer",
    "SegmentMap",
    "SnapshotViewer",
    "StateMap",
    "Timeline",
    "WhatIfTable",
    "dashboard",
    "fit_panel",
    "segment_bars",
    "what_if_widget",
]
