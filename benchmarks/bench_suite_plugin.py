"""pytest plugin that records, for every test, where and when it ran and the CPU it used.

Load it with ``PYTHONPATH=. pytest -p benchmarks.bench_suite_plugin`` and set ``MEMVIZ_SUITE_LOG`` to a
directory; each process (each xdist worker, or the single process) appends one JSON line per test to
``<dir>/<worker>.jsonl``: ``file``, ``nodeid``, ``worker``, ``start_s``/``end_s`` (wall clock, seconds since the
epoch), ``cpu_self_s`` (user+sys of the worker process during the test, seconds) and ``cpu_children_s`` (user+sys
of child processes reaped during the test, e.g. a notebook's kernel, seconds). Setup and teardown of fixtures
count towards the test in which they happen. ``benchmarks/bench_suite.py`` summarises the logs.
"""

import json
import os
import resource
import time
from pathlib import Path

import pytest


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class _SuiteLog:
    def __init__(self, config: pytest.Config, directory: Path) -> None:
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{worker}.jsonl"
        self.worker = worker
        self.wrote_startup = False

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start_s = time.time()
        cpu_self = _cpu_s(resource.RUSAGE_SELF)
        cpu_children = _cpu_s(resource.RUSAGE_CHILDREN)
        if not self.wrote_startup:  # what the process spent before its first test: imports, collection
            with self.path.open("a") as log:
                log.write(json.dumps({
                    "file": "<start-up and collection>", "nodeid": "<start-up>", "worker": self.worker,
                    "start_s": None, "end_s": start_s, "cpu_self_s": cpu_self, "cpu_children_s": cpu_children,
                }) + "\n")
            self.wrote_startup = True
        yield
        record = {
            "file": item.nodeid.split("::")[0], "nodeid": item.nodeid, "worker": self.worker,
            "start_s": start_s, "end_s": time.time(),
            "cpu_self_s": _cpu_s(resource.RUSAGE_SELF) - cpu_self,
            "cpu_children_s": _cpu_s(resource.RUSAGE_CHILDREN) - cpu_children,
        }
        with self.path.open("a") as log:
            log.write(json.dumps(record) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    directory = os.environ.get("MEMVIZ_SUITE_LOG")
    if directory:
        config.pluginmanager.register(_SuiteLog(config, Path(directory)), "memviz-suite-log")
