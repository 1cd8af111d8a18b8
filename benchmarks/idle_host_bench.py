"""A host of many idle tenants, as scale to zero makes possible: ``--tenants`` times ``--apps`` apps, every group at
``min_workers: 0``, under a real elasticd (``python -m elasticd.daemon``) on a fake cgroup tree.

    .venv/bin/python benchmarks/idle_host_bench.py [--tenants 100] [--apps 10] [--seconds 20]

Measures the time from the start to READY=1 (its sd_notify, on a socket of this script's), a reload's round trip
(``elasticctl reload``), the daemon's RSS, its CPU per sampler tick and cgroup with the fake tree's counters
moving between ticks (an upper bound: the daemon's whole CPU over the window), and ``/metrics`` over HTTP; then
one cold start of one app. Goals (issue 15): READY in under 5 s, a reload under 1 s, RSS under 150 MB, the
sampler under 30 µs of CPU per cgroup per tick and a scrape under 100 ms (issue 4's). Every process it starts is
stopped by its pid (its own session).
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from sampler_bench import fake_state  # noqa: E402

from elasticd.accounting.fake import write_fake_cgroup  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(where: Path, tenants: int, apps: int, front: int, metrics: int) -> str:
    lines = ["server:", f"  listen: 127.0.0.1:{front}", f"  metrics_listen: 127.0.0.1:{metrics}",
             f"  admin_socket: {where}/admin.sock", f"  runtime_dir: {where}/run",
             f"  cgroups: {{mode: required, path: {where}/cg}}", "  sample_interval: 1s", "tenants:"]
    for t in range(tenants):
        lines += [f"  tenant{t:03d}:", "    apps:"]
        for a in range(apps):
            lines += [f"      app{a:02d}:", f"        domains: [app{a:02d}.tenant{t:03d}.localhost]",
                      f"        root: {where}/root", "        groups:", "          main:",
                      '            command: ["{python}", "-m", "elasticd.demo"]',
                      "            pool: {min_workers: 0, max_workers: 2}"]
    return "\n".join(lines) + "\n"


def wait_ready(notify: socket.socket, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        notify.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            message = notify.recv(65536).decode()
        except TimeoutError:
            break
        if "READY=1" in message.split("\n"):
            return time.monotonic()
    raise RuntimeError("elasticd did not say READY=1")


def get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, bytes, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--apps", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20.0, help="the window the sampler's CPU is measured over")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="idle-host-") as tmp:
        where = Path(tmp)
        (where / "root").mkdir(mode=0o755)
        cg = where / "cg"
        cg.mkdir()
        (cg / "cgroup.controllers").write_text("cpu memory pids io\n")
        (cg / "cgroup.procs").write_text("")
        front, metrics = free_port(), free_port()
        path = where / "elastic.yaml"
        path.write_text(config(where, args.tenants, args.apps, front, metrics))
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(where / "notify.sock"))
        env = {**os.environ, "PYTHONPATH": str(REPO), "NOTIFY_SOCKET": str(where / "notify.sock")}
        log = open(where / "elasticd.log", "wb")  # noqa: SIM115 - closed below
        started = time.monotonic()
        daemon = subprocess.Popen([sys.executable, "-m", "elasticd.daemon", "--config", str(path)], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready = wait_ready(notify, 120) - started
            apps = args.tenants * args.apps
            proc = psutil.Process(daemon.pid)
            # The tree elasticd made, with counters the sampler parses, moving between its ticks.
            leaves = [cg / "tenants" / f"tenant{t:03d}" / f"app{a:02d}" for t in range(args.tenants)
                      for a in range(args.apps)]
            tenants = [cg / "tenants" / f"tenant{t:03d}" for t in range(args.tenants)]
            targets = [*tenants, *leaves]
            for i, target in enumerate(targets):
                write_fake_cgroup(target, fake_state(i, 0))
            ctl = [sys.executable, "-m", "elasticd.ctl", "--socket", str(where / "admin.sock")]
            reload_started = time.monotonic()
            reloaded = subprocess.run([*ctl, "reload"], capture_output=True, text=True, timeout=120, env=env)
            reload_seconds = time.monotonic() - reload_started
            if reloaded.returncode != 0:
                raise RuntimeError(f"reload failed: {reloaded.stderr}")
            # The daemon's own part, as systemctl reload sees it: SIGHUP, then RELOADING=1 ... READY=1.
            while True:  # (what the ctl reload said is read already)
                notify.settimeout(0.2)
                try:
                    notify.recv(65536)
                except TimeoutError:
                    break
            hup_started = time.monotonic()
            os.kill(daemon.pid, signal.SIGHUP)
            hup_seconds = wait_ready(notify, 60) - hup_started
            cpu_before = sum(proc.cpu_times()[:2])
            window_started = time.monotonic()
            tick = 0
            while time.monotonic() - window_started < args.seconds:
                tick += 1
                for i, target in enumerate(targets):  # (this script's CPU, not the daemon's)
                    write_fake_cgroup(target, fake_state(i, tick))
                time.sleep(1.0)
            window = time.monotonic() - window_started
            cpu = sum(proc.cpu_times()[:2]) - cpu_before
            ticks = window / 1.0  # sample_interval 1s
            rss = proc.memory_info().rss
            scrapes = [get(metrics, "/metrics") for _ in range(10)]
            cold_started = time.monotonic()
            status, body, _ = get(front, "/", host="app00.tenant000.localhost")
            cold = time.monotonic() - cold_started
            print(f"{apps} apps over {args.tenants} tenants, every group at min_workers 0 "
                  f"({len(targets)} cgroups sampled)")
            print(f"  READY=1 after        {ready:6.2f} s    (goal < 5 s)")
            print(f"  a reload             {hup_seconds:6.2f} s    (goal < 1 s; SIGHUP to READY=1, as systemctl reload "
                  f"waits; elasticctl reload's round trip with its own start: {reload_seconds:.2f} s)")
            print(f"  RSS                  {rss / 2**20:6.1f} MB   (goal < 150 MB)")
            print(f"  CPU per cgroup, tick {cpu / ticks / len(targets) * 1e6:6.1f} µs   (goal < 30 µs; the daemon's "
                  f"whole CPU over {window:.0f} s: an upper bound)")
            sizes = {len(b) for _, b, _ in scrapes}
            print(f"  /metrics over HTTP   {statistics.median(s for _, _, s in scrapes) * 1000:6.1f} ms   (goal "
                  f"< 100 ms; median of 10, {max(sizes) / 1024:.0f} KiB)")
            print(f"  a cold start         {cold:6.2f} s    (the first request of app00.tenant000: {status}, "
                  f"{body.decode(errors='replace').strip()})")
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)  # our daemon's own session
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
            log.close()
            notify.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
