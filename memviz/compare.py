"""One workload under several allocator configs (or several workloads), side by side, in the simulator.

Each run gets a fresh simulated :class:`~memviz.lab.Lab` on the same device and cap, so the rows differ
only in the allocator settings (or in the workload). ``PYTORCH_CUDA_ALLOC_CONF`` is read once when CUDA
starts, so a real GPU runs one config per process; the simulator can run them all in one notebook.

>>> def churn(lab):
...     lab.allocate("16 MiB", count=8, name="a"); lab.free("a"); lab.allocate("32 MiB", count=4, name="b")
>>> table = compare_configs(churn, configs=("", "expandable_segments:True"))
>>> [run.peak_reserved_bytes >> 20 for run in table]
[256, 140]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memviz.lab import Lab
from memviz.sim.presets import RECORDED_CONFIGS, WORKLOAD_CONFIGS
from memviz.tables import format_table
from memviz.units import format_bytes

__all__ = ["RECORDED_CONFIGS", "WORKLOAD_CONFIGS", "Comparison", "Run", "compare_configs"]


@dataclass(frozen=True)
class Run:
    """One workload run in a fresh simulated lab.

    Attributes:
        workload: the workload's label.
        alloc_conf: the allocator settings (``""`` for the defaults).
        lab: the lab after the run (for ``readout()``, ``segment_table()``, ``events``).
        result: what the workload function returned.
    """

    workload: str
    alloc_conf: str
    lab: Lab
    result: Any

    def _stat(self, key: str) -> int:
        return self.lab.stats().get(key, 0)

    @property
    def peak_requested_bytes(self) -> int:
        """``requested_bytes.all.peak``: the most the tensors asked for at once (the same work gives the same)."""
        return self._stat("requested_bytes.all.peak")

    @property
    def peak_reserved_bytes(self) -> int:
        """``reserved_bytes.all.peak``: the most the cache held from the driver at once."""
        return self._stat("reserved_bytes.all.peak")

    @property
    def ooms(self) -> int:
        """``num_ooms``: allocations that raised out-of-memory."""
        return self._stat("num_ooms")

    @property
    def device_allocs(self) -> int:
        """``num_device_alloc``: cudaMalloc calls (page-map calls under expandable segments)."""
        return self._stat("num_device_alloc")

    @property
    def device_frees(self) -> int:
        """``num_device_free``: cudaFree calls (page-unmap calls under expandable segments)."""
        return self._stat("num_device_free")

    @property
    def stranded_bytes(self) -> int:
        """Free bytes now that ``empty_cache()`` cannot release (they share a segment or page with a live tensor).

        For ordinary segments this equals ``inactive_split_bytes.all.current``; unlike that counter (which
        PyTorch does not keep for expandable segments) it is measured from the snapshot, so it counts
        expandable segments too.
        """
        return self.lab.fragmentation().stranded_bytes


class Comparison(Sequence[Run]):
    """The runs, in order; ``str()`` is a table, ``[alloc_conf]`` or ``[index]`` picks a run."""

    COLUMNS = ("peak\nrequested", "peak\nreserved", "OOMs", "cudaMalloc", "cudaFree", "stranded\nnow")
    """The table's columns after the run's label; a header's lines split at ``\\n``, as in the what-if table."""

    def __init__(self, runs: Sequence[Run]) -> None:
        self._runs = tuple(runs)

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(self._runs)

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            for run in self._runs:
                if key in (run.alloc_conf, run.workload):
                    return run
            raise KeyError(f"no run with config or workload {key!r}")
        return self._runs[key]

    def __str__(self) -> str:
        """The runs as a plain-text table (:func:`~memviz.tables.format_table`), one row per run."""
        rows = [("", *self.COLUMNS)]
        for run in self._runs:
            rows.append((
                _label(run, self._runs), format_bytes(run.peak_requested_bytes), format_bytes(run.peak_reserved_bytes),
                str(run.ooms), str(run.device_allocs), str(run.device_frees), format_bytes(run.stranded_bytes),
            ))  # fmt: skip
        return format_table(rows)

    def __repr__(self) -> str:
        return f"<Comparison of {len(self)} runs>"


def _label(run: Run, runs: Sequence[Run]) -> str:
    conf = run.alloc_conf or "(default)"
    workloads = {r.workload for r in runs}
    configs = {r.alloc_conf for r in runs}
    if len(workloads) > 1 and len(configs) > 1:
        return f"{run.workload} · {conf}"
    return run.workload if len(workloads) > 1 else conf


def compare_configs(
    workloads: Callable[[Lab], Any] | Mapping[str, Callable[[Lab], Any]],
    configs: Sequence[str] = WORKLOAD_CONFIGS,
    *,
    device: str = "H200",
    cap: int | str | None = "2 GiB",
) -> Comparison:
    """Run each workload under each config, each time in a fresh simulated lab.

    Args:
        workloads: a function ``workload(lab)``, or ``{label: workload}`` for several.
        configs: ``PYTORCH_CUDA_ALLOC_CONF`` strings, ``""`` for the defaults (default
            :data:`WORKLOAD_CONFIGS`).
        device: the simulated device (default ``"H200"``).
        cap: the cap of every lab (default ``"2 GiB"``).

    Returns:
        A :class:`Comparison`: one :class:`Run` per workload and config, workloads outermost.
    """
    if callable(workloads):
        workloads = {getattr(workloads, "__name__", "workload"): workloads}
    runs = []
    for label, workload in workloads.items():
        for conf in configs:
            lab = Lab("sim", device=device, cap=cap, alloc_conf=conf)
            runs.append(Run(label, conf, lab, workload(lab)))
    return Comparison(runs)
