"""memviz.watch / step / record on the simulator (a lab program), without a browser: the sampler thread, the exact
peaks, the OOM (a lab's event, or an error that ends the block), the history and what was live there, the stats
file a job writes and a notebook follows, the ``%%memviz`` magic, and bad input. The real GPU path is checked by
scripts/gpu_watch_check.py; the live page by tests/browser/test_watch_browser.py."""

from __future__ import annotations

import json
import threading
import time

import pytest

import memviz
from memviz.errors import InputError, InputTypeError, OutOfMemoryError
from memviz.lab import Lab
from memviz.shapes import size_request
from memviz.watching.samples import FIELDS, Sample, SampleStore
from memviz.watching.statsfile import StatsFollower
from memviz.watching.steps import StepCounter

MiB = 1 << 20
STEP_BYTES = 64 * MiB
FAST = 0.02  # seconds between samples in these tests


def sim_lab() -> Lab:
    return Lab("sim", device="T4", cap="2 GiB")


class Graph:
    """An autograd graph, standing in: a step's loss holds its activations; a sum holds both operands' graphs."""

    def __init__(self, *held):
        self.held = held


def leaky_loop(lab: Lab, steps: int, keep_graph: bool, pause_s: float = 0.005) -> int:
    """Each step allocates 64 MiB of activations that its loss holds; ``total = total + loss`` (``keep_graph``) keeps
    every step's graph, ``total + loss.item()`` none (the last ``loss`` lives until the next step replaces it)."""
    total = loss = None
    done = 0
    for _ in range(steps):
        if not lab.allocate(STEP_BYTES, name="act").ok:
            break
        loss = Graph(lab["act"])
        lab.free("act")
        total = Graph(total, loss) if keep_graph else None
        done += 1
        memviz.step()
        time.sleep(pause_s)
    return done


def test_a_leaking_loop_is_sampled_live_and_the_map_opens_at_its_oom():
    lab = sim_lab()
    seen: list[int] = []
    with memviz.watch(lab, interval_s=FAST, show=False) as w:
        assert w.running
        done = leaky_loop(lab, 40, keep_graph=True)
        seen.append(w.samples.offered)
    assert done == 32  # 32 x 64 MiB fill the 2 GiB cap exactly; the 33rd step runs out of memory
    assert seen[0] >= 3, "the sampler thread took samples while the loop ran"
    assert w.peak_allocated_bytes == 32 * STEP_BYTES == lab.backend.allocator.max_memory_allocated()
    assert w.peak_reserved_bytes == lab.backend.allocator.max_memory_reserved()
    assert w.steps == 32 and w.oom is None  # the lab caught the OOM: an event, not an error that ended the block
    assert [o.ended_block for o in w.ooms] == [False] and "out of memory" in w.ooms[0].message
    history = w.history
    assert w.focus == "oom" and history.events[w.focus_index]["action"] == "oom"
    assert history.timeline.allocated_bytes[w.focus_index] == 32 * STEP_BYTES
    assert [(g.count, g.size_bytes) for g in w.live] == [(32, STEP_BYTES)]
    assert w.live[0].where == "no stack recorded"  # the simulator records no stacks, and says so
    assert "step 32 (caught by the program)" in w.summary()


def test_the_fixed_loop_stays_flat_and_the_map_opens_at_its_peak():
    lab = sim_lab()
    with memviz.watch(lab, interval_s=FAST, show=False) as w:
        leaky_loop(lab, 20, keep_graph=False)
    # the previous step's activations live until the next one is made: two steps' worth at the peak
    assert w.peak_allocated_bytes == 2 * STEP_BYTES and w.steps == 20 and not w.ooms
    assert w.focus == "peak" and w.history.timeline.allocated_bytes[w.focus_index] == 2 * STEP_BYTES
    assert [(g.count, g.size_bytes) for g in w.live] == [(2, STEP_BYTES)]
    assert w.end_allocated_bytes == 0 and w.median_step_s is not None


def test_a_spike_between_two_samples_shows_exactly_in_the_peak():
    lab = sim_lab()
    with memviz.watch(lab, interval_s=1.0, show=False) as w:  # no tick during the block: only start and end
        lab.allocate("1 GiB", name="spike")
        lab.free("spike")
        lab.allocate("3 MiB", name="small")
    values = w.samples.values
    assert values[:, 0].max() < 1 << 30  # no sample saw the spike's current value...
    assert w.peak_allocated_bytes == 1 << 30  # ...the allocator's own peak holds it exactly
    assert w.peak_sample().t_s == w.samples.t_s[-1]


def test_peaks_are_running_maxima_when_the_program_resets_them():
    lab = sim_lab()
    with memviz.watch(lab, interval_s=FAST, show=False, max_points=4) as w:  # thinned, the last sample kept
        lab.allocate("512 MiB", name="a")
        time.sleep(4 * FAST)
        lab.free("a")
        lab.reset_peak()
        time.sleep(4 * FAST)
    assert w.peak_allocated_bytes == 512 * MiB
    assert w._reader.peak_resets >= 1
    assert w.samples.stride > 1 and w.samples.t_s[-1] == w.last.t_s and w.samples.offered > w.samples.n


def test_an_oom_that_ends_the_block_frees_its_frames_and_is_kept_not_raised():
    lab = sim_lab()
    lab.allocate("256 MiB", name="weights")

    def step():
        activations = [lab.backend.empty(size_request(STEP_BYTES)) for _ in range(100)]  # noqa: F841 - never done
        raise AssertionError("unreachable: 100 x 64 MiB cannot fit under 2 GiB")

    with memviz.watch(lab, interval_s=FAST, show=False) as w:
        step()
    assert w.oom is not None and w.oom.ended_block and "out of memory" in w.oom.message
    assert lab.stats()["allocated_bytes.all.current"] == 256 * MiB  # the failed step's tensors went with its frame
    assert w.end_allocated_bytes == 256 * MiB and w.start_allocated_bytes == 256 * MiB
    assert w.focus == "oom" and w.history.events[w.focus_index]["action"] == "oom"
    assert "after the OOM its frames were released" in w.summary()

    with pytest.raises(OutOfMemoryError), memviz.watch(lab, interval_s=FAST, show=False, raise_oom=True) as w2:
        step()
    assert w2.oom is not None and lab.stats()["allocated_bytes.all.current"] == 256 * MiB


def test_other_errors_pass_through_and_the_watch_still_stops():
    lab = sim_lab()
    with pytest.raises(ZeroDivisionError), memviz.watch(lab, interval_s=FAST, show=False) as w:
        1 / 0  # noqa: B018
    assert not w.running and w.oom is None and not w._sampler.running


def test_the_view_grows_live_and_ends_at_the_oom_with_the_viewer_and_what_if():
    lab = sim_lab()
    with memviz.watch(lab, interval_s=FAST) as w:
        leaky_loop(lab, 40, keep_graph=True, pause_s=0.02)  # about 0.7 s: the page is updated 5 times a second
    view = w.view
    assert view.pushes >= 3 and view.timeline.sent_rows == w.samples.offered
    assert view.timeline.state == "done"
    rows = view.timeline.rows
    assert rows[-1][1:] == w.samples.values[-1].tolist() and max(r[4] for r in rows) == 32 * STEP_BYTES
    kinds = [m["kind"] for m in view.timeline.marks]
    assert kinds == ["oom", "peak"]
    gauges = {r["key"]: r for r in view.gauges.rows}  # at the end: the loop's tensors went with its frame
    assert gauges["allocated"]["text"] == "0 B (0 B)" and gauges["allocated"]["peak_fraction"] == 1.0  # at the cap
    assert view.viewer.index == w.focus_index and "oom" in view.viewer.text
    labels = [b.description for b in view.result.children[2].children]
    assert labels == ["show the peak", "show the OOM", "what if…"]
    view.result.children[2].children[2].click()  # what if…: the replays run on the click
    assert not view.out.outputs, view.out.outputs
    assert view.what_if is not None and view.what_if.rows[0].result.oom_event_indices  # the recorded run OOMs
    view.close()


def test_steps_count_memviz_step_else_the_first_optimizer():
    torch = pytest.importorskip("torch")
    weight = torch.nn.Parameter(torch.ones(4))
    first, second = torch.optim.SGD([weight], lr=0.1), torch.optim.SGD([weight], lr=0.1)
    counter = StepCounter().start()
    try:
        for _ in range(3):
            weight.sum().backward()
            first.step()
            second.step()  # a second optimizer would count each step twice
        assert counter.count == 3 and not counter.explicit
        memviz.step()
        first.step()
        assert counter.count == 4 and counter.explicit  # from the loop's first step() on, only those count
    finally:
        counter.stop()
    memviz.step()  # no counter runs: nothing happens
    assert counter.count == 4


def test_a_job_records_a_stats_file_and_a_notebook_follows_it_live(tmp_path):
    lab = sim_lab()
    path = tmp_path / "stats.jsonl"
    follow = memviz.watch(path, interval_s=FAST)  # before the job starts: it waits for the file
    assert follow.samples.n == 0 and follow.view.gauges.title == ""  # the device is not known yet
    recorders = []

    def job():  # the training script, here in a thread (another process or machine works the same)
        with memviz.record(path, lab, interval_s=FAST) as rec:
            recorders.append(rec)
            leaky_loop(lab, 40, keep_graph=True, pause_s=0.01)

    thread = threading.Thread(target=job)
    thread.start()
    counts = []
    while thread.is_alive():
        counts.append(follow.samples.n)
        time.sleep(2 * FAST)
    for _ in range(100):  # the follower reads what the job flushed, within a few of its ticks
        if follow.source.ended:
            break
        time.sleep(FAST)
    follow.stop()
    rec = recorders[0]
    growing = sorted(set(counts) - {0})
    assert len(growing) >= 3, counts  # the follower's samples grew while the job ran
    assert rec.samples_written == follow.samples.n and follow.source.ended
    header = follow.source.header
    assert header["device"] == lab.backend.device_name and header["cap_bytes"] == 2 << 30
    assert follow.peak_allocated_bytes == 32 * STEP_BYTES and follow.steps == 32
    assert len(follow.ooms) == 1 and [p.name for p in rec.snapshots] == ["stats.jsonl.end.pickle"]
    assert follow.focus == "oom" and follow.history.events[follow.focus_index]["action"] == "oom"
    assert [(g.count, g.size_bytes) for g in follow.live] == [(32, STEP_BYTES)]
    assert follow.view.gauges.title == f"{lab.backend.device_name}: cap 2.00 GiB (2,147,483,648 B)"
    assert follow.view.viewer.index == follow.focus_index
    follow.view.close()


def test_a_snapshot_file_a_job_rewrites_is_followed_live(tmp_path):
    from memviz.sim import CachingAllocator

    path = tmp_path / "run.pickle"
    follow = memviz.watch(path, interval_s=FAST, show=False)
    allocator = CachingAllocator(16 << 30, memory_fraction=1 / 8, clock=lambda: time.time_ns() // 1000)  # 2 GiB

    def job():  # dumps its snapshot every 4 steps, as torch.cuda.memory._dump_snapshot would
        held = []
        for step in range(40):
            try:
                held.append(allocator.malloc(STEP_BYTES))
                allocator.free(allocator.malloc(8 * MiB))  # a spike between two dumps
            except OutOfMemoryError:
                break
            if step % 4 == 3:
                memviz.dump_snapshot(allocator, path)
            time.sleep(0.01)
        memviz.dump_snapshot(allocator, path)

    thread = threading.Thread(target=job)
    thread.start()
    counts = []
    while thread.is_alive():
        counts.append(follow.samples.n)
        time.sleep(FAST)
    follow.stop()
    assert len(set(counts) - {0}) >= 2, counts  # samples arrived while the job ran
    assert follow.source.loads >= 2
    assert follow.peak_allocated_bytes == allocator.max_memory_allocated()  # the trace holds every event: exact
    assert follow.peak_reserved_bytes == allocator.max_memory_reserved()
    assert len(follow.ooms) == 1 and follow.focus == "oom"
    assert follow.history.events[follow.focus_index]["action"] == "oom"
    assert follow.live[0].size_bytes == STEP_BYTES  # the held steps, the largest live at the OOM
    with pytest.raises(InputError, match="does not load as a snapshot"):
        (tmp_path / "bad.pickle").write_bytes(b"not a pickle")
        memviz.watch(tmp_path / "bad.pickle", show=False)


@pytest.mark.parametrize(("lines", "says"), [
    (["not json"], "line 1 is not JSON"),
    ([json.dumps({"format": "other"})], "line 1 is not a memviz stats header"),
    ([None, "[1, 2, 3]"], "line 2: a sample is 8 numbers"),
    ([None, json.dumps([0.1, 1, 2, 3, 4, 5, -1, "x"])], "line 2: a sample is 8 numbers"),
    ([None, json.dumps({"event": "boom"})], "line 2: expected a sample"),
])  # fmt: skip
def test_a_file_that_is_not_a_stats_file_is_refused_naming_the_line(tmp_path, lines, says):
    header = json.dumps({"format": "memviz-stats", "version": 1, "fields": list(FIELDS), "total_bytes": 1 << 30,
                         "cap_bytes": None, "device": "x", "pid": 1, "host": "h"})  # fmt: skip
    path = tmp_path / "bad.jsonl"
    text = "\n".join(header if line is None else line for line in lines) + "\n"
    path.write_text(text)
    with pytest.raises(InputError, match=says):
        StatsFollower(path)()
    with pytest.raises(InputError, match=says):  # a file there already is refused when the watch starts
        memviz.watch(path, show=False)
    later = tmp_path / "later.jsonl"
    w = memviz.watch(later, interval_s=FAST, show=False)  # one that turns bad later stops the sampling, saying why
    later.write_text(text)
    for _ in range(100):
        if w.error:
            break
        time.sleep(FAST)
    w.stop()
    assert says.replace("line", "later.jsonl: line") in w.error


def test_a_line_still_being_written_waits_for_its_end(tmp_path):
    path = tmp_path / "s.jsonl"
    follower = StatsFollower(path)
    assert follower() == [] and follower.header is None  # no file yet
    header = json.dumps({"format": "memviz-stats", "version": 1, "fields": list(FIELDS), "total_bytes": 1 << 30,
                         "cap_bytes": None})  # fmt: skip
    row = json.dumps([0.5, 1, 2, 3, 4, 5, -1, 7])
    path.write_text(header + "\n" + row[:10])
    assert follower() == [] and follower.header is not None
    with open(path, "a") as f:
        f.write(row[10:] + "\n")
    assert follower() == [Sample(0.5, 1, 2, 3, 4, 5, None, 7)]


def test_bad_arguments_are_refused_and_start_nothing():
    lab = sim_lab()
    threads = threading.active_count()
    for bad, error in [(dict(interval_s=0), InputError), (dict(interval_s="fast"), InputTypeError),
                       (dict(show="yes"), InputTypeError), (dict(max_entries=0), InputError)]:  # fmt: skip
        with pytest.raises(error):
            memviz.watch(lab, **bad)
    with pytest.raises(InputTypeError, match=r"a memviz\.Lab or a stats file"):
        memviz.watch(object())
    if not memviz.cuda_available():
        with pytest.raises(RuntimeError, match="no GPU here"):
            memviz.watch()
    with pytest.raises(InputError, match="does not exist"):
        memviz.record("/no/such/folder/stats.jsonl", lab)
    assert threading.active_count() == threads and len(lab.events) == 0
    w = memviz.watch(lab, interval_s=FAST, show=False)
    w.stop()
    with pytest.raises(InputError, match="has run already"):
        w.start()


def test_the_store_stays_bounded_and_thinning_keeps_the_peak():
    store = SampleStore(max_points=64)
    for i in range(1000):
        spike = 10_000 if i == 333 else 0
        store.add(Sample(i / 10, i + spike, i, i, 10_000 + 333 if i >= 333 else i, i, None, i))
    assert store.n <= 64 and store.offered == 1000 and store.stride == 16
    assert store.column("allocated_peak_bytes").max() == 10_333  # the spike's peak survives every thinning
    assert list(store.column("t_s")) == sorted(store.column("t_s"))


def test_the_cell_magic_watches_a_cell_and_keeps_its_last_value():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.user_ns.update(lab=sim_lab(), memviz=memviz, STEP_BYTES=STEP_BYTES)
    assert shell.run_cell("%load_ext memviz").success
    cell = "%%memviz lab -i 0.02 -o w\nfor _ in range(5):\n    lab.allocate(STEP_BYTES)\n    memviz.step()\nlen(lab)"
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec
    assert result.result == 5  # the cell's last value, shown as IPython shows it
    w = shell.user_ns["w"]
    assert w.steps == 5 and w.peak_allocated_bytes == 5 * STEP_BYTES and not w.running
    bad = shell.run_cell("%%memviz nosuchname\npass")
    assert isinstance(bad.error_in_exec, InputError)
