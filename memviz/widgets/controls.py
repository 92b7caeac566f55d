"""Controls: allocate (bytes with units, or shape + dtype; count; name), free a pick, free all, gc.collect(),
empty_cache(), reset stats; and the backend switch (simulator / real GPU) with device, cap and allocator
config, which starts a fresh lab (:mod:`memviz.widgets.backend_panel`). With ``streams=True``, also the
streams-and-pools panel (:mod:`memviz.widgets.streams_panel`): where Allocate allocates, and its buttons.

Three small panels (:class:`AllocatePanel`, :class:`ActionsPanel`, the backend panel) hold the fields;
:class:`Controls` runs every button through one path: the lab action, then ``on_event`` (the dashboard
redraws every piece), then the status line.

Every button calls one lab action. Bad input ("12 parsecs", a duplicate name, an unknown config key)
shows the lab's own message in the status line and changes nothing; nothing raises out of a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import ipywidgets as W

from memviz.shapes import DTYPE_SIZES, read_size
from memviz.widgets._common import Piece, escape, guarded
from memviz.widgets._common import button as _button
from memviz.widgets._common import wrap_row as _row
from memviz.widgets.backend_panel import CONFIG_PRESETS, BackendPanel
from memviz.widgets.streams_panel import StreamsPanel

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["CONFIG_PRESETS", "ActionsPanel", "AllocatePanel", "Controls", "parse_size_field"]


def parse_size_field(text: str) -> tuple[Any, bool]:
    """What the size box means: ``((2048, 4096), True)`` for a shape, ``("512 MiB", False)`` for bytes.

    The lab's own reading, :func:`memviz.shapes.read_size`: a shape has brackets or an ``x`` between
    numbers (``"(100, 100)"``, ``"[8]"``, ``"100x100"``); anything else is bytes (``"512 MiB"``,
    ``"40000"``, ``"1,024"``: commas separate thousands). A bad entry raises its ``SizeError``.
    """
    value = read_size(text)
    return (value, True) if isinstance(value, tuple) else (text.strip(), False)


class AllocatePanel:
    """The allocation fields (``size``, ``dtype``, ``count``, ``name``) and the Allocate button (``button``)."""

    def __init__(self) -> None:
        self.size = W.Text(value="512 MiB", description="size", placeholder="512 MiB or (1024, 1024)",
                           layout=W.Layout(width="230px"), tooltip="bytes with a unit, or a shape with a dtype")
        self.dtype = W.Dropdown(options=list(DTYPE_SIZES), value="float32", description="dtype",
                                layout=W.Layout(width="170px"))
        self.count = W.BoundedIntText(value=1, min=1, max=1_000_000, description="count",
                                      layout=W.Layout(width="150px"))
        self.name = W.Text(value="", description="name", placeholder="auto: t0, t1, ...",
                           layout=W.Layout(width="200px"))  # fmt: skip
        for widget, cls in ((self.size, "memviz-size"), (self.dtype, "memviz-dtype"), (self.count, "memviz-count"),
                            (self.name, "memviz-name")):  # fmt: skip
            widget.add_class(cls)
        self.button = _button("Allocate", "allocate count tensors of this size (shape × dtype, or bytes)")
        self.button.button_style = "primary"
        self.widget = _row([self.size, self.dtype, self.count, self.name, self.button])

    def allocate(self, lab: Lab, **placement: str | None) -> Event:
        """Allocate what the fields say in ``lab`` (a bad size or name raises ``ValueError``, nothing changes);
        ``placement``: ``stream`` and ``pool`` for ``lab.allocate`` (the streams panel's picks)."""
        size, is_shape = parse_size_field(self.size.value)
        name = self.name.value.strip() or None
        if is_shape:
            return lab.allocate(size, self.dtype.value, count=self.count.value, name=name, **placement)
        return lab.allocate(size, count=self.count.value, name=name, **placement)


class ActionsPanel:
    """The free picker (``free_pick``: groups, then tensors in no group) and the buttons of the lab's other
    actions (``buttons``: "Free", "Free all", "gc.collect()", "empty_cache()", "reset stats")."""

    FREE_TIP = "drop the lab's reference to the picked tensor or group"
    ACTIONS: ClassVar[dict[str, tuple[Callable[[Lab], Event], str]]] = {  # after "Free": (lab action, tooltip)
        "Free all": (lambda lab: lab.free_all(), "drop every tensor the lab holds"),
        "gc.collect()": (lambda lab: lab.gc(), "collect reference cycles (tensors kept only by cycles go)"),
        "empty_cache()": (lambda lab: lab.empty_cache(), "release every cached segment with no live block"),
        "reset stats": (lambda lab: lab.reset_stats(), "reset peak and accumulated stats"),
    }

    def __init__(self) -> None:
        self.free_pick = W.Dropdown(options=[], description="tensor", layout=W.Layout(width="220px"))
        self.free_pick.add_class("memviz-free-pick")
        self.buttons = {"Free": _button("Free", self.FREE_TIP)}
        self.buttons.update((label, _button(label, tip)) for label, (_, tip) in self.ACTIONS.items())
        self.widget = _row([self.free_pick, *self.buttons.values()])

    def free(self, lab: Lab) -> Event:
        """Free the picked tensor or group."""
        if not self.free_pick.value:
            raise ValueError("nothing to free: the lab holds no tensors")
        return lab.free(self.free_pick.value)

    @staticmethod
    def pickable(lab: Lab) -> list[str]:
        """What the free picker offers: groups, then tensors that are in no group."""
        return list(lab.groups) + [n for n, t in lab.tensors.items() if t.group is None]

    def show(self, lab: Lab) -> None:
        """Offer ``lab``'s tensors in the picker, keeping the pick while it exists."""
        options = self.pickable(lab)
        if list(self.free_pick.options) != options:
            keep = self.free_pick.value
            self.free_pick.options = options
            self.free_pick.value = keep if keep in options else (options[-1] if options else None)


class Controls(Piece):
    """Buttons and fields that drive a lab.

    Args:
        lab: the lab to drive.
        on_event: called with each event after an action (the dashboard refreshes its pieces there).
        on_new_lab: called with the fresh lab the backend switch made (default: this piece shows it).
        out: the ``Output`` where unexpected errors print their traceback.
        streams: add the streams-and-pools panel (``streams``, a
            :class:`~memviz.widgets.streams_panel.StreamsPanel`; default False).

    Attributes: the panels ``allocation`` (:class:`AllocatePanel`), ``actions`` (:class:`ActionsPanel`) and
    ``backend`` (:class:`~memviz.widgets.backend_panel.BackendPanel`); their fields ``size``, ``dtype``,
    ``count``, ``name``, ``free_pick``, ``kind``, ``gpu`` (the CUDA device picker), ``device``, ``cap``,
    ``config``; ``buttons`` (by description: ``"Allocate"``, ``"Free"``, ``"Free all"``, ``"gc.collect()"``,
    ``"empty_cache()"``, ``"reset stats"``, ``"new lab"``, and the streams panel's); ``status`` shows the last
    event or error, ``error`` the last error.
    """

    def __init__(
        self,
        lab: Lab,
        *,
        on_event: Callable[[Event], None] | None = None,
        on_new_lab: Callable[[Lab], None] | None = None,
        out: W.Output | None = None,
        streams: bool = False,
    ) -> None:
        super().__init__(lab)
        self.on_event, self.on_new_lab = on_event, on_new_lab
        self.out = out if out is not None else W.Output()
        self.error = ""
        wrap = guarded(self.out, self._show_error)
        self.allocation = AllocatePanel()
        self.actions = ActionsPanel()
        self.backend = BackendPanel(lab, wrap, self._new_lab)
        a, b = self.allocation, self.backend
        self.size, self.dtype, self.count, self.name = a.size, a.dtype, a.count, a.name
        self.free_pick = self.actions.free_pick
        self.kind, self.device, self.cap, self.config, self.cuda = b.kind, b.device, b.cap, b.config, b.cuda
        self.gpu = b.gpu
        self.buttons: dict[str, W.Button] = {"Allocate": a.button, **self.actions.buttons, "new lab": b.new_button}
        self.streams = StreamsPanel() if streams else None
        runs: dict[str, Callable[[], Event]] = {"Allocate": self._allocate, "Free": lambda: self.actions.free(self.lab)}
        for label, (action, _) in ActionsPanel.ACTIONS.items():
            runs[label] = lambda action=action: action(self.lab)
        if self.streams is not None:
            self.buttons.update(self.streams.buttons)
            runs.update(self.streams.runs(lambda: self.lab, lambda: self.free_pick.value))
        for label, run in runs.items():
            self.buttons[label].on_click(wrap(self._action_handler(run)))
        self.status = W.HTML(value="")
        self.status.add_class("memviz-status")
        panels = [a.widget, self.actions.widget] + ([self.streams.widget] if self.streams is not None else [])
        self.widget = W.VBox([*panels, self.status, b.widget])
        self.widget.add_class("memviz-controls")
        self.refresh()

    def _allocate(self) -> Event:
        placement = self.streams.placement(self.lab) if self.streams is not None else {}
        return self.allocation.allocate(self.lab, **placement)

    def lab_settings(self) -> dict[str, Any]:
        """The ``Lab(...)`` arguments the backend fields describe now."""
        return self.backend.lab_settings()

    def pickable(self) -> list[str]:
        """What the free picker offers: groups, then tensors that are in no group."""
        return self.actions.pickable(self.lab)

    def _new_lab(self) -> None:
        from memviz.lab import Lab

        lab = Lab(**self.lab_settings())  # a bad config raises here, and nothing changes
        old = self.lab
        old.free_all()
        if old.backend.kind == "cuda":  # the next lab shares the device: give it an empty cache
            old.let_go()
            old.empty_cache()
        self._set_status(f"new lab: {lab.describe()}")
        if self.on_new_lab is not None:
            self.on_new_lab(lab)
        else:
            self.set_lab(lab)

    def _action_handler(self, action: Callable[[], Event]) -> Callable[[Any], None]:
        def handler(_button: Any) -> None:
            event = action()
            self.error = ""
            if self.on_event is not None:  # first the gauges and figures (the dashboard): what the click is for
                self.on_event(event)
            else:
                self.refresh(event.stats_after)  # alone: the free picker
            self._set_status(str(event), oom=not event.ok)

        return handler

    def _set_status(self, text: str, *, oom: bool = False) -> None:
        color = "#d62728" if oom else "inherit"
        self.status.value = f'<span class="memviz-status-text" style="color:{color}">{escape(text)}</span>'

    def _show_error(self, message: str) -> None:
        self.error = message
        self.status.value = f'<span class="memviz-error" style="color:#d62728">⚠ {escape(message)}</span>'

    def _forget(self) -> None:
        self.backend.show(self.lab)

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        self.actions.show(self.lab)
        if self.streams is not None:
            self.streams.show(self.lab)
