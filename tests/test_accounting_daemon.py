"""Accounting through the real daemon on a fake tree: counters written by the test come back through
/metrics, GET /v1/tenants/usage and elasticctl high --json."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from elasticd.accounting.fake import FakeCgroup, write_fake_cgroup

TENANTS = """\
tenants:
  acme:
    resources: {{cpu: 150%, memory: 1G}}
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green: {{command: ["{{python}}", "-m", "elasticd.demo"]}}
  globex:
    resources: {{cpu: 50%}}
    apps:
      blog:
        domains: [blog.localhost]
        root: {root}
        groups:
          main: {{command: ["{{python}}", "-m", "elasticd.demo"]}}
"""


def _metrics(d) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def _wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_counters_reach_metrics_usage_and_high(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path), extra_server="  sample_interval: 200ms\n")
    d.start()
    acme = d.cgroup / "tenants" / "acme"
    write_fake_cgroup(acme, FakeCgroup(usage_usec=3_000_000, user_usec=2_000_000, system_usec=1_000_000,
                                       nr_throttled=7, throttled_usec=500_000, memory_current=256 * 1024**2,
                                       memory_events={"oom_kill": 2}, pids_current=12,
                                       io={"254:0": (4096, 8192, 1, 2), "8:0": (1, 1, 1, 1)},
                                       pressure={"io": (1.5, 2_000_000, 0.5, 1_000_000)}))
    write_fake_cgroup(acme / "shop", FakeCgroup(usage_usec=1_000_000, memory_current=1024))
    expected = [
        'elasticd_tenant_cpu_usage_seconds_total{tenant="acme"} 3.0',
        'elasticd_tenant_memory_bytes{tenant="acme"} 2.68435456e+08',
        'elasticd_tenant_memory_limit_bytes{tenant="acme"} 1.073741824e+09',
        'elasticd_tenant_memory_events_total{event="oom_kill",tenant="acme"} 2.0',
        'elasticd_tenant_pids{tenant="acme"} 12.0',
        'elasticd_tenant_io_read_bytes_total{tenant="acme"} 4097.0',
        'elasticd_tenant_io_write_bytes_total{tenant="acme"} 8193.0',
        'elasticd_tenant_cpu_throttled_seconds_total{tenant="acme"} 0.5',
        'elasticd_tenant_pressure_io_waiting_seconds_total{tenant="acme"} 2.0',
        'elasticd_tenant_pressure_io_stalled_seconds_total{tenant="acme"} 1.0',
        'elasticd_app_cpu_usage_seconds_total{app="shop",tenant="acme"} 1.0',
        "elasticd_build_info{",
    ]
    # A file the sampler found missing is retried after 1, 2, 4, then every 8 ticks: wait for all of them.
    try:
        _wait_for(lambda: all(line in _metrics(d) for line in expected))
    except AssertionError:
        text = _metrics(d)
        raise AssertionError(f"missing: {[line for line in expected if line not in text]}") from None

    # Usage: the test burns "CPU" in the fake file at 30% of one CPU while the daemon samples twice.
    stop = threading.Event()

    def burn():
        usage = 3_000_000
        while not stop.is_set():
            usage += 15_000
            write_fake_cgroup(acme, FakeCgroup(usage_usec=usage, memory_current=256 * 1024**2), only=("cpu.stat",))
            time.sleep(0.05)

    burner = threading.Thread(target=burn, daemon=True)
    burner.start()
    try:
        result = d.ctl("high", "--json", "--interval-ms", "1000", "--apps")
    finally:
        stop.set()
        burner.join()
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout)
    acme_usage = usage["tenants"]["acme"]
    assert 15 < acme_usage["cpu_percent"] < 45, acme_usage
    assert acme_usage["cpu_limit_percent"] == 150
    assert acme_usage["memory_bytes"] == 256 * 1024**2
    assert acme_usage["memory_limit_bytes"] == 1024**3
    assert "shop" in acme_usage["apps"]
    table = d.ctl("high", "--sort", "memory")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("TENANT"))
    assert lines[header + 1].split()[0] == "acme", table.stdout  # the widest consumer first


def test_usage_refuses_bad_intervals(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path))
    d.start()
    for bad in ("5", "99999999", "soon"):
        result = d.ctl("high", "--interval-ms", bad)
        assert result.returncode in (1, 2)
        assert "interval" in result.stderr


def test_high_without_cgroups_measures_the_worker_process_trees_and_says_so(daemons, tmp_path):
    """`./dev run` from a shell: no delegated cgroup, yet "who uses what, now" has an answer, marked as such."""
    d = daemons(TENANTS.format(root=tmp_path), mode="off")
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: any(w["state"] == "running" for w in ws))
    d.wait_workers("globex", "blog", "main", lambda ws: any(w["state"] == "running" for w in ws))
    sampled = threading.Event()

    def spin() -> None:  # acme's worker spins in its handler until high has sampled (its start-up may be slow)
        while not sampled.is_set():
            d.get("shop.localhost", "/cpu?ms=400")

    busy = threading.Thread(target=spin)
    busy.start()
    try:
        time.sleep(0.3)
        result = d.ctl("high", "--json", "--apps", "--interval-ms", "1500")
    finally:
        sampled.set()
        busy.join()
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["measured"] == "process trees" and report["why"] == "server.cgroups.mode is off"
    assert "sum of RSS" in report["note"] and "nothing enforces them" in report["note"]
    acme, globex = report["tenants"]["acme"], report["tenants"]["globex"]
    assert acme["cpu_percent"] > 20, acme  # the handler's spinning, as the worker's own CPU time
    assert globex["cpu_percent"] < acme["cpu_percent"] / 2, report
    assert acme["memory_bytes"] > 10 * 1024**2 and acme["cpu_limit_percent"] == 150.0  # a Python worker's RSS
    assert acme["apps"]["shop"]["memory_bytes"] == acme["memory_bytes"]  # its only app
    assert acme["io_pressure_avg10"] is None  # PSI is per cgroup: not measured, not 0
    table = d.ctl("high")
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("no cgroups to read: server.cgroups.mode is off\n"
                                   "measured instead from each tenant's worker process trees: ")
