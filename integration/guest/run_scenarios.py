#!/usr/bin/env python3
"""elasticd's VM suite, run INSIDE the guest (Debian bookworm, systemd 252 as PID 1, a real cgroup v2 tree).

Started at boot by the image's driver unit (integration/image/files/…/elasticd-it.service) as
``python3 /mnt/host/guest/run_scenarios.py --share /mnt/host``, where /mnt/host is the host's 9p share
holding the freshly built .deb and this directory. It installs the .deb with apt, runs each scenario and
writes one JSON result per scenario into <share>/results/ (``NN-name.json``: ok, the figure it measured,
details, the error), then ``done``. The driver unit powers the guest off when this script ends.

Plain python3 and the standard library only: this judges elasticd from the outside, the way an operator
would, through systemctl, the journal, the front (HTTP with Host headers), the admin socket and the files
in /sys/fs/cgroup/system.slice/elasticd.service/.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

UNIT = "elasticd.service"
CONFIG = Path("/etc/elastic.yaml")
CGROOT = Path("/sys/fs/cgroup")
BASE = CGROOT / "system.slice" / UNIT  # the unit's cgroup: systemd delegates it (Delegate=yes)
ADMIN_SOCKET = "/run/elasticd/admin.sock"
FRONT = ("127.0.0.1", 8080)
WANTED = {"cpu", "memory", "pids", "io"}
MiB = 1 << 20
SCENARIO_TIMEOUT = 300  # seconds; the host's timeout bounds the whole run as well


class Failed(Exception):
    """A scenario's assertion did not hold (the message says what was measured)."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise Failed(message)


def say(message: str) -> None:
    print(message, flush=True)


# ------------------------------------------------------------------------------------------------ shell


def run(argv: list[str], timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def systemctl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return run(["systemctl", *args], timeout=timeout)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.monotonic()
    value = fn()
    return value, time.monotonic() - start


def show(*props: str) -> dict[str, str]:
    out = systemctl("show", UNIT, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def is_active() -> bool:
    return systemctl("is-active", "--quiet", UNIT).returncode == 0


def main_pid() -> int:
    return int(show("MainPID")["MainPID"])


def journal_cursor() -> str:
    out = run(["journalctl", "--no-pager", "-n", "0", "--show-cursor"]).stdout
    match = re.search(r"-- cursor: (\S+)", out)
    check(match, f"journalctl gave no cursor: {out!r}")
    return match.group(1)


def journal_since(cursor: str, unit: str = UNIT) -> str:
    # journald takes stream lines asynchronously: a short settle time before reading.
    time.sleep(0.5)
    return run(["journalctl", "--no-pager", "-o", "cat", "-u", unit, f"--after-cursor={cursor}"]).stdout


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


# ------------------------------------------------------------------------------------------------ cgroupfs


def read(path: Path) -> str:
    return path.read_text(encoding="ascii").strip()


def read_kv(path: Path) -> dict[str, int]:
    """cpu.stat, memory.events, pids.events: "key value" lines."""
    values = {}
    for line in read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def procs(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in read(cgroup / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def subtree(cgroup: Path) -> set[str]:
    return set(read(cgroup / "cgroup.subtree_control").split())


def cgroups_under(root: Path) -> list[Path]:
    return sorted(Path(d) for d, _, _ in os.walk(root))


def layout() -> dict[str, str]:
    """The unit's subtree as {relative path: its cgroup.subtree_control}; systemd's own ``.control``
    child (where it runs ExecReload= of a delegated unit) is not elasticd's."""
    found = {}
    for cg in cgroups_under(BASE):
        rel = str(cg.relative_to(BASE))
        if not any(part.startswith(".") for part in Path(rel).parts):
            found[rel] = " ".join(sorted(subtree(cg)))
    return found


def workers_in_leaves(st: dict[str, Any]) -> dict[str, int]:
    """{tenant/app: running workers}, each checked to be in its leaf."""
    counts = {}
    for (tenant, app), pids in worker_pids(st).items():
        members = procs(leaf(tenant, app))
        check(all(pid in members for pid in pids), f"workers {pids} of {tenant}/{app} are not all in its "
              f"leaf ({members})")
        counts[f"{tenant}/{app}"] = len(pids)
    return counts


def disk_of(path: str) -> str:
    """The whole disk under ``path`` as MAJ:MIN (io.max takes disks, not partitions)."""
    dev = os.stat(path).st_dev
    entry = Path("/sys/dev/block", f"{os.major(dev)}:{os.minor(dev)}")
    if (entry / "partition").exists():
        return read(Path(os.path.realpath(entry)).parent / "dev")
    return f"{os.major(dev)}:{os.minor(dev)}"


# ------------------------------------------------------------------------------------------------ elasticd's APIs


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30) -> None:
        super().__init__("elasticd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def status() -> dict[str, Any]:
    """GET /v1/status on the admin socket (what `elasticctl status --json` prints, without its start-up
    cost, which is seconds under TCG)."""
    conn = _UnixHTTPConnection(ADMIN_SOCKET)
    try:
        conn.request("GET", "/v1/status")
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    check(response.status == 200, f"GET /v1/status answered {response.status}: {body[:200]!r}")
    return json.loads(body)


def workers(st: dict[str, Any], tenant: str, app: str) -> list[dict[str, Any]]:
    groups = st["tenants"][tenant]["apps"][app]["groups"]
    return [w for group in groups.values() for w in group["workers"]]


def worker_pids(st: dict[str, Any]) -> dict[tuple[str, str], list[int]]:
    return {(t, a): sorted(w["pid"] for w in workers(st, t, a))
            for t, tenant in st["tenants"].items() for a in tenant["apps"]}


def front(host: str, path: str, timeout: float = 60) -> tuple[int | None, bytes]:
    """A request through elasticd's front, routed by its Host header. (None, error) when the connection
    itself failed."""
    conn = http.client.HTTPConnection(*FRONT, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {exc}".encode()
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------ configs

# The suite's tenants, one per limit under test: (tenant, app, resources, workers). Pools are pinned
# (min = max) so that nothing but the scenario changes how many workers run.
SUITE_APPS = [
    ("acme", "shop", "{cpu: %(acme_cpu)s, memory: %(acme_memory)s, swap: 0, pids: 128}", 2),
    ("globex", "blog", "{cpu: 50%%, memory: 256M}", 1),
    ("cpu", "burn", "{cpu: 20%%}", 1),
    ("mem", "hog", "{memory: 64M, swap: 0}", 1),
    ("pids", "forker", "{pids: 32}", 1),
    ("io", "writer", "{io_bandwidth: {write: 1M}}", 1),
]

_SERVER = """\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {mode: %(mode)s}
  stop_timeout: 5s
tenants:
"""

_APP = """\
  %(tenant)s:
    resources: %(resources)s
    apps:
      %(app)s:
        domains: [%(app)s.localhost]
        root: /srv/%(tenant)s/%(app)s
        groups:
          main:
            command: ["{python}", "-m", "elasticd.demo"]
            env: {DEMO_GREETING: "%(greeting)s"}
            pool: {min_workers: %(n)d, max_workers: %(n)d}
"""


def suite_config(acme_cpu: str = "50%", acme_memory: str = "256M", blog_greeting: str = "hello from globex",
                 mode: str = "required") -> str:
    values = {"acme_cpu": acme_cpu, "acme_memory": acme_memory}
    text = _SERVER % {"mode": mode}
    for tenant, app, resources, n in SUITE_APPS:
        greeting = blog_greeting if tenant == "globex" else f"hello from {tenant}"
        text += _APP % {"tenant": tenant, "app": app, "resources": resources % values, "n": n,
                        "greeting": greeting}
    return text


def small_config(mode: str) -> str:
    return _SERVER % {"mode": mode} + _APP % {"tenant": "solo", "app": "web", "resources": "{cpu: 50%}",
                                              "n": 1, "greeting": "hello from solo"}


def write_config(text: str) -> None:
    """As an editor would: a new file renamed over the old one."""
    tmp = CONFIG.with_name(CONFIG.name + ".it-new")
    tmp.write_text(text)
    os.replace(tmp, CONFIG)


def start_with(text: str) -> float:
    """(Re)start elasticd on ``text``; the seconds `systemctl restart` took (it returns after READY=1)."""
    write_config(text)
    systemctl("reset-failed", UNIT)
    result, seconds = timed(lambda: systemctl("restart", UNIT))
    check(result.returncode == 0, f"systemctl restart {UNIT} failed: {result.stderr.strip()}\n"
          + systemctl("status", UNIT, "--no-pager", "-l", "-n", "30").stdout)
    if text == suite_config():
        all_running(SUITE_APPS)
    return seconds


def ensure_suite() -> None:
    """elasticd active on the suite's config: each scenario can run on its own (e.g. --only)."""
    if is_active() and CONFIG.read_text() == suite_config():
        st = status()
        if st["cgroups"]["enforced"] and all(w["state"] == "running" for t, a, _, _ in SUITE_APPS
                                             for w in workers(st, t, a)):
            return
    start_with(suite_config())


def all_running(apps: list[tuple[str, str, str, int]], timeout: float = 60) -> tuple[dict[str, Any], float]:
    """Wait until every worker of ``apps`` runs; (the status, seconds waited). READY=1 comes once the
    workers are routable or after the supervisor's 30 s start wait, and under TCG a cold start of seven
    Python workers on two emulated CPUs can come near that: slowness of the emulator is waited out here,
    a worker that never comes up still fails the check that follows."""
    start = time.monotonic()

    def ready() -> dict[str, Any] | None:
        st = status()
        ok = all(len(workers(st, t, a)) == n and all(w["state"] == "running" for w in workers(st, t, a))
                 for t, a, _, n in apps)
        return st if ok else None

    st = wait_for(ready, timeout, 0.5) or status()
    return st, time.monotonic() - start


def leaf(tenant: str, app: str) -> Path:
    return BASE / "tenants" / tenant / app


# ------------------------------------------------------------------------------------------------ scenarios
# Each returns (figure, details) or raises Failed. The figure is the one line the host's table shows.


def s_install(share: Path) -> tuple[str, dict[str, Any]]:
    debs = sorted(share.glob("elasticd_*_all.deb"))
    check(len(debs) == 1, f"expected one elasticd_*_all.deb in the share, found {[d.name for d in debs]}")
    # A copy readable by apt's unprivileged download user, so apt needs no "unsandboxed" fallback.
    deb = Path("/tmp") / debs[0].name
    shutil.copyfile(debs[0], deb)
    deb.chmod(0o644)
    # No network in the guest: the Depends are already installed from Debian in the image, and apt
    # resolves the package's relations against them (a missing or too old one fails here).
    result, seconds = timed(lambda: run(["apt-get", "install", "-y", "--no-install-recommends", str(deb)],
                                        timeout=600, env={"DEBIAN_FRONTEND": "noninteractive"}))
    check(result.returncode == 0, f"apt-get install failed ({result.returncode}):\n{result.stdout[-3000:]}"
          f"\n{result.stderr[-3000:]}")
    fields = run(["dpkg-query", "-W", "-f=${Version}\t${Status}\t${Depends}\t${Conffiles}", "elasticd"]).stdout
    version, state, depends, conffiles = fields.split("\t")
    check(state == "install ok installed", f"dpkg says elasticd is {state!r}")
    check("/etc/elastic.yaml" in conffiles, f"/etc/elastic.yaml is not a conffile: {conffiles!r}")
    for path in ("/usr/bin/elasticd", "/usr/bin/elasticctl", "/lib/systemd/system/elasticd.service"):
        check(os.access(path, os.R_OK), f"{path} is missing")
    deps = {}
    for name in re.findall(r"(python3-[a-z.-]+)", depends):
        deps[name] = run(["dpkg-query", "-W", "-f=${Version}", name]).stdout
    return (f"apt-get install {deb.name}: {seconds:.1f}s, elasticd {version}; Depends met by Debian's "
            + ", ".join(f"{k} {v}" for k, v in sorted(deps.items())),
            {"apt_output": result.stdout[-2000:], "depends": depends, "conffiles": conffiles.strip()})


def s_start() -> tuple[str, dict[str, Any]]:
    systemctl("stop", UNIT)
    write_config(suite_config())
    systemctl("reset-failed", UNIT)
    result, seconds = timed(lambda: systemctl("start", UNIT))
    check(result.returncode == 0, f"systemctl start failed: {result.stderr.strip()}")
    props = show("ActiveState", "SubState", "MainPID", "StatusText", "Type")
    check(props["ActiveState"] == "active" and props["SubState"] == "running", f"unit is {props}")
    pid = int(props["MainPID"])
    check(pid in procs(BASE / "server"), f"elasticd (pid {pid}) is not in {BASE / 'server'}: "
          f"server holds {procs(BASE / 'server')}, the unit's cgroup holds {procs(BASE)}")
    try:
        delegate = os.getxattr(BASE, "trusted.delegate").decode()
    except OSError as exc:
        delegate = f"absent ({exc.strerror})"
    st, late = all_running(SUITE_APPS)
    check(st["cgroups"]["enforced"], f"elasticd does not enforce: {st['cgroups']}")
    wanted = WANTED & set(read(CGROOT / "cgroup.controllers").split())
    inner = [BASE, BASE / "tenants"] + [BASE / "tenants" / t for t, *_ in SUITE_APPS]
    for node in inner:
        have = subtree(node)
        check(wanted <= have, f"{node}/cgroup.subtree_control is {sorted(have)}, expected {sorted(wanted)}")
        check(not procs(node), f"processes {procs(node)} sit in the inner node {node}")
    in_leaves = 0
    for tenant, app, _, n in SUITE_APPS:
        path = leaf(tenant, app)
        check(path.is_dir(), f"{path} does not exist")
        ws = workers(st, tenant, app)
        check(len(ws) == n and all(w["state"] == "running" for w in ws), f"{tenant}/{app} workers: {ws}")
        members = procs(path)
        for w in ws:
            check(w["pid"] in members, f"worker {w['id']} (pid {w['pid']}) is not in {path} ({members})")
        in_leaves += len(ws)
    # Every process of the unit, wherever it is: only in server/, a leaf, or systemd's own .control.
    leaves = {leaf(t, a) for t, a, *_ in SUITE_APPS}
    for cg in cgroups_under(BASE):
        if procs(cg) and cg != BASE / "server" and cg not in leaves and not cg.name.startswith("."):
            raise Failed(f"processes {procs(cg)} in {cg}, which is neither server/ nor an app leaf")
    waited = f" (+{late:.1f}s until all ran)" if late >= 1 else ""
    return (f"active {seconds:.1f}s after `systemctl start` (Type=notify, READY=1, status "
            f"\"{props['StatusText']}\"){waited}; elasticd pid {pid} in server/; {len(leaves)} leaves with {in_leaves} "
            f"workers, all in their leaf; subtree_control \"{' '.join(sorted(wanted))}\" at the base, "
            f"tenants/ and each tenant, 0 processes in those {len(inner)} inner nodes; "
            f"trusted.delegate={delegate}",
            {"layout": layout(), "status_text": props["StatusText"]})


def _usage(cgroup: Path) -> int:
    return read_kv(cgroup / "cpu.stat")["usage_usec"]


def s_cpu() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "cpu", leaf("cpu", "burn")
    check(read(tenant / "cpu.max") == "20000 100000", f"cpu.max is {read(tenant / 'cpu.max')!r}")
    stat0, leaf0 = read_kv(tenant / "cpu.stat"), read_kv(app / "cpu.stat")
    answer: dict[str, Any] = {}
    burn = threading.Thread(target=lambda: answer.update(r=front("burn.localhost", "/cpu?ms=5000", 120)))
    samples = [(time.monotonic(), _usage(app))]
    burn.start()
    while burn.is_alive():
        time.sleep(0.1)
        samples.append((time.monotonic(), _usage(app)))
    stat1, leaf1 = read_kv(tenant / "cpu.stat"), read_kv(app / "cpu.stat")
    code, body = answer["r"]
    check(code == 200, f"/cpu?ms=5000 answered {code}: {body[:300]!r}")
    # The burn's span: from the last idle sample before usage first rose to the last sample where it rose.
    rising = [i for i in range(1, len(samples)) if samples[i][1] > samples[i - 1][1]]
    check(rising, "the leaf's cpu.stat usage_usec never grew")
    begin, end = samples[rising[0] - 1][0], samples[rising[-1]][0]
    # The middle of it, 0.5 s in from each end: start-up and the response are not the steady state.
    inside = [s for s in samples if begin + 0.5 <= s[0] <= end - 0.5]
    check(len(inside) >= 2 and inside[-1][0] - inside[0][0] >= 2.0,
          f"burn too short to measure: {end - begin:.2f}s of rising usage")
    (t0, u0), (t1, u1) = inside[0], inside[-1]
    rate = (u1 - u0) / 1e6 / (t1 - t0)
    throttled = stat1["nr_throttled"] - stat0["nr_throttled"]
    leaf_throttled = leaf1.get("nr_throttled", 0) - leaf0.get("nr_throttled", 0)
    figure = (f"cpu {rate:.3f} s/s in the leaf over the middle {t1 - t0:.1f}s of a {end - begin:.1f}s burn "
              f"(limit 0.200 ±25%); nr_throttled +{throttled} in the tenant (where cpu.max is; leaf "
              f"+{leaf_throttled}), throttled_usec +{stat1['throttled_usec'] - stat0['throttled_usec']}")
    check(0.15 <= rate <= 0.25, f"usage grew by {rate:.3f} s/s, not 0.2 ±25%: {figure}")
    check(throttled > 0, f"nr_throttled did not grow: {figure}")
    return figure, {"rate": rate, "nr_throttled": throttled, "window_s": t1 - t0, "samples": len(samples),
                    "worker_answer": json.loads(body)}


def s_memory() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "mem", leaf("mem", "hog")
    check(read(tenant / "memory.max") == str(64 * MiB), f"memory.max is {read(tenant / 'memory.max')}")
    check(read(tenant / "memory.swap.max") == "0", f"memory.swap.max is {read(tenant / 'memory.swap.max')}")
    main = main_pid()
    (before,) = workers(status(), "mem", "hog")
    kills0 = read_kv(app / "memory.events")["oom_kill"]
    start = time.monotonic()
    code, body = front("hog.localhost", "/mem?mb=200", timeout=90)
    check(code != 200, f"the worker held 200 MB under a 64 MiB limit: {body[:300]!r}")
    kills = wait_for(lambda: read_kv(app / "memory.events")["oom_kill"] > kills0 and
                     read_kv(app / "memory.events")["oom_kill"], 10)
    check(kills, f"memory.events oom_kill stayed {kills0} in {app}")
    events = read_kv(tenant / "memory.events")

    def restarted() -> dict[str, Any] | None:
        (w,) = workers(status(), "mem", "hog")
        return w if w["state"] == "running" and w["pid"] not in (None, before["pid"]) else None

    after = wait_for(restarted, 60, 0.5)
    check(after, f"the worker was not restarted: {workers(status(), 'mem', 'hog')}")
    back = time.monotonic() - start
    check(after["pid"] in procs(app), f"the new worker (pid {after['pid']}) is not in {app}")
    check(is_active() and main_pid() == main, f"elasticd did not survive: active={is_active()}, "
          f"MainPID {main_pid()} (was {main})")
    kernel = [line for line in run(["dmesg"]).stdout.splitlines() if "oom-kill:" in line or
              "Memory cgroup out of memory" in line]
    peak = read(app / "memory.peak") if (app / "memory.peak").exists() else "n/a"
    # systemd sees the unit's oom_kill too; OOMPolicy= decides whether that stops elasticd (it must not).
    policy = show("OOMPolicy")["OOMPolicy"]
    return (f"oom_kill {kills0}→{kills} in the leaf (tenant: oom {events.get('oom', 0)}, oom_kill "
            f"{events.get('oom_kill', 0)}; memory.max 64 MiB, swap.max 0, leaf memory.peak "
            f"{int(peak) / MiB:.1f} MiB); the request got {code}; worker pid {before['pid']}→{after['pid']} "
            f"running again {back:.1f}s after the request (restarts {after['restarts']}); elasticd pid {main} "
            f"still active (OOMPolicy={policy})",
            {"kernel": kernel[-4:], "answer": body[:300].decode(errors="replace")})


def s_pids() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "pids", leaf("pids", "forker")
    check(read(tenant / "pids.max") == "32", f"pids.max is {read(tenant / 'pids.max')}")
    main = main_pid()
    # Kernel 6.1 counts a refused fork in pids.events "max" of the forking task's own cgroup (the leaf),
    # not of the ancestor whose pids.max refused it (pids.events.local arrived later): read both.
    max0 = {cg: read_kv(cg / "pids.events").get("max", 0) for cg in (tenant, app)}
    code, body = front("forker.localhost", "/fork?n=100", timeout=180)
    check(code == 200, f"/fork?n=100 answered {code}: {body[:300]!r}")
    answer = json.loads(body)
    current = int(read(tenant / "pids.current"))
    leaf_hits, tenant_hits = (read_kv(cg / "pids.events").get("max", 0) - max0[cg] for cg in (app, tenant))
    hits = leaf_hits + tenant_hits
    figure = (f"{answer['started']} of 100 forks succeeded, {answer['failed']} failed "
              f"({answer['error']}); pids.current {current}/32, pids.events max +{leaf_hits} in the leaf "
              f"(+{tenant_hits} in the tenant)")
    check(answer["failed"] > 0 and answer["started"] < 32, f"the limit did not bite: {figure}")
    check(current <= 32 and hits > 0, f"pids accounting: {figure}")
    check(is_active() and main_pid() == main, f"elasticd did not survive: {figure}")
    code_self, _ = front("forker.localhost", "/")
    code_other, _ = front("shop.localhost", "/")
    check(code_self == 200 and code_other == 200, f"the front stopped answering: forker {code_self}, "
          f"shop {code_other}")
    return figure + f"; elasticd pid {main} still active, the front still answers (200)", answer


def s_io() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "io", leaf("io", "writer")
    root = "/srv/io/writer"
    disk = disk_of(root)
    lines = [line for line in read(tenant / "io.max").splitlines() if line.split()[0] == disk]
    check(lines and "wbps=1048576" in lines[0].split() and "rbps=max" in lines[0].split(),
          f"io.max for {disk} is {lines}: {read(tenant / 'io.max')!r}")

    def written() -> int:
        for line in read(app / "io.stat").splitlines():
            if line.split()[0] == disk:
                return read_kv_line(line).get("wbytes", 0)
        return 0

    w0 = written()
    code, body = front("writer.localhost", f"/io?mb=8&path={root}", timeout=180)
    check(code == 200, f"/io?mb=8 answered {code}: {body[:300]!r}")
    answer = json.loads(body)
    grown = written() - w0
    figure = (f"io.max \"{lines[0]}\" on the disk under {root}; 8 MiB written (fsync per MiB) in "
              f"{answer['seconds']:.1f}s = {answer['mb_per_s']} MiB/s; the leaf's io.stat wbytes "
              f"+{grown / MiB:.1f} MiB")
    check(answer["seconds"] >= 6, f"the write was not held to 1 MiB/s: {figure}")
    check(grown >= 8 * MiB, f"the writes were not charged to the leaf: {figure}")
    return figure, answer


def read_kv_line(line: str) -> dict[str, int]:
    return {k: int(v) for k, _, v in (f.partition("=") for f in line.split()[1:]) if v.isdigit()}


def s_reload() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    acme = BASE / "tenants" / "acme"
    main = main_pid()
    pids0 = worker_pids(status())
    cpu0, mem0 = read(acme / "cpu.max"), read(acme / "memory.max")
    # New limits for acme; globex's group changes its environment (so its workers are replaced);
    # every other group is untouched.
    write_config(suite_config(acme_cpu="70%", acme_memory="320M", blog_greeting="hello again"))
    result, seconds = timed(lambda: systemctl("reload", UNIT))
    cpu1, mem1 = read(acme / "cpu.max"), read(acme / "memory.max")  # right when the reload returned
    check(result.returncode == 0, f"systemctl reload failed: {result.stderr.strip()}")
    check(cpu1 == "70000 100000" and mem1 == str(320 * MiB),
          f"when the reload returned: cpu.max {cpu1!r}, memory.max {mem1!r}")
    pids1 = worker_pids(status())
    kept = [k for k in pids0 if k != ("globex", "blog")]
    for key in kept:
        check(pids1[key] == pids0[key], f"{'/'.join(key)} workers {pids0[key]} became {pids1[key]}")
    check(set(pids1[("globex", "blog")]).isdisjoint(pids0[("globex", "blog")]),
          f"globex/blog's changed group was not replaced: {pids0[('globex', 'blog')]}")
    # A broken file: the reload fails, the unit stays active, nothing changes, the error is shown.
    cursor = journal_cursor()
    write_config(suite_config(acme_cpu="15O%", acme_memory="320M", blog_greeting="hello again"))
    bad, bad_seconds = timed(lambda: systemctl("reload", UNIT))
    error = '"15O%" is not a percentage'
    cpu2, mem2 = read(acme / "cpu.max"), read(acme / "memory.max")
    shown = systemctl("status", UNIT, "--no-pager", "-l", "-n", "40").stdout
    journal = journal_since(cursor)
    detail = {"status": shown, "journal": journal, "stderr": bad.stderr}
    check(bad.returncode != 0, f"systemctl reload of a broken file succeeded: {bad.stdout}")
    check(is_active() and main_pid() == main, "the unit did not stay active with the same elasticd")
    check(cpu2 == cpu1 and mem2 == mem1, f"a refused reload changed the files: cpu.max {cpu2}, memory.max {mem2}")
    check(worker_pids(status()) == pids1, "a refused reload changed workers")
    check(error in shown, f"`systemctl status elasticd` does not show {error}:\n{shown}")
    check(error in journal, f"the journal does not have {error}:\n{journal}")
    line = next(ln.strip() for ln in journal.splitlines() if error in ln)
    # Back to the suite's file, so the next scenario finds elasticd as ensure_suite() wants it.
    write_config(suite_config())
    restored = systemctl("reload", UNIT)
    check(restored.returncode == 0, f"reload back to the suite's file failed: {restored.stderr.strip()}")
    return (f"reload returned in {seconds:.1f}s with cpu.max {cpu0!r}→{cpu1!r}, memory.max {int(mem0) // MiB}M→"
            f"{int(mem1) // MiB}M already written; {len(kept)} untouched groups kept their "
            f"{sum(len(pids1[k]) for k in kept)} worker pids, globex/blog (env changed) was replaced; broken "
            f"file: reload exit {bad.returncode} after {bad_seconds:.1f}s, unit active, old values kept, "
            f"status and journal show \"{line}\"", detail)


def _unit_processes() -> list[str]:
    """Every process whose cgroup is the unit's or under it, from /proc (not from the unit's cgroup, which
    systemd may have removed)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cgroup = (entry / "cgroup").read_text()
            except OSError:
                continue
            if f"/system.slice/{UNIT}" in cgroup:
                found.append(f"{entry.name} {cgroup.strip()}")
    return found


def s_stop_start() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    before, workers_before = layout(), workers_in_leaves(status())
    main = main_pid()
    result, stop_s = timed(lambda: systemctl("stop", UNIT))
    check(result.returncode == 0, f"systemctl stop failed: {result.stderr.strip()}")
    check(not is_active(), "the unit is still active after stop")
    left = _unit_processes()
    check(not left, f"processes left in the unit's cgroup after stop: {left}")
    if BASE.exists():
        populated = read(BASE / "cgroup.events")
        check("populated 0" in populated, f"{BASE} still populated: {populated}")
        after_stop = "empty"
    else:
        after_stop = "removed by systemd"
    result, start_s = timed(lambda: systemctl("start", UNIT))
    check(result.returncode == 0, f"systemctl start failed: {result.stderr.strip()}")
    after, workers_after = layout(), workers_in_leaves(all_running(SUITE_APPS)[0])
    check(after == before, f"the cgroups differ after a restart:\nbefore {before}\nafter  {after}")
    check(workers_after == workers_before, f"workers per leaf before {workers_before}, after {workers_after}")
    new_main = main_pid()
    check(new_main != main and new_main in procs(BASE / "server"), f"elasticd pid {new_main} not in server/")
    inner = [rel for rel, controls in after.items() if controls]
    return (f"stop in {stop_s:.1f}s left 0 processes (cgroup {after_stop}); start in {start_s:.1f}s rebuilt the "
            f"same layout: {len(after)} cgroups, the same subtree_control in its {len(inner)} inner nodes, "
            f"{sum(workers_after.values())} workers in their {len(workers_after)} leaves, elasticd pid "
            f"{main}→{new_main} in server/", {"layout": after, "workers": workers_after})


DROPIN = Path(f"/run/systemd/system/{UNIT}.d/50-it-mode.conf")


def _with_dropin(text: str | None) -> None:
    if text is None:
        DROPIN.unlink(missing_ok=True)
    else:
        DROPIN.parent.mkdir(parents=True, exist_ok=True)
        DROPIN.write_text(text)
    systemctl("daemon-reload")


def _refused_start(mode_config: str, dropin: str) -> tuple[str, float]:
    systemctl("stop", UNIT)
    systemctl("reset-failed", UNIT)
    _with_dropin(dropin)
    write_config(mode_config)
    cursor = journal_cursor()
    result, seconds = timed(lambda: systemctl("start", UNIT))
    journal = journal_since(cursor)
    # Restart=on-failure would try again every 2 s: stop that before looking further.
    systemctl("stop", UNIT)
    systemctl("reset-failed", UNIT)
    check(result.returncode != 0, f"elasticd started with mode required, {dropin.strip()!r}")
    refusals = [ln.strip() for ln in journal.splitlines() if "refusing to start" in ln]
    check(refusals, f"the journal does not say why it refused:\n{journal}")
    return refusals[0], seconds


def s_modes() -> tuple[str, dict[str, Any]]:
    # A read-only base: ProtectControlGroups=yes gives the service a read-only /sys/fs/cgroup, so its own
    # (delegated, trusted.delegate=1) cgroup is not writable, the real case of a hardened unit.
    readonly = "[Service]\nProtectControlGroups=yes\n"
    try:
        why_ro, ro_s = _refused_start(small_config("required"), readonly)
        check("not writable" in why_ro, f"the refusal does not say the base is not writable: {why_ro}")
        # auto on the same read-only base: one warning, then it serves (unenforced).
        write_config(small_config("auto"))
        cursor = journal_cursor()
        result = systemctl("start", UNIT)
        check(result.returncode == 0, f"mode auto did not start: {result.stderr.strip()}")
        code, body = front("web.localhost", "/")
        journal = journal_since(cursor)
        warnings = [ln.strip() for ln in journal.splitlines() if "NOT enforced" in ln]
        st = status()
        check(code == 200 and b"worker solo.web.main.1" in body, f"mode auto does not serve: {code} {body!r}")
        check(not st["cgroups"]["enforced"], f"elasticd claims to enforce on a read-only base: {st['cgroups']}")
        check(len(warnings) == 1, f"expected one warning, the journal has {len(warnings)}:\n{journal}")
        # Not delegated at all (a drop-in that turns Delegate= off): refused, naming that.
        why_nd, _ = _refused_start(small_config("required"), "[Service]\nDelegate=no\n")
        check("not delegated" in why_nd, f"the refusal does not say the cgroup is not delegated: {why_nd}")
    finally:
        _with_dropin(None)
        systemctl("stop", UNIT)
        systemctl("reset-failed", UNIT)
    return (f"required, read-only base (ProtectControlGroups=yes): start failed after {ro_s:.1f}s: \"{why_ro}\"; "
            f"auto there: 1 warning (\"{warnings[0][:90]}…\"), then served {code} unenforced; "
            f"required with Delegate=no: \"{why_nd}\"", {"auto_journal": journal})


def s_verify() -> tuple[str, dict[str, Any]]:
    path = show("FragmentPath")["FragmentPath"]
    result = run(["systemd-analyze", "verify", path])
    output = (result.stdout + result.stderr).strip()
    check(result.returncode == 0 and not output,
          f"systemd-analyze verify {path}: exit {result.returncode}:\n{output}")
    version = run(["systemctl", "--version"]).stdout.splitlines()[0]
    return f"systemd-analyze verify {path}: exit 0, no output ({version})", {}


SCENARIOS: list[tuple[str, str, Callable[[], tuple[str, dict[str, Any]]]]] = [
    ("01-start", "systemctl start: READY=1, elasticd in server/, workers in leaves", s_start),
    ("02-cpu", "cpu: 20% holds a burning worker to 0.2 s/s", s_cpu),
    ("03-memory", "memory: 64M, swap: 0: a 200 MB worker is OOM-killed in its leaf and restarted", s_memory),
    ("04-pids", "pids: 32: forks beyond it fail", s_pids),
    ("05-io", "io_bandwidth write 1M: io.max on the disk, 8 MiB take >= 6 s", s_io),
    ("06-reload", "systemctl reload: new values on return, pids kept; a broken file changes nothing", s_reload),
    ("07-stop-start", "systemctl stop leaves nothing; start rebuilds the layout", s_stop_start),
    ("08-modes", "required refuses where the base is not writable; auto warns once and serves", s_modes),
    ("09-verify", "systemd-analyze verify on the shipped unit reports nothing", s_verify),
]


# ------------------------------------------------------------------------------------------------ driver


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def _record(results: Path, name: str, title: str, fn: Callable[[], tuple[str, dict[str, Any]]]) -> bool:
    say(f"=== {name}: {title}")
    start = time.monotonic()
    outcome: dict[str, Any] = {"scenario": name, "title": title, "ok": False, "figure": "", "error": None,
                               "details": {}}
    signal.alarm(SCENARIO_TIMEOUT)
    try:
        figure, details = fn()
        outcome.update(ok=True, figure=figure, details=details)
    except Failed as exc:
        outcome["error"] = str(exc)
    except _Timeout:
        outcome["error"] = f"timed out after {SCENARIO_TIMEOUT}s"
    except Exception:  # the scenario's own bug: report it like a failure, with the trace
        outcome["error"] = traceback.format_exc()
    finally:
        signal.alarm(0)
    outcome["seconds"] = round(time.monotonic() - start, 1)
    (results / f"{name}.json").write_text(json.dumps(outcome, indent=2, default=str))
    verdict = "ok" if outcome["ok"] else "FAILED"
    say(f"=== {name}: {verdict} ({outcome['seconds']}s): {outcome['figure'] or outcome['error']}")
    return outcome["ok"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--share", type=Path, required=True)
    args = parser.parse_args()
    results = args.share / "results"
    results.mkdir(exist_ok=True)
    options = json.loads((args.share / "guest" / "options.json").read_text()) \
        if (args.share / "guest" / "options.json").exists() else {}
    only = options.get("only") or []
    chosen = [s for s in SCENARIOS if not only or any(s[0].startswith(o) or o in s[0] for o in only)]
    signal.signal(signal.SIGALRM, _alarm)
    began = time.monotonic()
    (results / "plan.json").write_text(json.dumps(["00-install"] + [s[0] for s in chosen]))
    for tenant, app, _, _ in [*SUITE_APPS, ("solo", "web", "", 1)]:
        Path("/srv", tenant, app).mkdir(parents=True, exist_ok=True)
    passed = failed = 0
    if _record(results, "00-install", "apt-get install the .deb (Depends resolved by apt)",
               lambda: s_install(args.share)):
        passed += 1
        for name, title, fn in chosen:
            if _record(results, name, title, fn):
                passed += 1
            else:
                failed += 1
    else:
        failed += 1
    # For a person reading a failure on the host: the whole journal of this boot.
    with open(results / "journal.txt", "w") as out:
        subprocess.run(["journalctl", "-b", "--no-pager", "-o", "short-monotonic"], stdout=out,
                       stderr=subprocess.STDOUT, check=False)
    seconds = round(time.monotonic() - began, 1)
    (results / "done").write_text(json.dumps({"passed": passed, "failed": failed, "seconds": seconds}))
    os.sync()
    say(f"=== suite done in {seconds}s: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
