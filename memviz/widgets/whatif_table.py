"""What if: a recorded run's requests replayed under other allocator configs and devices, side by side.

``WhatIfTable(source, configs=("expandable_segments:True",), cap="6000 MiB")`` replays the recorded
``alloc``/``free`` sequence through :func:`memviz.snapshots.what_if` (the recorded config first, then each
config, on each device size) and shows one row per replay: peak reserved, peak allocated, OOMs and the
first OOM event, ``cudaMalloc``/``cudaFree`` counts, retries and the fragmentation at peak reserved; then the
fidelity sentence (does replaying under the recorded config reproduce the recording?) and a bar chart of
peak reserved per replay. A recording that cannot be replayed exactly (the fidelity check fails: e.g. a private
pool created and released before its only snapshot) gets no replay rows at all: the table shows the recording's
own peaks and the reason, with what would make it replayable. The words and numbers come from the reports
(:meth:`ReplayResult.cells`, :meth:`FidelityReport.describe`); the views only lay them out.
:meth:`WhatIfTable.table` is the same table as plain text, for notebooks whose saved output a test compares.

Making a ``WhatIfTable`` checks its arguments and runs nothing: the replays (:func:`replay_grid`) run once,
the first time a result, the table or the view is asked for. The views are small functions of the rows
(:mod:`memviz.widgets.whatif_views`): :func:`table_text`, :func:`table_html` and :func:`peaks_figure`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from memviz.devices import simulated_device
from memviz.sim.limits import check_bytes
from memviz.snapshots import (
    FidelityReport,
    ReplayResult,
    SnapshotError,
    SnapshotHistory,
    WhatIfReport,
    check_fidelity,
    what_if,
)  # fmt: skip
from memviz.snapshots.whatif import check_replayable, named_configs, recorded_peaks
from memviz.units import format_bytes, parse_size
from memviz.widgets._common import MiB, close_tree
from memviz.widgets.snapshot_viewer import history_of
from memviz.widgets.whatif_views import grid_cells, peaks_figure, table_html, table_text

__all__ = ["WhatIfGrid", "WhatIfRow", "WhatIfTable", "grid_cells", "peaks_figure", "replay_grid", "table_html",
           "table_text", "what_if_widget"]

AUTO_PROGRESS_REQUESTS = 100_000  # show a tqdm.auto bar over the replays from this many replayed requests


@dataclass(frozen=True)
class WhatIfRow:
    """One replay: a config on a device. ``result`` holds every number (bytes)."""

    config: str
    device: str
    result: ReplayResult


def _size_label(nbytes: int) -> str:
    """A cap as people write it: ``"6000 MiB"``, ``"12 GiB"``; other sizes as :func:`format_bytes` prints them."""
    if nbytes % (1 << 30) == 0:
        return f"{nbytes >> 30} GiB"
    if nbytes % MiB == 0:
        return f"{nbytes // MiB} MiB"
    return format_bytes(nbytes)


def _device_spec(device: Any, history: SnapshotHistory) -> tuple[int | None, str]:
    """``(device_total_bytes or None, label)`` from None (the recording's own device, as far as it tells:
    ``history.recorded_device``; "unlimited" when nothing bounds it), a preset name or a size."""
    if device is None:
        return None, history.recorded_device.label
    d = simulated_device(device)
    label = d.name.replace(" (simulated)", "").replace("Simulated GPU ", "")
    return d.total_memory_bytes, label


@dataclass(frozen=True)
class WhatIfGrid:
    """Every replay of a :class:`WhatIfTable`: ``rows`` in table order (none when the recording cannot be
    replayed exactly), one :class:`~memviz.snapshots.WhatIfReport` per device size, the fidelity check (or None),
    and the recording's own peaks (bytes)."""

    rows: list[WhatIfRow]
    reports: list[WhatIfReport]
    fidelity: FidelityReport | None
    recorded_peak_reserved_bytes: int
    recorded_peak_allocated_bytes: int

    @property
    def replayable(self) -> bool:
        """False when the fidelity check found the recording cannot be replayed exactly (then ``rows`` is empty)."""
        return self.fidelity is None or self.fidelity.replayable


def replay_grid(history: SnapshotHistory, configs: Mapping[str, str], devices: Sequence[tuple[int | None, str]], *,
                cap_bytes: int | None, check: bool, recorded: tuple[int | None, int | None],
                progress: bool | None) -> WhatIfGrid:  # fmt: skip
    """Replay ``history`` under the recorded config and each of ``configs`` on each of ``devices``
    (``(total bytes or None, label)``), capped at ``cap_bytes``, after the fidelity check on the device and cap
    the recording ran with (``recorded``; its replay serves as the recorded config's row on that device). When
    the check finds the recording cannot be replayed exactly, nothing else is replayed."""
    requests = len(history.events) + len(history.initial_blocks)
    if progress is None:
        progress = requests * (len(devices) * (1 + len(configs)) + check) >= AUTO_PROGRESS_REQUESTS
    fidelity = history.verdicts.get((*recorded, None))
    if check and fidelity is None:
        fidelity = check_fidelity(history, device_total_bytes=recorded[0], cap_bytes=recorded[1], progress=progress)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(devices), desc="what-if replays", unit="device", leave=False)
    reports: list[WhatIfReport] = []
    rows: list[WhatIfRow] = []
    for total, label in devices:
        if cap_bytes is not None:
            label = f"{label}, cap {_size_label(cap_bytes)}"
        report = what_if(history, configs, device_total_bytes=total, cap_bytes=cap_bytes,
                         recorded_device_total_bytes=recorded[0], recorded_cap_bytes=recorded[1], check=check,
                         progress=progress)  # fmt: skip
        reports.append(report)
        rows.extend(WhatIfRow(name, label, r) for name, r in report.results.items())
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return WhatIfGrid(rows, reports, fidelity if check or not reports[0].replayable else None,
                      *recorded_peaks(history))


class WhatIfTable:
    """Replay a recorded run under other allocator configs and device sizes; show the results side by side.

    Args:
        source: a snapshot (path, bytes, file, dict) or a :class:`~memviz.snapshots.SnapshotHistory`.
        configs: ``PYTORCH_CUDA_ALLOC_CONF`` strings, or a mapping name → string; the recorded config is
            always replayed first, as ``recorded`` (default: ``("expandable_segments:True",)``).
        device_sizes: simulated devices, each a preset name (``"T4"``), a size (``"24 GiB"``, bytes) or None
            for the recording's own (default: ``(None,)``): the size its expandable segments show, else a device
            with no limit of its own ("unlimited"; see :mod:`memviz.snapshots.device`).
        cap: cap every replay at this size (``"6000 MiB"``, bytes), as
            ``torch.cuda.set_per_process_memory_fraction(cap / device)`` does (default: None).
        check: run the fidelity check, i.e. replay under the recorded config and compare segment states with
            the recording (default: True).
        recorded_device, recorded_cap: the device and cap the recording ran with, for the fidelity check
            (default: None, no limit; give them when the recording itself ran out of memory).
        progress: ``tqdm.auto`` bars (default: None: from 100,000 replayed requests in all).

    Making one checks the arguments and runs nothing; the replays run once, on first use of ``grid`` (a
    :class:`WhatIfGrid`), ``rows`` (:class:`WhatIfRow` list, in table order), ``reports`` (one
    :class:`~memviz.snapshots.WhatIfReport` per device), ``fidelity`` (or None), :meth:`table`,
    :meth:`result`, ``html``, ``figure`` (bar chart of peak reserved) or ``widget`` (the ``VBox`` displayed).

    Raises:
        TypeError / SnapshotError: ``source`` is not a snapshot, or has no events to replay; ``configs`` is a
            single string (wrap it in a list) or holds something other than strings.
        ValueError: a bad device, cap or size (e.g. a cap above a device's memory).
    """

    def __init__(
        self,
        source: Any,
        configs: Mapping[str, str] | Iterable[str] = ("expandable_segments:True",),
        *,
        device_sizes: Sequence[Any] = (None,),
        cap: int | str | None = None,
        check: bool = True,
        recorded_device: int | str | None = None,
        recorded_cap: int | str | None = None,
        progress: bool | None = None,
    ) -> None:
        self.history: SnapshotHistory = check_replayable(history_of(source, progress=progress))
        self.configs = named_configs(configs)
        if isinstance(device_sizes, (str, int)):
            device_sizes = (device_sizes,)
        self.devices = [_device_spec(d, self.history) for d in device_sizes] or [_device_spec(None, self.history)]
        self.cap_bytes = parse_size(cap) if cap is not None else None
        for total, label in self.devices:  # the replays' own rule, checked now rather than at the first replay
            if self.cap_bytes is not None:
                check_bytes(self.cap_bytes, "cap_bytes", low=1, high=total or self.history.recorded_device.total_bytes,
                            why=f"a cap lies between 1 byte and the device's size ({label})")  # fmt: skip
        recorded_cap_bytes = parse_size(recorded_cap) if recorded_cap is not None else None
        self.recorded = (_device_spec(recorded_device, self.history)[0], recorded_cap_bytes)
        self.check, self.progress = check, progress

    @cached_property
    def grid(self) -> WhatIfGrid:
        """Every replay, run on first use (see :func:`replay_grid`)."""
        return replay_grid(self.history, self.configs, self.devices, cap_bytes=self.cap_bytes, check=self.check,
                           recorded=self.recorded, progress=self.progress)  # fmt: skip

    @property
    def rows(self) -> list[WhatIfRow]:
        return self.grid.rows

    @property
    def reports(self) -> list[WhatIfReport]:
        return self.grid.reports

    @property
    def fidelity(self) -> FidelityReport | None:
        return self.grid.fidelity

    @property
    def recorded_peak_reserved_bytes(self) -> int:
        return self.grid.recorded_peak_reserved_bytes

    @property
    def recorded_peak_allocated_bytes(self) -> int:
        return self.grid.recorded_peak_allocated_bytes

    def table(self) -> str:
        """The results as plain text (see :func:`table_text`)."""
        return table_text(self.grid)

    def __str__(self) -> str:
        return self.table()

    @cached_property
    def html(self) -> W.HTML:
        """The table as an ``HTML`` widget (see :func:`table_html`)."""
        return W.HTML(table_html(self.grid), layout=W.Layout(width="100%"))

    @cached_property
    def figure(self) -> go.FigureWidget:
        """Peak reserved per replay (see :func:`peaks_figure`)."""
        return peaks_figure(self.grid, self.cap_bytes)

    @cached_property
    def widget(self) -> W.VBox:
        """The table above the chart."""
        box = W.VBox([self.html, self.figure], layout=W.Layout(width="100%"))
        box.add_class("memviz-what-if")
        return box

    def result(self, config: str = "recorded", device: int = 0) -> ReplayResult:
        """The :class:`ReplayResult` of ``config`` on the ``device``-th device size (for the viewer's ``replay=``).

        Raises:
            SnapshotError: the recording cannot be replayed exactly (the message says why), so there is no replay.
        """
        report = self.reports[device]
        if not report.replayable:
            assert report.fidelity is not None
            raise SnapshotError(f"no what-if replay: the recording {report.fidelity.verdict.describe()}")
        return report.results[config]

    def close(self) -> None:
        """Close the table's widgets (those made so far)."""
        if "widget" in self.__dict__:
            close_tree(self.widget)
        for name in ("html", "figure"):
            if name in self.__dict__:
                close_tree(self.__dict__[name])

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)


def what_if_widget(
    source: Any,
    configs: Mapping[str, str] | Iterable[str] = ("expandable_segments:True",),
    *,
    device_sizes: Sequence[Any] = (None,),
    cap: int | str | None = None,
    **kwargs: Any,
) -> WhatIfTable:
    """Run the what-if replays and return the :class:`WhatIfTable` (it displays itself; ``.table()`` is text)."""
    table = WhatIfTable(source, configs, device_sizes=device_sizes, cap=cap, **kwargs)
    table.grid  # noqa: B018 - run the replays now, as the name says
    return table
