"""A hostile tenant against its neighbour (issue 27, "Proof, as figures"): what each attack costs the other tenant.

    .venv/bin/python benchmarks/neighbour_bench.py [--duration 10] [--connections 10] [--settle 3] [--rounds 1]
                                                   [--only reports,stdout] [--no-users] [--keep] [--tree DIR]

Starts elasticd (``python -m elasticd.daemon --config FILE``, on a fake cgroup tree, loopback only) with two
tenants: the neighbour, ``good`` (the demo app ``python -m elasticd.demo``, one worker, ``concurrency: 16``, no
quota), and the attacker, ``evil`` (``tests/apps/hostile_worker.py``, one worker, the example's quota: 64
concurrent requests, 100/s, burst 200). Run as root, each tenant runs as a throw-away Unix user of its own
(``tenants.<t>.user``, made with useradd at the start and removed with userdel at the end), with Debian's
``/usr/bin/python3`` and this checkout on its PYTHONPATH, as ``tests/test_tenant_users.py`` does (the venv's own
interpreter lives under /root, which those users cannot search); when that cannot work (not root, no useradd,
another python3 version, a checkout those users cannot read) it says why and runs both tenants as root.

Then for each attack (the baseline ``burn`` first: the attacker only burns a core; then ``reports``, ``garbage``,
``longlines``, ``channel-all``, ``unannounced``, ``stdout``, ``slowloris`` and ``unread``, which issue 27 did not
list, and ``listeners``, issue 43's: connections to elasticd's metrics listener; see the worker's docstring for
each), on a fresh elasticd:

1. start elasticd with the attacker burning a core, wait until both apps answer through the front, warm the
   neighbour up (1 s of wrk), read elasticd's open descriptors and RSS ("before");
2. switch the attacker's worker to the attack, let it run ``--settle`` seconds (3), then measure the neighbour
   through the front with ``wrk -t2 -c10 -d10s --latency -H 'Host: good.localhost'``: its requests per second and
   p99; over the wrk window elasticd's CPU (user + system of the daemon's own process, /proc/PID/stat) and the
   attacker's (its worker's process tree); its descriptors (/proc/PID/fd) and RSS, the peak of samples every
   0.25 s ("during");
3. switch the attacker back to ``burn`` (the attack stops, the worker and its core burning stay), wait
   ``--settle`` seconds and read descriptors and RSS again ("after": back to the baseline?); stop elasticd.

The switch is the worker's own: it polls a control file (``$HOSTILE_CONTROL``) naming its attack. A reload with
the attack in the group's env would replace the worker, and the old one would drain meanwhile (two attackers at
once, for as long as the drain takes); the control file switches within 0.1 s with the same process, so the
window measured holds exactly one attack, and "after" is the attack stopping, not a new worker starting. A fresh
elasticd for each attack keeps one attack's leftovers (descriptors never closed, memory never given back) out of
the next one's figures; it costs a few seconds each.

It prints a table (attack | rps | x baseline | p99 ms | x baseline | errors | elasticd CPU % | attacker CPU % |
fds before/during/after | RSS MiB before/during/after), what each attack did (the worker's own counters: lines
sent, reconnects, refused announces…, and how much elasticd's log grew), and the goal per attack: throughput >= 0.9x
and p99 <= 1.5x of the baseline, descriptors (within 5) and RSS (within 10% or 5 MiB) back to "before" after.
``--rounds N`` repeats the set and prints the medians. ``--tree DIR`` runs elasticd and the demo from another
checkout (e.g. ``git archive HEAD | tar -x -C /tmp/head``: the last commit, beside the work tree's changes).
On this machine's 2 cores, the attacker's core, wrk, elasticd and the demo share them: the baseline already
includes that contention. Without cgroup enforcement (a fake tree) the attacker's own CPU would not be capped by its
tenant's limit, so the attacker (its worker and every part of an attack) is confined to the last CPU
(``$HOSTILE_CPUS``), as a cpu.max of one core would hold it: every row burns the same CPU as the baseline.

Needs: wrk (``apt-get install -y wrk``: installed with apt when missing and run as root), and for tenant users,
root, useradd/userdel and setpriv. Loopback only; everything is bounded in time (each wait has a deadline, wrk
runs ``--duration``); every process it started (elasticd, and through it the workers) is stopped by its pid at the
end, also on Ctrl-C, and leftover workers are killed by pid; the users it made are removed in a finally.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOSTILE = REPO / "tests" / "apps" / "hostile_worker.py"
SYSTEM_PYTHON = "/usr/bin/python3"
# The attacker runs on the last CPU only (``$HOSTILE_CPUS``), the baseline's burn as much as every attack's parts:
# a fake cgroup tree holds nothing, and one CPU stands for a tenant held to one core by its cpu.max. So each row
# burns the same CPU, and what differs is only what the attack makes elasticd do.
ATTACKER_CPUS = str((os.cpu_count() or 1) - 1)
GOOD_HOST = "good.localhost"
EVIL_HOST = "evil.localhost"
ATTACKS = ("burn", "reports", "garbage", "longlines", "channel-all", "unannounced", "stdout", "slowloris", "unread",
           "listeners")
NOFILE = 65536  # elasticd.service's LimitNOFILE=
FD_SLACK, RSS_SLACK_MIB, RSS_SLACK_SHARE = 5, 5.0, 0.10


@dataclass(slots=True)
class Sample:
    fds: int
    rss_mib: float


@dataclass(slots=True)
class Row:
    attack: str
    rps: float = 0.0
    p99_ms: float = 0.0
    requests: int = 0
    errors: int = 0
    cpu: float = 0.0  # elasticd's own process, % of one core over the wrk window
    attacker_cpu: float = 0.0  # the attacker's worker tree, % of one core over the wrk window
    before: Sample = field(default_factory=lambda: Sample(0, 0.0))
    during: Sample = field(default_factory=lambda: Sample(0, 0.0))
    after: Sample = field(default_factory=lambda: Sample(0, 0.0))
    log_mib: float = 0.0  # what elasticd's log grew by from the switch to the attack until "after"
    counters: dict[str, Any] = field(default_factory=dict)  # the attacker's own, at the end of the window
    note: str = ""


# ------------------------------------------------------------------------------------------ /proc


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes (those still there), from /proc/PID/stat."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def start_time(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat_fields(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, ppid in parents.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sample(pid: int) -> Sample:
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return Sample(fds, rss_kb / 1024)


class PeakSampler:
    """Descriptors and RSS of a process every ``every`` seconds, keeping the peak of each, in a thread."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every = pid, every
        self.peak = Sample(0, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                now = sample(self.pid)
                self.peak = Sample(max(self.peak.fds, now.fds), max(self.peak.rss_mib, now.rss_mib))
            if self._stop.wait(self.every):
                return


# ------------------------------------------------------------------------------------------ tenant users


@dataclass(slots=True)
class Tenants:
    """How the two tenants run: their users (None: as root) and interpreters."""

    good_user: str | None = None
    evil_user: str | None = None
    python: str = sys.executable
    pythonpath: str = str(REPO)  # where the demo finds elasticd (the tree measured, and the venv's packages)
    tree: Path = REPO  # the elasticd measured
    made: list[str] = field(default_factory=list)
    why_not: str = ""


def _run_quiet(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def make_tenant_users(tenants: Tenants) -> None:
    """Two throw-away system users, when root can make them and they can run the apps from this checkout; else
    ``why_not`` says why the tenants run as root. The users made are in ``made`` (removed by remove_users)."""
    if os.geteuid() != 0:
        tenants.why_not = "not root"
        return
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        tenants.why_not = "no useradd or setpriv"
        return
    try:
        version = _run_quiet([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"]).stdout.strip()
    except OSError:
        version = ""
    if version != str(sys.version_info[:2]):
        tenants.why_not = f"{SYSTEM_PYTHON} is {version or 'missing'}, not this venv's {sys.version_info[:2]}"
        return
    site = sysconfig.get_paths()["purelib"]
    for role in ("good", "evil"):
        name = f"elt{role}{secrets.token_hex(3)}"
        made = _run_quiet(["useradd", "--system", "--user-group", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", name])
        if made.returncode != 0:
            tenants.why_not = f"useradd failed: {made.stderr.strip()}"
            return
        tenants.made.append(name)
    good, evil = tenants.made
    pythonpath = f"{site}:{tenants.tree}"
    checks = [(good, [SYSTEM_PYTHON, "-c", "import elasticd.demo, aiohttp"]),
              (evil, [SYSTEM_PYTHON, str(HOSTILE), "--help"])]
    for user, argv in checks:
        uid = _run_quiet(["id", "-u", user]).stdout.strip()
        gid = _run_quiet(["id", "-g", user]).stdout.strip()
        probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv],
                               capture_output=True, text=True, timeout=60, cwd="/",
                               env={"PATH": os.defpath, "PYTHONPATH": pythonpath})
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["?"])[-1]
            tenants.why_not = f"user {user} cannot run {' '.join(argv[:2])} from this checkout: {last}"
            return
    tenants.good_user, tenants.evil_user = good, evil
    tenants.python, tenants.pythonpath = SYSTEM_PYTHON, pythonpath


def remove_users(tenants: Tenants) -> None:
    for name in tenants.made:
        _run_quiet(["userdel", name])
        _run_quiet(["groupdel", name])  # gone with the user where USERGROUPS_ENAB; harmless otherwise
    tenants.made.clear()


# ------------------------------------------------------------------------------------------ elasticd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _user_lines(user: str | None) -> str:
    """A tenant's ``user:``, without the view of its own that a user brings by default: both tenants share one root
    and this venv's interpreter, and what is measured here (elasticd's bounds on what a tenant feeds it) does not
    depend on the view, whose own cost benchmarks/sandbox_bench.py measures."""
    return f"    user: {user}\n    isolation: {{enabled: false}}\n" if user else ""


CONFIG = """\
server:
  listen: 127.0.0.1:{port}
  metrics_listen: 127.0.0.1:{metrics_port}
  admin_socket: {base}/admin.sock
  runtime_dir: {base}/run
  stop_timeout: 2s
  cgroups: {{mode: required, path: {base}/cg}}
tenants:
  good:
{good_user}    apps:
      app:
        domains: [{good_host}]
        root: {base}/srv
        groups:
          main:
            command: ["{{python}}", "-m", "elasticd.demo"]
            python: {python}
            env: {{PYTHONPATH: "{pythonpath}"}}
            concurrency: 16
            pool: {{min_workers: 1, max_workers: 1}}
  evil:
{evil_user}    quotas: {{max_concurrent_requests: 64, requests_per_second: 100, burst: 200}}
    apps:
      app:
        domains: [{evil_host}]
        root: {base}/srv
        groups:
          main:
            command: ["{{python}}", "{hostile}"]
            python: {python}
            env: {{HOSTILE_CONTROL: "{control}", HOSTILE_FRONT: "127.0.0.1:{port}", HOSTILE_HOST: "{evil_host}",
                  HOSTILE_SLOW_KINDS: "{slow_kinds}", HOSTILE_CPUS: "{attacker_cpus}",
                  HOSTILE_METRICS: "127.0.0.1:{metrics_port}"}}
            concurrency: 8
            pool: {{min_workers: 1, max_workers: 1}}
"""


class Elasticd:
    """One elasticd on a fresh runtime directory under ``base``; stopped (and its leftovers killed) on exit."""

    def __init__(self, base: Path, tenants: Tenants, name: str, slow_kinds: str = "") -> None:
        self.base = base
        self.tree = tenants.tree
        self.port = free_port()
        self.control = base / "attack"
        self.control.write_text("burn\n")
        self.control.chmod(0o644)
        for sub in ("cg", "srv"):
            (base / sub).mkdir(mode=0o755, exist_ok=True)
        (base / "cg" / "cgroup.controllers").write_text("cpu memory pids io\n")
        (base / "cg" / "cgroup.procs").write_text("")
        run = base / "run"
        if run.exists():
            shutil.rmtree(run)
        self.config = base / "elastic.yaml"
        self.config.write_text(CONFIG.format(
            port=self.port, metrics_port=free_port(), base=base, good_host=GOOD_HOST, evil_host=EVIL_HOST,
            python=tenants.python, pythonpath=tenants.pythonpath, hostile=HOSTILE, control=self.control,
            slow_kinds=slow_kinds, attacker_cpus=ATTACKER_CPUS,
            good_user=_user_lines(tenants.good_user), evil_user=_user_lines(tenants.evil_user)))
        self.log_path = base / f"elasticd-{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, int | None] = {}  # every worker (and part) pid seen, with its start time

    def __enter__(self) -> Elasticd:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.tree), os.environ.get("PYTHONPATH")]))
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "elasticd.daemon", "--config", str(self.config)], env=env, cwd=self.tree,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_service_limits)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def note_workers(self) -> None:
        if self.alive():
            for pid in descendants(self.pid):
                self.seen.setdefault(pid, start_time(pid))

    def attacker(self) -> int | None:
        """The attacker's worker: elasticd's descendant running hostile_worker.py that is not one of its parts."""
        for pid in descendants(self.pid):
            argv = cmdline(pid).split()
            if len(argv) == 2 and argv[1] == str(HOSTILE):  # [python, hostile_worker.py]: not a --part
                return pid
        return None

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        waiting = [GOOD_HOST, EVIL_HOST]
        while waiting:
            if not self.alive():
                raise RuntimeError(f"elasticd exited ({self.log_tail()})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(waiting)} not answering in {timeout:g}s ({self.log_tail()})")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if get(self.port, waiting[0], "/", timeout=2)[0] == 200:
                    waiting.pop(0)
                    continue
            time.sleep(0.1)
        self.note_workers()

    def switch(self, attack: str) -> None:
        self.note_workers()
        self.control.write_text(attack + "\n")
        time.sleep(0.3)  # the worker polls every 0.1 s; its parts start in another ~0.1 s
        self.note_workers()

    def attacker_stats(self) -> dict[str, Any]:
        """The attacker's own counters (GET /stats on its socket, not through the front)."""
        for path in sorted((self.base / "run" / "workers" / "evil").glob("*.sock")):
            with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
                conn = _UnixConnection(str(path), timeout=3)
                try:
                    conn.request("GET", "/stats")
                    return dict(json.loads(conn.getresponse().read()))
                finally:
                    conn.close()
        return {}

    def log_bytes(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, self.log_bytes() - 4096))
                return " | ".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return "no log"

    def stop(self) -> None:
        if self.process is None:
            return
        self.note_workers()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # Anything it started that outlived it (it was killed, or a worker escaped): by pid, if still the same.
        for pid, started in self.seen.items():
            if started is not None and start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.process = None


def _service_limits() -> None:
    """In the child before exec: the descriptor limit elasticd.service gives it."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def get(port: int, host: str, path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------ wrk

_LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(port: int, duration: float, connections: int, threads: int) -> dict[str, float]:
    argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", "--latency", "-H", f"Host: {GOOD_HOST}",
            f"http://127.0.0.1:{port}/"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30, check=True).stdout
    latency = {m.group(1): float(m.group(2)) * _UNITS[m.group(3)] for m in _LATENCY.finditer(out)}
    found = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    bad = int(errors.group(1)) if errors else 0
    if socket_errors:
        bad += sum(int(g) for g in socket_errors.groups())
    return {"rps": float(rps.group(1)) if rps else 0.0, "p99": latency.get("99", float("nan")),
            "requests": int(found.group(1)) if found else 0, "errors": bad}


def ensure_wrk() -> bool:
    if shutil.which("wrk"):
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("wrk is missing: apt-get install -y wrk", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(["apt-get", "install", "-y", "wrk"], env=env, capture_output=True, timeout=600).returncode:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
            subprocess.run(["apt-get", "install", "-y", "wrk"], env=env, capture_output=True, timeout=600)
    return shutil.which("wrk") is not None


# ------------------------------------------------------------------------------------------ one attack


def measure(attack: str, base: Path, tenants: Tenants, args: argparse.Namespace) -> Row:
    row = Row(attack)
    with Elasticd(base, tenants, attack, args.slow_kinds) as daemon:
        daemon.wait_ready()
        wrk(daemon.port, 1.0, args.connections, args.threads)  # warm up: the upstream pool, the code paths hot
        time.sleep(1.0)
        row.before = sample(daemon.pid)
        log_start = daemon.log_bytes()
        daemon.switch(attack)
        time.sleep(args.settle)
        attacker = daemon.attacker()
        tree = ([attacker, *descendants(attacker)] if attacker else [])
        with PeakSampler(daemon.pid) as peak:
            cpu0, tree0, t0 = cpu_seconds([daemon.pid]), cpu_seconds(tree), time.monotonic()
            got = wrk(daemon.port, args.duration, args.connections, args.threads)
            cpu1, tree1, t1 = cpu_seconds([daemon.pid]), cpu_seconds(tree), time.monotonic()
        row.rps, row.p99_ms, row.requests, row.errors = got["rps"], got["p99"], int(got["requests"]), int(got["errors"])
        row.cpu = (cpu1 - cpu0) / (t1 - t0) * 100
        row.attacker_cpu = (tree1 - tree0) / (t1 - t0) * 100
        row.during = peak.peak
        row.counters = daemon.attacker_stats()
        if not daemon.alive():
            row.note = "elasticd died during the attack"
            return row
        daemon.switch("burn")
        time.sleep(args.settle)
        row.after = sample(daemon.pid)
        row.log_mib = (daemon.log_bytes() - log_start) / (1 << 20)
    if not args.keep:
        daemon.log_path.unlink(missing_ok=True)
    return row


# ------------------------------------------------------------------------------------------ the report


def _x(value: float, base: float) -> str:
    return f"{value / base:5.2f}x" if base else "   - "


def table(rows: list[Row]) -> str:
    base = next((r for r in rows if r.attack == "burn"), None)
    lines = [f"{'attack':12} {'rps':>7} {'xbase':>6} {'p99 ms':>8} {'xbase':>6} {'errors':>7} {'elasticd':>8} "
             f"{'attacker':>8}  {'fds before/during/after':>23}  {'RSS MiB before/during/after':>27}",
             f"{'':12} {'':>7} {'':>6} {'':>8} {'':>6} {'':>7} {'CPU %':>8} {'CPU %':>8}"]
    for r in rows:
        fds = f"{r.before.fds}/{r.during.fds}/{r.after.fds}"
        rss = f"{r.before.rss_mib:.0f}/{r.during.rss_mib:.0f}/{r.after.rss_mib:.0f}"
        lines.append(f"{r.attack:12} {r.rps:7.0f} {_x(r.rps, base.rps if base else 0):>6} {r.p99_ms:8.1f} "
                     f"{_x(r.p99_ms, base.p99_ms if base else 0):>6} {r.errors:7d} {r.cpu:8.0f} {r.attacker_cpu:8.0f}"
                     f"  {fds:>23}  {rss:>27}" + (f"  ({r.note})" if r.note else ""))
    return "\n".join(lines)


def goals(rows: list[Row]) -> str:
    base = next((r for r in rows if r.attack == "burn"), None)
    lines = [f"goal: throughput >= 0.9x and p99 <= 1.5x of the baseline; after the attack, descriptors within "
             f"{FD_SLACK} and RSS within {RSS_SLACK_SHARE:.0%} (or {RSS_SLACK_MIB:g} MiB) of before"]
    for r in rows:
        misses = []
        if base is not None and r is not base:
            if r.rps < 0.9 * base.rps:
                misses.append(f"throughput {r.rps / base.rps:.2f}x")
            if r.p99_ms > 1.5 * base.p99_ms:
                misses.append(f"p99 {r.p99_ms / base.p99_ms:.2f}x")
        if r.after.fds > r.before.fds + FD_SLACK:
            misses.append(f"fds {r.before.fds} -> {r.after.fds}")
        if r.after.rss_mib > r.before.rss_mib + max(RSS_SLACK_MIB, RSS_SLACK_SHARE * r.before.rss_mib):
            misses.append(f"RSS {r.before.rss_mib:.0f} -> {r.after.rss_mib:.0f} MiB")
        if r.note:
            misses.append(r.note)
        lines.append(f"  {r.attack:12} {'MISSED: ' + ', '.join(misses) if misses else 'met'}")
    return "\n".join(lines)


def what_attacks_did(rows: list[Row], duration: float) -> str:
    lines = ["what each attack did (the attacker's own counters at the end of the window; elasticd's log growth):"]
    for r in rows:
        parts = r.counters.get("parts", {})
        said = []
        for name, counters in sorted(parts.items()):
            if name == "burn":
                continue
            shown = ", ".join(f"{k} {_short(v)}" for k, v in sorted(counters.items()) if k != "sent")
            said.append(f"{name}: {shown or 'nothing yet'}")
        lines.append(f"  {r.attack:12} log +{r.log_mib:.1f} MiB; " + ("; ".join(said) if said else "-"))
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, int) and value >= 10_000:
        return f"{value / 1000:.0f}k" if value < 10_000_000 else f"{value / 1e6:.0f}M"
    return str(value)


def _median(values: Iterator[float]) -> float:
    return float(statistics.median(list(values)))


def _median_sample(rows: list[Row], which: str) -> Sample:
    return Sample(int(_median(getattr(r, which).fds for r in rows)), _median(getattr(r, which).rss_mib for r in rows))


def median_rows(rounds: list[list[Row]]) -> list[Row]:
    out = []
    for i, first in enumerate(rounds[0]):
        same = [r[i] for r in rounds]
        out.append(Row(first.attack, _median(r.rps for r in same), _median(r.p99_ms for r in same),
                       sum(r.requests for r in same), sum(r.errors for r in same), _median(r.cpu for r in same),
                       _median(r.attacker_cpu for r in same), _median_sample(same, "before"),
                       _median_sample(same, "during"), _median_sample(same, "after"),
                       _median(r.log_mib for r in same), {}, "; ".join(r.note for r in same if r.note)))
    return out


# ------------------------------------------------------------------------------------------ the run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of wrk per attack (default 10)")
    parser.add_argument("--connections", type=int, default=10, help="wrk connections (default 10)")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default 2)")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds an attack runs before wrk, and after it stops before 'after' (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="how many times to measure the set (default 1)")
    parser.add_argument("--only", help="a comma-separated list of attacks (the baseline, burn, is always measured)")
    parser.add_argument("--no-users", action="store_true", help="run both tenants as root even when users can be made")
    parser.add_argument("--keep", action="store_true", help="keep the working directory and elasticd's logs")
    parser.add_argument("--slow-kinds", default="",
                        help="slowloris only with these kinds of requests (hold, drip, endless, slowhead; default all)")
    parser.add_argument("--tree", type=Path, default=REPO,
                        help="run elasticd (and the demo) from this checkout, e.g. `git archive HEAD` unpacked "
                             "somewhere its users can read (default: this one); the attacker is always this one's")
    args = parser.parse_args()
    attacks = list(ATTACKS)
    if args.only:
        wanted = [a.strip() for a in args.only.split(",") if a.strip()]
        unknown = [a for a in wanted if a not in ATTACKS]
        if unknown:
            parser.error(f"unknown attacks: {', '.join(unknown)} (known: {', '.join(ATTACKS)})")
        attacks = ["burn", *[a for a in wanted if a != "burn"]]
    if not ensure_wrk():
        print("missing: wrk (apt-get install -y wrk)", file=sys.stderr)
        return 1

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)  # also when started with SIGINT ignored (a shell's background job)
    tree = args.tree.resolve()
    tenants = Tenants(pythonpath=str(tree), tree=tree)
    base = Path(tempfile.mkdtemp(prefix="neighbour-bench-", dir="/tmp"))
    base.chmod(0o755)  # the tenants' users traverse it to their sockets, the control file and the app root
    rounds: list[list[Row]] = []
    try:
        if args.no_users:
            tenants.why_not = "--no-users"
        else:
            make_tenant_users(tenants)
        if tenants.good_user is None:
            remove_users(tenants)
            tenants = Tenants(pythonpath=str(tree), tree=tree, why_not=tenants.why_not)
        print(f"elasticd from {tree}; {os.cpu_count()} CPUs; wrk -t{args.threads} -c{args.connections} "
              f"-d{args.duration:g}s against {GOOD_HOST} through the front; settle {args.settle:g}s; tenants "
              + (f"as users {tenants.good_user} and {tenants.evil_user} ({tenants.python})" if tenants.good_user
                 else f"as root ({tenants.why_not})"), flush=True)
        for n in range(args.rounds):
            rows: list[Row] = []
            for attack in attacks:
                row = measure(attack, base, tenants, args)
                rows.append(row)
                print(f"  {attack}: {row.rps:.0f} rps, p99 {row.p99_ms:.1f} ms, elasticd {row.cpu:.0f}% CPU, "
                      f"fds {row.before.fds}/{row.during.fds}/{row.after.fds}"
                      + (f" ({row.note})" if row.note else ""), flush=True)
            rounds.append(rows)
            print(f"\nround {n + 1}")
            print(table(rows))
            print()
            print(what_attacks_did(rows, args.duration))
            print()
            print(goals(rows))
        if args.rounds > 1:
            medians = median_rows(rounds)
            print(f"\nmedian of {args.rounds} rounds")
            print(table(medians))
            print()
            print(goals(medians))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping what was started", file=sys.stderr)
        return 130
    finally:
        remove_users(tenants)
        if args.keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
