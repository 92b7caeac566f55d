"""Watch a training loop's memory live while it runs: in this process, or a job in another one.

- :func:`watch` (``memviz.watch``): a context manager (or a running object) that samples the allocator from a
  thread, shows live gauges and a timeline in the notebook, and opens the map at the peak or the OOM at the
  end (:mod:`memviz.watching.watch`).
- :func:`step` (``memviz.step``): mark a training step (:mod:`memviz.watching.steps`).
- :func:`record` (``memviz.record``): a job writes a stats file that ``watch(path)`` follows
  (:mod:`memviz.watching.record`, the format in :mod:`memviz.watching.statsfile`); ``watch("run.pickle")``
  follows a snapshot file a job rewrites (:mod:`memviz.watching.snapshotfile`).
- ``%%memviz``: the cell magic (:mod:`memviz.watching.magic`, ``%load_ext memviz``).

The parts: :mod:`~memviz.watching.samples` (a sample and the bounded store), :mod:`~memviz.watching.sources`
(torch's allocator or a simulated lab), :mod:`~memviz.watching.sampler` (the thread),
:mod:`~memviz.watching.cuda_history` (memory history and the OOM observer on a GPU),
:mod:`~memviz.watching.sim_trace` (the simulator's history), :mod:`~memviz.watching.results` (the peak or the OOM
in the history, after the watch), :mod:`~memviz.watching.live_blocks` (what was live there).

Nothing is imported here: ``import memviz`` loads :mod:`~memviz.watching.steps` alone (``memviz.step`` costs a
microsecond and needs nothing), and ``memviz.watch`` / ``memviz.record`` load the rest on first use.
"""
