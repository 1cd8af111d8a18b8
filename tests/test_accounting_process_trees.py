"""Usage without cgroups: the pure sum of a tree's readings, and the reader on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from elasticd.accounting.process_trees import ProcessReading, read_process_trees, tree_sample


@pytest.mark.parametrize(("readings", "cpu", "memory", "read", "write"), [
    ([], 0, 0, 0, 0),  # no worker running: an idle tenant, zeros
    ([ProcessReading(1, 500, 10, 1, 2)], 500, 10, 1, 2),
    ([ProcessReading(1, 500, 10, 1, 2), ProcessReading(2, 250, 5, 3, 4)], 750, 15, 4, 6),
    ([ProcessReading(1, 500, 10, 1, 2), ProcessReading(2, 250, 5, None, None)], 750, 15, None, None),  # unknown ≠ 0
])
def test_a_tree_is_the_sum_of_its_processes(readings, cpu, memory, read, write):
    sample = tree_sample(readings, 7.0)
    assert (sample.ts, sample.cpu_usage_usec, sample.memory_bytes, sample.pids) == (7.0, cpu, memory, len(readings))
    assert (sample.io_read_bytes, sample.io_write_bytes) == (read, write)
    assert sample.io_pressure is None and sample.memory_events is None  # per cgroup only: not measured


SPINNER = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\ntime.sleep(60)\n"


def test_the_reader_follows_a_worker_into_its_children_and_reads_each_process_once():
    # A "worker" whose child spins 0.4 s of CPU and keeps 32 MiB: both are in the worker's tree.
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"subprocess.Popen([sys.executable, '-c', {SPINNER!r}])\n"
                               "block = bytearray(32 << 20)\ntime.sleep(60)\n"])
    try:
        deadline = time.monotonic() + 20
        while True:
            samples = read_process_trees({("tenant", "t"): [parent.pid, parent.pid], ("app", "t", "a"): []}, 1.0)
            tree = samples[("tenant", "t")]
            if tree.pids == 2 and (tree.cpu_usage_usec or 0) >= 400_000:
                break
            assert time.monotonic() < deadline, tree
            time.sleep(0.1)
        assert tree.memory_bytes is not None and tree.memory_bytes > 32 << 20
        if os.geteuid() == 0:  # /proc/PID/io of another's process is root's to read
            assert tree.io_read_bytes is not None and tree.io_write_bytes is not None
        assert samples[("app", "t", "a")].pids == 0  # no roots: an empty tree
        assert read_process_trees({("tenant", "gone"): [2**22 + 7]}, 1.0)[("tenant", "gone")].pids == 0
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
