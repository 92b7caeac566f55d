"""Refresh after every notebook cell, through IPython's ``post_run_cell`` event (no polling thread).

Allocations made in plain code (``x = torch.randn(...)``, ``del y``) then show up as soon as the cell ends:
the hook calls ``target.on_cell(execution_count)``, which logs an ``"observe"`` event in the lab when the
memory changed and redraws.

The hook holds its target weakly: IPython's callback list is a global, and a strong reference there would
keep a closed dashboard (and every figure it owns) alive for the whole session. When the target is gone the
hook unregisters itself.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

__all__ = ["CellHook"]


class CellHook:
    """Call ``target.on_cell(execution_count)`` after each cell IPython runs, until :meth:`unregister`.

    Args:
        target: an object with ``on_cell(execution_count)`` (a dashboard or a piece); held weakly.
        shell: the IPython shell (default: ``get_ipython()``); with no shell (plain Python) nothing is
            registered and ``active`` is False.
    """

    def __init__(self, target: Any, shell: Any = None) -> None:
        if shell is None:
            try:
                from IPython import get_ipython
            except ImportError:  # pragma: no cover - IPython comes with ipykernel/ipywidgets
                get_ipython = None
            shell = get_ipython() if get_ipython else None
        self._target = weakref.ref(target)
        self._shell = shell
        self._callback = self._make_callback()
        if shell is not None:
            shell.events.register("post_run_cell", self._callback)

    @property
    def active(self) -> bool:
        """True while registered with a shell."""
        return self._shell is not None

    def _make_callback(self):
        # A closure over a weak reference only: IPython keeps it, and it must not keep the target alive.
        # When the target is gone it unregisters itself (the hook object may be gone too by then).
        target_ref = self._target
        shell = self._shell

        def post_run_cell(result: Any) -> None:
            target = target_ref()
            if target is None:
                if shell is not None:
                    with contextlib.suppress(ValueError):
                        shell.events.unregister("post_run_cell", post_run_cell)
                return
            target.on_cell(getattr(result, "execution_count", None))

        return post_run_cell

    def unregister(self) -> None:
        """Stop calling the target (idempotent)."""
        shell, self._shell = self._shell, None
        if shell is not None:
            with contextlib.suppress(ValueError):  # already gone
                shell.events.unregister("post_run_cell", self._callback)
