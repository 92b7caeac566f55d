"""Training steps, for the step markers: ``memviz.step()`` from the loop, else the optimizers' own steps.

Every running watch or recorder holds a :class:`StepCounter`. :func:`step` tells each of them; it costs
about a microsecond (a clock read and a loop over the running counters), nothing when none runs. A loop
that never calls it is counted by its optimizer: while a counter runs and torch is imported, a global
``torch.optim`` step post-hook (``register_optimizer_step_post_hook``) counts the steps of the first
optimizer that steps (a GAN's second optimizer, or a scheduler's inner one, would count twice), until the
loop's first ``memviz.step()``, from which on only those count.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

__all__ = ["StepCounter", "step"]

DURATIONS_KEPT = 4096  # the last step durations kept for the median step time

_running: list[StepCounter] = []
_optimizer_hook: Any = None  # the torch hook's handle while a counter runs


class StepCounter:
    """The steps of one watch: ``count`` so far, ``explicit`` once the loop called :func:`step`, and the
    last step durations (``durations_s``, seconds between consecutive steps)."""

    __slots__ = ("_last_s", "_optimizer", "count", "durations_s", "explicit")

    def __init__(self) -> None:
        self.count = 0
        self.explicit = False
        self.durations_s: deque[float] = deque(maxlen=DURATIONS_KEPT)
        self._last_s: float | None = None
        self._optimizer: int | None = None  # id() of the optimizer whose steps count

    def _tick(self, now: float) -> None:
        if self._last_s is not None:
            self.durations_s.append(now - self._last_s)
        self._last_s = now
        self.count += 1

    def on_step(self, now: float) -> None:
        if not self.explicit:  # the loop's own markers replace the optimizer's from here on
            self.explicit = True
        self._tick(now)

    def on_optimizer(self, optimizer: Any, now: float) -> None:
        if self.explicit:
            return
        if self._optimizer is None:
            self._optimizer = id(optimizer)
        if id(optimizer) == self._optimizer:
            self._tick(now)

    def median_step_s(self) -> float | None:
        """The median of the step durations kept, or None before the second step."""
        if not self.durations_s:
            return None
        ordered = sorted(self.durations_s)
        return ordered[len(ordered) // 2]

    def start(self) -> StepCounter:
        """Start counting (:func:`step` and optimizer steps reach this counter)."""
        global _optimizer_hook
        if self not in _running:
            _running.append(self)
        if _optimizer_hook is None and "torch" in sys.modules:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            _optimizer_hook = register_optimizer_step_post_hook(_optimizer_stepped)
        return self

    def stop(self) -> None:
        """Stop counting; the optimizer hook goes when the last counter stops."""
        global _optimizer_hook
        if self in _running:
            _running.remove(self)
        if not _running and _optimizer_hook is not None:
            _optimizer_hook.remove()
            _optimizer_hook = None


def step() -> None:
    """Mark the end of a training step: the running watches and recorders draw a step marker.

    Call it once per step in your loop (``memviz.step()`` after ``optimizer.step()``); it costs about a
    microsecond, and nothing when no watch runs. Without it, a watch counts the first optimizer's steps.
    """
    if _running:
        now = time.perf_counter()
        for counter in _running:
            counter.on_step(now)


def _optimizer_stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    now = time.perf_counter()
    for counter in _running:
        counter.on_optimizer(optimizer, now)
