"""Time and peak memory of the hostile-input reproducers of issue 16, each in its own process.

A case's pickle is written to a file first (not counted); then every case runs in a fresh Python under
an address-space limit (``--as-gib``, default 2) and a wall-clock limit (``--timeout``, default 20 s), as
the held-out checks do, and prints its wall time, its peak RSS (``ru_maxrss`` of the child) and how it
ended (the exception's type and the start of its message)::

    .venv/bin/python benchmarks/bench_hostile.py            # every case
    .venv/bin/python benchmarks/bench_hostile.py shared deep # cases whose name contains a word
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time

_LOAD = "from memviz.snapshots import load_snapshot\n"

# name -> (Python code whose value is the pickle's bytes, written to a file before the case starts, or None;
#          the case's code, run under the limits, with FILE the path of that file)
CASES: dict[str, tuple[str | None, str]] = {
    # 1. one block and one segment referred to 10,000 times each: a 40 KB pickle
    "shared_refs_K=M=10000": (
        "pickle.dumps({'segments': [{'address': 0, 'total_size': 512 * 10000, 'blocks': "
        "[{'size': 512, 'state': 'inactive'}] * 10000}] * 10000, 'device_traces': [[]]}, protocol=4)",
        _LOAD + "load_snapshot(FILE)",
    ),
    # 2. a list nested 10^6 deep under an extra top-level key (2 MB)
    "deep_nesting_N=1e6": (
        "b'\\x80\\x04}(\\x8c\\x08segments]\\x8c\\x01x' + b']' * 10**6 + b'a' * (10**6 - 1) + b'u.'",
        _LOAD + "load_snapshot(FILE)",
    ),
    # 8. an endless device
    "dev_zero": (None, _LOAD + "load_snapshot('/dev/zero')"),
    "dev_urandom": (None, _LOAD + "load_snapshot('/dev/urandom')"),
    # 8. a 10 MB flat list where the segments go: the error is about segments[0]
    "flat_list_10MB": ("pickle.dumps({'segments': [0] * 5_000_000}, protocol=4)", _LOAD + "load_snapshot(FILE)"),
    # 8. 10 MB of distinct empty dicts, each built from 2 bytes
    "flat_dicts_10MB": ("pickle.dumps({'segments': [{} for _ in range(5_000_000)]}, protocol=4)",
                        _LOAD + "load_snapshot(FILE)"),
    # 8. a memo index of 2**31 asks the unpickler for a 16 GiB memo table (7 bytes)
    "memo_index_2**31": ("b'\\x80\\x04N' + b'r\\xff\\xff\\xff\\x7f' + b'.'", _LOAD + "load_snapshot(FILE)"),
    # a real snapshot (4.6 MB, 63,008 trace events), for scale
    "real_workload_4.6MB": (None, _LOAD + "load_snapshot('tests/data/snapshots/workload/workload_default.pickle')"),
    # 5. freeing a group of n tensors
    **{
        f"lab_free_group_{n}": (None, (
            "import time\nfrom memviz.lab import Lab\n"
            f"lab = Lab('sim', device='H200')\nlab.allocate(512, count={n}, name='g')\n"
            "t, c = time.perf_counter(), time.process_time(); lab.free('g')\n"
            "print(f'free: {time.perf_counter() - t:.2f} s ({time.process_time() - c:.2f} s CPU)')"
        ))
        for n in (50_000, 200_000, 524_288, 1_000_000)
    },
}


def run_case(code: str, as_bytes: int, timeout_s: float) -> tuple[float, int, str]:
    """Run ``code`` in a child Python; return (wall seconds, peak RSS bytes, how it ended)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))

    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=limit, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        ended = "ok"
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        ended = f"TIMEOUT after {timeout_s:g} s"
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # max over children so far
    lines = [line for line in out.strip().splitlines() if line.strip()]
    if ended == "ok" and proc.returncode:
        ended = lines[-1][:150] if lines else f"exit {proc.returncode}"
    elif lines:
        ended += " | " + lines[-1][:150]
    return wall, rss, ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("words", nargs="*", help="run only the cases whose name contains one of these")
    parser.add_argument("--as-gib", type=float, default=2.0, help="address-space limit per case (GiB)")
    parser.add_argument("--timeout", type=float, default=20.0, help="wall-clock limit per case (s)")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    tmp = tempfile.mkdtemp(prefix="bench_hostile_")
    for name in CASES:
        if args.words and not any(w in name for w in args.words):
            continue
        setup, code = CASES[name]
        if setup is not None:
            path = os.path.join(tmp, name + ".pickle")
            with open(path, "wb") as f:
                f.write(eval(setup, {"pickle": pickle}))  # the cases above, not input
            code = f"FILE = {path!r}\n" + code
        # a fresh runner per case, so that ru_maxrss (a maximum over children) is this case's
        runner = ("import sys; sys.path.insert(0, 'benchmarks'); import bench_hostile as b; "
                  f"w, r, e = b.run_case({code!r}, {int(args.as_gib * 2**30)}, {args.timeout}); "
                  "print(f'{w:7.2f} s  {r / 2**20:8.0f} MiB  {e}')")
        line = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True).stdout.strip()
        print(f"{name:24s} {line}", flush=True)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
