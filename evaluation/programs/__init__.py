"""The programs the predictor is checked against, by set.

- ``fitted``: :mod:`memviz.examples`, the lessons' programs, whose recordings the workspace rules and the
  emulation of CUDA's decisions were fitted on;
- ``heldout``, ``heldout_convs``, ``heldout_torchvision``: written and recorded before they were compared,
  never fitted on (some rules were refined after their misses: see ``evaluation/recordings/README.md``
  and :data:`evaluation.recorded.REFINED_AFTER`).

Each module defines ``PROGRAMS``: name → an ordinary CUDA program (a function of keyword arguments).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from memviz import examples

from . import heldout, heldout_convs, heldout_torchvision

__all__ = ["PROGRAMS", "SETS", "module_of", "runnable"]

SETS: dict[str, ModuleType] = {"fitted": examples, "heldout": heldout, "heldout_convs": heldout_convs,
                               "heldout_torchvision": heldout_torchvision}
"""Every program set by name."""

PROGRAMS: dict[str, Any] = {name: fn for module in SETS.values() for name, fn in module.PROGRAMS.items()}
"""Every program by name."""


def module_of(program: str) -> ModuleType:
    """The module that defines ``program``.

    Raises:
        KeyError: no set has it.
    """
    for module in SETS.values():
        if program in module.PROGRAMS:
            return module
    raise KeyError(program)


def runnable(program: str) -> bool:
    """Whether ``program`` can run here: the torchvision set needs torchvision, which memviz does not install."""
    if program not in heldout_torchvision.PROGRAMS:
        return True
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True
