"""A hosting host's density on a real elasticd (not timed: benchmarks/density_bench.py measures): 2,000 apps over
200 tenants, one file each, with a descriptor limit under which the old sampler (ten descriptors kept per cgroup,
22,000 here) ran out and starved the admin socket: the admin socket, the front and /metrics keep answering, and the
daemon keeps its descriptors well under the limit."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time

TENANTS, APPS, NOFILE = 200, 10, 4096


def _tenant_file(t: int, root) -> str:
    lines = ["tenants:", f"  t{t:03d}:", "    resources: {cpu: 50%}", "    apps:"]
    for a in range(APPS):
        lines += [f"      a{a}:", f"        domains: [a{a}.t{t:03d}.localhost]", f"        root: {root}",
                  "        groups:", "          main:", '            command: ["{python}", "-m", "elasticd.demo"]',
                  "            pool: {min_workers: 0, max_workers: 1}"]
    return "\n".join(lines) + "\n"


def test_2000_apps_under_a_low_descriptor_limit_keep_the_admin_socket_and_the_front_answering(daemons, tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    confd = tmp_path / "elastic.d"
    confd.mkdir(mode=0o755)
    for t in range(TENANTS):
        (confd / f"t{t:03d}.yaml").write_text(_tenant_file(t, root))
    d = daemons(f"include: [{confd}/*.yaml]\n", extra_server="  sample_interval: 1s\n")
    d.start(nofile=NOFILE, ready_timeout=120)
    # the sampler passes over 2,200 cgroups every second (a fake tree says nothing of populated: all read)
    status = d.status()
    assert len(status["tenants"]) == TENANTS
    code, body, _ = d.get("a3.t117.localhost", "/")
    assert code == 200, body  # the front: a cold start, answered
    conn = http.client.HTTPConnection("127.0.0.1", d.metrics_port, timeout=60)
    conn.request("GET", "/metrics")
    metrics = conn.getresponse()
    assert metrics.status == 200 and b"elasticd_tenant_cpu_usage_seconds_total" in metrics.read()
    conn.close()
    assert d.process is not None
    descriptors = len(os.listdir(f"/proc/{d.process.pid}/fd"))
    assert descriptors < NOFILE // 4, descriptors  # the channel sockets (one per tenant) and a bounded sampler
    reloaded = d.ctl("reload", "--json")
    assert reloaded.returncode == 0 and json.loads(reloaded.stdout)["ok"]
    assert "Too many open files" not in d.log_text()


def test_the_admin_socket_says_when_descriptors_run_low(daemons, tmp_path):
    """Descriptors held by something else (here 560 client connections to the front, under a limit of 600) eat into
    the reserve: the admin socket answers, and its status says so."""
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    d = daemons("tenants:\n  t0:\n    apps:\n      a0:\n        domains: [a0.localhost]\n"
                f"        root: {root}\n        groups:\n          main:\n            command: [x]\n"
                "            pool: {min_workers: 0}\n")
    d.start(nofile=600)
    held = []
    try:
        for _ in range(560):  # connections to the front, each a descriptor of the daemon's
            held.append(socket.create_connection(("127.0.0.1", d.port)))
        deadline = time.monotonic() + 30
        while True:
            status = d.status()
            if status["descriptors"]["low"] or time.monotonic() > deadline:
                break
        assert status["descriptors"]["low"], status["descriptors"]
        assert "descriptors: LOW" in d.ctl("status").stdout
    finally:
        for conn in held:
            conn.close()
