"""A hosting host's density: thousands of mostly idle apps over hundreds to thousands of tenants, one file per tenant,
under a real elasticd (``python -m elasticd.daemon``) on a fake cgroup tree whose counters move, with the shipped
unit's descriptor limit.

    .venv/bin/python benchmarks/density_bench.py [--sizes 1000/200,5000/1000,10000/2000] [--seconds 30]
        [--layout files|single] [--interval 5s] [--nofile 65536]

Each size is apps/tenants, every group at ``min_workers: 0`` (scale to zero), 5 apps per tenant at the defaults.
``--layout files`` puts each tenant in ``elastic.d/<tenant>.yaml`` (include:, tenant_config_dir); ``single`` keeps
them all in the main file, as a release without include: must (run it so on an older checkout, for the "before").

Per size it prints: READY after the start; a reload with nothing changed and with one tenant's file changed (SIGHUP
to READY=1, as ``systemctl reload`` waits); ``elasticctl tenant add`` of one more; the daemon's CPU while idle over
``--seconds`` with every cgroup's counters moving (the fake tree's: an unpopulated cgroup's would not move on a real
kernel, so the tree says ``populated 0``, as the kernel does for a cgroup with no process); its descriptors and RSS;
``/metrics``' time (median of 5) and size; the front's stall (``FrontProbe``: its own 404s, one after another, timed)
while quiet, while /metrics is scraped and during the reload; a cold start of one app; then the cost per app as the
count grows. Root: the descriptor limit is set as the unit sets it. Every process it starts is stopped by its pid (its
own session).
"""

from __future__ import annotations

import argparse
import http.client
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def tenant_yaml(t: int, apps: int, root: Path, cpu: int = 50) -> str:
    lines = [f"  tenant{t:04d}:", f"    resources: {{cpu: {cpu}%, memory: 256M, pids: 64}}", "    apps:"]
    for a in range(apps):
        lines += [f"      app{a:02d}:", f"        domains: [app{a:02d}.tenant{t:04d}.localhost]",
                  f"        root: {root}", "        groups:", "          main:",
                  '            command: ["{python}", "-m", "elasticd.demo"]',
                  "            pool: {min_workers: 0, max_workers: 2}"]
    return "\n".join(lines) + "\n"


@dataclass
class Host:
    where: Path
    tenants: int
    apps: int  # per tenant
    layout: str
    interval: str
    front: int
    metrics: int

    @property
    def main(self) -> Path:
        return self.where / "elastic.yaml"

    @property
    def confd(self) -> Path:
        return self.where / "elastic.d"

    def write(self) -> None:
        root = self.where / "root"
        root.mkdir(mode=0o755, exist_ok=True)
        server = ["server:", f"  listen: 127.0.0.1:{self.front}", f"  metrics_listen: 127.0.0.1:{self.metrics}",
                  f"  admin_socket: {self.where}/admin.sock", f"  runtime_dir: {self.where}/run",
                  f"  tmp_dir: {self.where}/tmp", f"  cgroups: {{mode: required, path: {self.where}/cg}}",
                  f"  sample_interval: {self.interval}"]
        if self.layout == "files":
            self.confd.mkdir(mode=0o755, exist_ok=True)
            server += [f"  tenant_config_dir: {self.confd}", f"  state_dir: {self.where}/state"]
            for t in range(self.tenants):
                (self.confd / f"tenant{t:04d}.yaml").write_text("tenants:\n" + tenant_yaml(t, self.apps, root))
            self.main.write_text("\n".join(server) + f"\ninclude: [{self.confd}/*.yaml]\n")
        else:
            self.main.write_text("\n".join(server) + "\ntenants:\n" + "".join(
                tenant_yaml(t, self.apps, root) for t in range(self.tenants)))

    def change_one(self, cpu: int) -> None:
        """Tenant 0's cpu: its own file, or its part of the main file."""
        root = self.where / "root"
        if self.layout == "files":
            (self.confd / "tenant0000.yaml").write_text("tenants:\n" + tenant_yaml(0, self.apps, root, cpu))
        else:
            text = self.main.read_text()
            old = tenant_yaml(0, self.apps, root)
            self.main.write_text(text.replace(old, tenant_yaml(0, self.apps, root, cpu), 1))


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


def drain(notify: socket.socket) -> None:
    while True:
        notify.settimeout(0.2)
        try:
            notify.recv(65536)
        except TimeoutError:
            return


def get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, bytes, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    finally:
        conn.close()


class FrontProbe:
    """Requests to the front, one after another on one kept-alive connection, for a host no app has (the front
    answers them itself, 404, in its event loop): how long the front stalls while the daemon does something else
    (a /metrics scrape, a reload). ``with`` runs it in a thread; ``latencies`` are seconds."""

    HOST = "nobody.localhost"

    def __init__(self, port: int) -> None:
        self.port = port
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FrontProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            while not self._stop.is_set():
                started = time.perf_counter()
                conn.request("GET", "/", headers={"Host": self.HOST})
                conn.getresponse().read()
                self.latencies.append(time.perf_counter() - started)
                time.sleep(0.001)
        finally:
            conn.close()

    def figures(self) -> tuple[float, float, float]:
        """(p50, p99, max) in seconds."""
        ordered = sorted(self.latencies) or [float("nan")]
        return (ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], ordered[-1])


def fake_tree(cg: Path, tenants: int, apps: int, tick: int) -> list[Path]:
    """Every tenant's and app's files, their counters at ``tick``, each saying it holds no process."""
    targets = []
    for t in range(tenants):
        tenant = cg / "tenants" / f"tenant{t:04d}"
        targets.append(tenant)
        targets += [tenant / f"app{a:02d}" for a in range(apps)]
    for i, target in enumerate(targets):
        state = fake_state(i, tick)
        if hasattr(state, "populated"):  # (an older checkout's fake tree, for the "before", has no cgroup.events)
            state.populated = False
        write_fake_cgroup(target, state)
    return targets


def reload_time(pid: int, notify: socket.socket) -> float:
    drain(notify)
    started = time.monotonic()
    os.kill(pid, signal.SIGHUP)
    return wait_ready(notify, 120) - started


def measure(apps_total: int, tenants: int, args: argparse.Namespace) -> dict[str, Any]:
    per_tenant = max(1, apps_total // tenants)
    with tempfile.TemporaryDirectory(prefix="density-") as tmp:
        host = Host(Path(tmp), tenants, per_tenant, args.layout, args.interval, free_port(), free_port())
        host.write()
        cg = host.where / "cg"
        cg.mkdir()
        (cg / "cgroup.controllers").write_text("cpu memory pids io\n")
        (cg / "cgroup.procs").write_text("")
        # The tree as the kernel would show it from the first tick: every cgroup there, none holding a process.
        fake_tree(cg, tenants, per_tenant, 0)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(host.where / "notify.sock"))
        env = {**os.environ, "PYTHONPATH": str(REPO), "NOTIFY_SOCKET": str(host.where / "notify.sock")}
        ctl = [sys.executable, "-m", "elasticd.ctl", "--socket", str(host.where / "admin.sock")]
        log = open(host.where / "elasticd.log", "wb")  # noqa: SIM115 - closed below

        def limits() -> None:
            # The unit's limit where this machine allows it (raising the hard limit needs CAP_SYS_RESOURCE).
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            limit = args.nofile if hard == resource.RLIM_INFINITY else min(args.nofile, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        started = time.monotonic()
        daemon = subprocess.Popen([sys.executable, "-m", "elasticd.daemon", "--config", str(host.main)], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=limits)
        result: dict[str, Any] = {}
        try:
            result["ready"] = wait_ready(notify, 600) - started
            proc = psutil.Process(daemon.pid)
            fake_tree(cg, tenants, per_tenant, 0)
            result["reload_none"] = reload_time(daemon.pid, notify)
            host.change_one(60)
            with FrontProbe(host.front) as reloading:
                result["reload_one"] = reload_time(daemon.pid, notify)
            result["probe_reload"] = reloading.figures()
            if args.layout == "files":
                new = host.where / "new.yaml"
                body = tenant_yaml(9999, per_tenant, host.where / "root").split("\n", 1)[1]
                new.write_text("".join(line[4:] + "\n" for line in body.splitlines()))
                began = time.monotonic()
                added = subprocess.run([*ctl, "tenant", "add", "tenant9999", str(new)], capture_output=True,
                                       text=True, timeout=300, env=env)
                result["tenant_add"] = time.monotonic() - began if added.returncode == 0 else float("nan")
                if added.returncode != 0:
                    print(f"    (tenant add refused: {added.stderr.strip()[:300]})")
            # The steady state: past every cgroup's first two reads (the one as it goes idle, at the start, and the
            # writeback's, within a minute after: accounting/cadence.py), which a start pays once.
            time.sleep(max(0.0, started + result["ready"] + 65 - time.monotonic()))
            cpu_before = sum(proc.cpu_times()[:2])
            began = time.monotonic()
            tick = 0
            while time.monotonic() - began < args.seconds:
                tick += 1
                fake_tree(cg, tenants, per_tenant, tick)  # (this script's CPU, not the daemon's)
                time.sleep(max(0.0, tick * args.move_every - (time.monotonic() - began)))
            window = time.monotonic() - began
            result["idle_cpu"] = (sum(proc.cpu_times()[:2]) - cpu_before) / window
            result["fds"] = proc.num_fds()
            result["rss"] = proc.memory_info().rss
            with FrontProbe(host.front) as quiet:
                time.sleep(3.0)
            result["probe_quiet"] = quiet.figures()
            with FrontProbe(host.front) as scraped:
                scrapes = [get(host.metrics, "/metrics") for _ in range(5)]
            result["probe_scraped"] = scraped.figures()
            result["metrics_s"] = statistics.median(s for _, _, s in scrapes)
            result["metrics_bytes"] = max(len(b) for _, b, _ in scrapes)
            result["series"] = max(sum(1 for line in b.splitlines() if line and not line.startswith(b"#"))
                                   for _, b, _ in scrapes)
            began = time.monotonic()
            status, _body, _ = get(host.front, "/", host="app00.tenant0001.localhost")
            result["cold_start"] = time.monotonic() - began if status == 200 else float("nan")
            status, _body, _ = get(host.metrics, "/metrics")
            admin = subprocess.run([*ctl, "status", "--json"], capture_output=True, timeout=120, env=env)
            result["admin_ok"] = float(admin.returncode == 0)
            result["log_lines"] = len((host.where / "elasticd.log").read_bytes().splitlines())
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)  # our daemon's own session
            try:
                daemon.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
            log.close()
            notify.close()
            if args.keep_log:
                print((host.where / "elasticd.log").read_text(errors="replace")[-3000:])
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000/200,5000/1000,10000/2000", help="apps/tenants, comma-separated")
    parser.add_argument("--seconds", type=float, default=30.0, help="the idle window the daemon's CPU is read over")
    parser.add_argument("--layout", choices=("files", "single"), default="files")
    parser.add_argument("--interval", default="5s", help="server.sample_interval (default 5s, the shipped one)")
    parser.add_argument("--move-every", type=float, default=5.0, help="seconds between two moves of the counters")
    parser.add_argument("--nofile", type=int, default=65536, help="the descriptor limit (the unit's LimitNOFILE)")
    parser.add_argument("--keep-log", action="store_true", help="print the end of each daemon's log")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < args.nofile:
        print(f"(this machine's hard descriptor limit is {hard}: the daemon runs with {hard}, not {args.nofile}; "
              f"the percentages are of {args.nofile}, the unit's)")
    rows = []
    for size in args.sizes.split(","):
        apps, tenants = (int(n) for n in size.split("/"))
        print(f"{apps} apps over {tenants} tenants ({args.layout}, sample_interval {args.interval}, "
              f"LimitNOFILE {args.nofile})", flush=True)
        try:
            r = measure(apps, tenants, args)
        except Exception as exc:  # a size that fails is a figure too: say it and go on
            print(f"  failed: {exc}")
            continue
        rows.append((apps, tenants, r))
        print(f"  READY after                {r['ready']:8.2f} s      (goal < 10 s at 10,000 apps)")
        print(f"  reload, nothing changed    {r['reload_none']:8.2f} s")
        print(f"  reload, one tenant changed {r['reload_one']:8.2f} s      (goal < 0.5 s)")
        if "tenant_add" in r:
            print(f"  elasticctl tenant add      {r['tenant_add']:8.2f} s      (with elasticctl's own start)")
        print(f"  idle CPU                   {r['idle_cpu'] * 100:8.2f} % of a core (goal < 5 %; counters moving)")
        print(f"  descriptors                {r['fds']:8.0f}        ({r['fds'] / args.nofile * 100:.1f} % of "
              f"{args.nofile}; goal < 10 %)")
        print(f"  RSS                        {r['rss'] / 2**20:8.1f} MB     (goal < 300 MB)")
        print(f"  /metrics                   {r['metrics_s'] * 1000:8.1f} ms     {r['metrics_bytes'] / 2**20:.2f} MB, "
              f"{r['series']:.0f} series (goal < 1 s and < 10 MB)")
        for label, key in (("quiet", "probe_quiet"), ("/metrics scraped", "probe_scraped"),
                           ("a reload (one tenant)", "probe_reload")):
            p50, p99, most = r[key]
            print(f"  the front, {label + ':':22} p50 {p50 * 1000:6.2f} ms, p99 {p99 * 1000:7.2f} ms, "
                  f"max {most * 1000:7.2f} ms")
        print(f"  a cold start               {r['cold_start']:8.2f} s")
        print(f"  admin socket answered      {'yes' if r['admin_ok'] else 'NO'}; {r['log_lines']:.0f} log lines")
    if rows:
        print("cost per app as the count grows:")
        print("  apps   tenants  idle CPU µs/s  descriptors  RSS KB   /metrics bytes  reload-one ms")
        for apps, tenants, r in rows:
            print(f"  {apps:6d} {tenants:7d}  {r['idle_cpu'] / apps * 1e6:13.2f}  {r['fds'] / apps:11.3f}  "
                  f"{r['rss'] / apps / 1024:6.1f}  {r['metrics_bytes'] / apps:14.0f}  {r['reload_one'] * 1000:13.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
