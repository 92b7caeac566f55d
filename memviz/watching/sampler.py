"""The sampler: one daemon thread that polls at a bounded rate while the program runs.

Each tick it calls ``poll()`` (a :class:`~memviz.watching.sources.SampleReader`, or a stats-file follower)
and hands the samples to ``on_samples`` (the store and the live view). Ticks are spaced ``interval_s`` apart
on a fixed schedule; a tick that comes late (the program held the GIL) is not made up: the next one is a
full interval later, so the rate never exceeds ``1 / interval_s``.

An exception in ``poll`` or ``on_samples`` stops the sampler and is kept as one line in ``error``; it never
reaches the program. ``cpu_s`` is the CPU time the thread used (``time.thread_time``): what watching cost
the process, besides the GIL hand-overs that the benchmark measures.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from memviz.errors import InputError, InputTypeError
from memviz.watching.samples import Sample

__all__ = ["MAX_INTERVAL_S", "MIN_INTERVAL_S", "Sampler", "check_interval"]

MIN_INTERVAL_S = 0.01  # 100 Hz at most: each tick takes the GIL from the program
MAX_INTERVAL_S = 60.0


def check_interval(interval_s: object) -> float:
    """``interval_s`` as a float if it is a number of seconds from 0.01 to 60.

    Raises:
        InputTypeError: not a number. InputError: out of range.
    """
    if isinstance(interval_s, bool) or not isinstance(interval_s, int | float):
        raise InputTypeError(f"interval_s is seconds between samples, a number such as 0.1, not "
                             f"{type(interval_s).__name__} {interval_s!r}")
    if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
        raise InputError(f"interval_s={interval_s!r}: sample every {MIN_INTERVAL_S} to {MAX_INTERVAL_S:g} s "
                         "(0.1 s is 10 samples a second)")
    return float(interval_s)


class Sampler:
    """Call ``poll()`` every ``interval_s`` seconds in a daemon thread and pass its samples to ``on_samples``.

    Attributes: ``ticks`` (polls done), ``cpu_s`` (the thread's CPU seconds), ``error`` (None, or the line of
    the exception that stopped it), ``detail`` (that exception's traceback, for a bug report).
    """

    def __init__(self, poll: Callable[[], list[Sample]], interval_s: float,
                 on_samples: Callable[[list[Sample]], None], *, name: str = "memviz-sampler") -> None:  # fmt: skip
        self.interval_s = check_interval(interval_s)
        self._poll = poll
        self._on_samples = on_samples
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.ticks = 0
        self.cpu_s = 0.0
        self.error: str | None = None
        self.detail = ""

    def start(self) -> Sampler:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and wait for its tick in progress to end (at most ``timeout_s``)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        interval = self.interval_s
        due = time.perf_counter() + interval
        while not self._stop.wait(max(0.0, due - time.perf_counter())):
            cpu = time.thread_time()
            try:
                samples = self._poll()
                if samples:
                    self._on_samples(samples)
            except Exception as error:  # the program must never see the sampler fail: keep the message, stop
                self.error = f"{type(error).__name__}: {error}"
                self.detail = traceback.format_exc()
                return
            finally:
                self.cpu_s += time.thread_time() - cpu
            self.ticks += 1
            due += interval
            now = time.perf_counter()
            if due <= now:  # late: skip the missed ticks rather than catching up in a burst
                due = now + interval
