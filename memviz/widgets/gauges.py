"""Memory gauges: allocated and reserved against the cap (or the device), and the driver's view.

On a real GPU a third bar shows what the driver counts as used (NVML: what ``nvidia-smi`` prints): it is
always more than reserved, because the CUDA context, libraries and other processes live outside PyTorch's
cache, and the gauge says how much. The simulator has no driver, so the bar is absent there.

The gauges are a tiny anywidget (plain DOM, no plotting library): a redraw is one trait change and a few
``textContent`` writes, which keeps click-to-rendered time low. Every value is printed exactly
(``"512.00 MiB (536,870,912 B)"``) so a test, or a learner, can read the bytes from the page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import anywidget
import traitlets

from memviz.widgets._common import Piece, exact_bytes

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = ["GaugeWidget", "MemoryGauges", "gauge_row"]

_ESM = r"""
function render({ model, el }) {
  el.classList.add("memviz-gauges");
  const title = document.createElement("div");
  title.className = "memviz-gauge-title";
  const rows = document.createElement("div");
  const note = document.createElement("div");
  note.className = "memviz-gauge-note";
  el.append(title, rows, note);
  const draw = () => {
    title.textContent = model.get("title");
    note.textContent = model.get("note");
    note.style.display = model.get("note") ? "" : "none";
    const want = model.get("rows");
    while (rows.children.length > want.length) rows.lastChild.remove();
    want.forEach((r, i) => {
      let row = rows.children[i];
      if (!row || row.dataset.key !== r.key) {
        row = document.createElement("div");
        row.dataset.key = r.key;
        row.innerHTML = '<span class="memviz-gauge-label"></span><span class="memviz-gauge-track">' +
          '<span class="memviz-gauge-fill"></span><span class="memviz-gauge-peak"></span></span>' +
          '<span class="memviz-gauge-value"></span>';
        if (rows.children[i]) rows.children[i].replaceWith(row); else rows.append(row);
      }
      row.className = "memviz-gauge-row memviz-gauge-" + r.key;
      row.title = r.tooltip || "";
      row.querySelector(".memviz-gauge-label").textContent = r.label;
      const fill = row.querySelector(".memviz-gauge-fill");
      fill.style.width = (100 * Math.min(1, r.fraction)) + "%";
      fill.style.background = r.color;
      const peak = row.querySelector(".memviz-gauge-peak");
      peak.style.display = r.peak_fraction === null ? "none" : "";
      if (r.peak_fraction !== null) peak.style.left = (100 * Math.min(1, r.peak_fraction)) + "%";
      row.querySelector(".memviz-gauge-value").textContent = r.text;
    });
  };
  draw();
  model.on("change:rows", draw);
  model.on("change:title", draw);
  model.on("change:note", draw);
  return () => { model.off("change:rows", draw); model.off("change:title", draw); model.off("change:note", draw); };
}
export default { render };
"""

_CSS = """
.memviz-gauges { font: 12px/1.5 var(--jp-ui-font-family, sans-serif); color: var(--jp-ui-font-color1, #222);
  padding: 4px 0; }
.memviz-gauge-title { font-weight: 600; margin-bottom: 2px; }
.memviz-gauge-row { display: grid; grid-template-columns: 150px 320px auto; gap: 8px; align-items: center; }
.memviz-gauge-track { position: relative; height: 12px; background: var(--jp-layout-color3, #e5e5e5);
  border-radius: 2px; overflow: hidden; }
.memviz-gauge-fill { position: absolute; left: 0; top: 0; bottom: 0; }
.memviz-gauge-peak { position: absolute; top: 0; bottom: 0; width: 2px; margin-left: -1px; background: #000; }
.memviz-gauge-value { font-family: var(--jp-code-font-family, monospace); white-space: nowrap; }
.memviz-gauge-note { color: var(--jp-ui-font-color2, #666); max-width: 820px; }
"""

COLORS = {"allocated": "#1f77b4", "reserved": "#ff7f0e", "driver": "#7f7f7f"}


class GaugeWidget(anywidget.AnyWidget):
    """The gauges' view: rows of ``{key, label, fraction, peak_fraction, text, color, tooltip}``."""

    _esm = _ESM
    _css = _CSS
    title = traitlets.Unicode("").tag(sync=True)
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)


class MemoryGauges(Piece):
    """Allocated and reserved bytes against the limit, with peaks; the driver's used memory on a GPU.

    ``values`` holds the exact bytes last drawn (``"allocated"``, ``"reserved"``, ``"limit"``, and
    ``"driver_used"`` when a driver answered), so tests compare them with ``lab.stats()``.

    >>> from memviz.lab import Lab
    >>> g = MemoryGauges(Lab(backend="sim", device="T4", cap="2 GiB"))
    >>> g.values["limit"], g.values["allocated"]
    (2147483648, 0)
    """

    def __init__(self, lab: Lab) -> None:
        super().__init__(lab)
        self.widget = GaugeWidget()
        self.widget.add_class("memviz-gauges-widget")
        self.values: dict[str, int] = {}
        self.refresh()

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        backend = self.lab.backend
        allocated = stats.get("allocated_bytes.all.current", 0)
        reserved = stats.get("reserved_bytes.all.current", 0)
        peak_alloc = stats.get("allocated_bytes.all.peak", 0)
        peak_res = stats.get("reserved_bytes.all.peak", 0)
        capped = backend.cap_bytes is not None
        limit = backend.cap_bytes if capped else backend.total_memory_bytes
        what = "cap" if capped else "device"
        rows = [
            gauge_row("allocated", "allocated", allocated, limit, peak_alloc,
                      f"memory_allocated(): bytes in live tensors' blocks (peak {exact_bytes(peak_alloc)})"),
            gauge_row("reserved", "reserved (cached)", reserved, limit, peak_res,
                      f"memory_reserved(): segments the cache holds (peak {exact_bytes(peak_res)})"),
        ]  # fmt: skip
        values = {"allocated": allocated, "reserved": reserved, "limit": limit,
                  "allocated_peak": peak_alloc, "reserved_peak": peak_res}  # fmt: skip
        note = ""
        driver = backend.driver_memory()
        if driver is not None:
            values["driver_used"] = driver.used_bytes
            rows.append(
                gauge_row(
                    "driver",
                    f"driver used ({driver.source})",
                    driver.used_bytes,
                    driver.total_bytes,
                    None,
                    "what nvidia-smi shows: every process on the device",
                )
            )
            outside = driver.used_bytes - reserved
            note = (f"The driver counts {exact_bytes(outside)} more than PyTorch reserved: the CUDA context, "
                    "libraries (cuBLAS, cuDNN) and other processes live outside the cache, so nvidia-smi "
                    "never matches memory_reserved() and empty_cache() never takes it to zero.")  # fmt: skip
        self.values = values
        title = f"{backend.device_name}: {what} {exact_bytes(limit)}"
        with self.widget.hold_sync():
            self.widget.title = title
            self.widget.rows = rows
            self.widget.note = note


def gauge_row(key: str, label: str, nbytes: int, limit: int, peak: int | None, tooltip: str) -> dict:
    """One gauge of :class:`GaugeWidget`: ``key`` (``"allocated"``, ``"reserved"`` or ``"driver"``: its colour and
    CSS class), ``nbytes`` against ``limit`` with a ``peak`` mark (None: no mark), the exact bytes as text."""
    return {
        "key": key, "label": label, "fraction": nbytes / limit if limit else 0.0,
        "peak_fraction": None if peak is None else (peak / limit if limit else 0.0),
        "text": exact_bytes(nbytes), "color": COLORS[key], "tooltip": tooltip,
    }  # fmt: skip
