"""What every scenario module shares: the guest's paths, the shell helpers, cgroupfs readers, elasticd's
interfaces (the admin socket, the front, elasticctl) and the suite's configurations.

Plain python3 and the standard library only (see run_scenarios.py, the entry point).
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

UNIT = "elasticd.service"
KEEPER_UNIT = "elasticd-keeper.service"  # the parent of every worker, started by elasticd-keeper.socket
KEEPER_SOCKET_UNIT = "elasticd-keeper.socket"
CONFIG = Path("/etc/elastic.yaml")
CGROOT = Path("/sys/fs/cgroup")
BASE = CGROOT / "system.slice" / KEEPER_UNIT  # the tenants' base: the keeper's unit's cgroup (Delegate=yes there)
ELASTICD_CGROUP = CGROOT / "system.slice" / UNIT  # elasticd's own
ADMIN_SOCKET = "/run/elasticd/admin.sock"
FRONT = ("127.0.0.1", 8080)
WANTED = {"cpu", "memory", "pids", "io"}
MiB = 1 << 20


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


def ensure_user(name: str) -> tuple[pwd.struct_passwd, bool]:
    """The system user ``name``, created when absent: (its entry, whether it was created here)."""
    try:
        return pwd.getpwnam(name), False
    except KeyError:
        pass
    made = run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
    check(made.returncode == 0, f"useradd {name} exited {made.returncode}: {made.stderr.strip()}")
    return pwd.getpwnam(name), True


def remove_users(names: list[str]) -> dict[str, str]:
    """Best effort: userdel each (its user group goes with it); what each said."""
    said = {}
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            said[name] = "absent"
            continue
        result = run(["userdel", name])
        said[name] = "removed" if result.returncode == 0 else f"userdel exited {result.returncode}: " \
                                                              f"{result.stderr.strip()}"
    return said


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


def keeper_pid() -> int:
    """The keeper's pid (0: its unit is not running)."""
    return int(systemctl("show", KEEPER_UNIT, "--property=MainPID", "--value").stdout.strip() or 0)


def units_processes() -> list[str]:
    """Every process whose cgroup is elasticd's unit's or the keeper's, or under them, from /proc (not from the
    units' cgroups, which systemd may have removed): "PID CGROUP" each."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cgroup = (entry / "cgroup").read_text()
            except OSError:
                continue
            if f"/system.slice/{UNIT}" in cgroup or f"/system.slice/{KEEPER_UNIT}" in cgroup:
                found.append(f"{entry.name} {cgroup.strip()}")
    return found


def stop_units() -> None:
    """elasticd and its keeper stopped, their failures forgotten: a scenario's clean slate (a clean stop of elasticd
    ends the keeper too; one that failed may leave it, with its drop-ins' settings)."""
    systemctl("stop", UNIT, KEEPER_UNIT)
    systemctl("reset-failed", UNIT, KEEPER_UNIT)


def journal_cursor() -> str:
    out = run(["journalctl", "--no-pager", "-n", "0", "--show-cursor"]).stdout
    match = re.search(r"-- cursor: (\S+)", out)
    check(match, f"journalctl gave no cursor: {out!r}")
    return match.group(1)


def journal_since(cursor: str, units: tuple[str, ...] = (UNIT, KEEPER_UNIT)) -> str:
    """elasticd's lines and its workers' (their output is the keeper's unit's) since ``cursor``."""
    # journald takes stream lines asynchronously: a short settle time before reading.
    time.sleep(0.5)
    return run(["journalctl", "--no-pager", "-o", "cat", *(f"--unit={unit}" for unit in units),
                f"--after-cursor={cursor}"]).stdout


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


def admin(method: str, path: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    """One request to elasticd's admin API on its Unix socket: (HTTP status, the JSON body)."""
    conn = _UnixHTTPConnection(ADMIN_SOCKET, timeout)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json"} if payload else {})
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        return response.status, {"error": data[:300].decode(errors="replace")}


def status() -> dict[str, Any]:
    """GET /v1/status on the admin socket (what `elasticctl status --json` prints, without its start-up
    cost, which is seconds under TCG)."""
    code, data = admin("GET", "/v1/status", timeout=30)
    check(code == 200, f"GET /v1/status answered {code}: {str(data)[:200]}")
    return data


def elasticctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The operator's command, as installed by the .deb (each call costs a Python start-up: ~2 s under TCG)."""
    return run(["elasticctl", *args], timeout=timeout)


def elasticctl_json(*args: str, timeout: float = 120) -> Any:
    result = elasticctl(*args, "--json", timeout=timeout)
    check(result.returncode == 0, f"elasticctl {' '.join(args)} --json exited {result.returncode}: "
          f"{result.stderr.strip()[-500:]}")
    return json.loads(result.stdout)


def workers(st: dict[str, Any], tenant: str, app: str) -> list[dict[str, Any]]:
    groups = st["tenants"][tenant]["apps"][app]["groups"]
    return [w for group in groups.values() for w in group["workers"]]


def worker_pids(st: dict[str, Any]) -> dict[tuple[str, str], list[int]]:
    return {(t, a): sorted(w["pid"] for w in workers(st, t, a))
            for t, tenant in st["tenants"].items() for a in tenant["apps"]}


def front(host: str, path: str, timeout: float = 60) -> tuple[int | None, bytes]:
    """A request through elasticd's front, routed by its Host header. (None, error) when the connection
    itself failed."""
    code, body, _ = browse(host, path, timeout=timeout)
    return code, body


def browse(host: str, path: str, cookie: str | None = None, timeout: float = 60) -> tuple[int | None, bytes,
                                                                                             str | None]:
    """As a browser: the sticky cookie sent when there is one; (status, body, the elastic_uid the front set
    in Set-Cookie or None). (None, error, None) when the connection itself failed."""
    conn = http.client.HTTPConnection(*FRONT, timeout=timeout)
    headers = {"Host": host, **({"Cookie": f"elastic_uid={cookie}"} if cookie else {})}
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        set_cookie = response.getheader("Set-Cookie") or ""
        uid = set_cookie.split("elastic_uid=", 1)[1].split(";", 1)[0] if "elastic_uid=" in set_cookie else None
        return response.status, body, uid
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{type(exc).__name__}: {exc}".encode(), None
    finally:
        conn.close()


def http_get(port: int, path: str, timeout: float = 30) -> tuple[int, bytes]:
    """GET on 127.0.0.1:port (the metrics listener, Prometheus' API)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def metric_samples(name: str, port: int = 9464) -> list[tuple[dict[str, str], float]]:
    """Every sample of the family ``name`` on elasticd's /metrics: (its labels, its value), in page order.
    Labels are parsed by name, so their order on the page does not matter."""
    code, page = http_get(port, "/metrics")
    check(code == 200, f"GET /metrics answered {code}")
    found = []
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", page.decode(), re.M):
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
        found.append((labels, float(m.group(2))))
    return found


def group_samples(name: str, tenant: str, app: str, group: str, key: str) -> dict[str, float]:
    """One group's samples of ``name`` by the label ``key`` (e.g. elasticd_pool_decisions_total by decision,
    elasticd_group_limit_bound by resource)."""
    return {labels[key]: value for labels, value in metric_samples(name)
            if key in labels and (labels.get("tenant"), labels.get("app"), labels.get("group")) == (tenant, app, group)}


def pool_decision_counts(tenant: str, app: str, group: str) -> dict[str, int]:
    """elasticd_pool_decisions_total{tenant,app,group,decision} of one group: counts that the pool API's bounded
    journal (its last 50 decisions) cannot lose."""
    return {k: int(v) for k, v in group_samples("elasticd_pool_decisions_total", tenant, app, group,
                                                "decision").items()}


POOL_SMOOTHING_ROWS = 6  # the pool's smoothing window, in reports (elasticd.pool.evaluator.SMOOTHING_ROWS)
REST_OCCUPANCY = 0.2  # a worker at rest reads under this


def pool_at_rest(pool: Callable[[], dict[str, Any]], timeout: float = 60.0) -> dict[str, Any]:
    """The group (``pool()``: its part of GET /v1/apps/T/A/pool) once it has one worker, announced, with a full
    smoothing window of readings at rest. The CPU a worker burns starting up (its imports, slow under TCG) reads
    as occupancy, and a first login while a newborn's window holds only that can scale the group up before any
    load: a scenario about load starts from rest."""

    def rested() -> dict[str, Any] | None:
        g = pool()
        ok = len(g["workers"]) == 1 and all(w["state"] == "running" and w["announced"]
                                            and len(w["history"]) >= POOL_SMOOTHING_ROWS
                                            and w["occupancy"] < REST_OCCUPANCY for w in g["workers"])
        return g if ok else None

    group = wait_for(rested, timeout, 0.5)
    check(group, f"the group's one worker did not come to rest (announced, {POOL_SMOOTHING_ROWS} readings, "
          f"occupancy under {REST_OCCUPANCY:g}) within {timeout:.0f}s: "
          f"{[(w['id'], w['state'], w['announced'], w['occupancy'], w['history']) for w in pool()['workers']]}")
    return group


class Crowd:
    """Logged-in users who keep arriving during the load, each burning CPU in its handler (``path``) on whatever
    worker the front sends it to: ``first`` log in at once (``begin``), then one more ``every`` seconds after the
    previous one got in, while fewer than ``limit`` have arrived (raise ``limit``, change ``every`` to let more
    come). Under load a login waits its turn on a busy worker, so the gaps are ``every`` plus that wait (see
    ``arrived``). Placement happens once, at the login, so arrivals are what spread a load onto new workers.

    Each user: GET / for the sticky cookie (elastic_uid), ``/login?name=<prefix>N``, then ``path`` again and
    again until ``halt``. Every answer is counted by status (None: the connection itself failed), the logins
    too; a user whose GET / or login failed is counted and does not burn."""

    def __init__(self, host: str, path: str, *, first: int, every: float, limit: int, prefix: str = "u") -> None:
        self.host, self.path, self.first, self.every, self.limit, self.prefix = host, path, first, every, limit, prefix
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.cookies: list[str] = []  # the users who logged in, in arrival order
        self.names: list[str] = []
        self.arrived: list[float] = []  # seconds after begin() when each logged in
        self.codes: dict[int | None, int] = {}
        self.refused: list[tuple[str, str, int | None, bytes]] = []  # (user, step, status, body) that failed
        self.threads: list[threading.Thread] = []
        self._arrivals: threading.Thread | None = None
        self._began = 0.0

    def _count(self, code: int | None) -> None:
        with self.lock:
            self.codes[code] = self.codes.get(code, 0) + 1

    def _arrive(self) -> bool:
        with self.lock:
            name = f"{self.prefix}{len(self.names) + len(self.refused)}"
        code, body, uid = browse(self.host, "/")
        self._count(code)
        if code != 200 or not uid:
            with self.lock:
                self.refused.append((name, "GET /", code, body[:200]))
            return False
        code, body, _ = browse(self.host, f"/login?name={name}", uid)
        self._count(code)
        if code != 200:
            with self.lock:
                self.refused.append((name, "login", code, body[:200]))
            return False
        thread = threading.Thread(target=self._burn, args=(uid,), daemon=True)
        with self.lock:
            self.cookies.append(uid)
            self.names.append(name)
            self.arrived.append(round(time.monotonic() - self._began, 1))
            self.threads.append(thread)
        thread.start()
        return True

    def _burn(self, cookie: str) -> None:
        while not self.stop.is_set():
            code, _, _ = browse(self.host, self.path, cookie, timeout=90)
            self._count(code)

    def _keep_arriving(self) -> None:
        while not self.stop.wait(self.every):
            with self.lock:
                due = len(self.names) + len(self.refused) < self.limit
            if due:
                self._arrive()

    def begin(self) -> None:
        self._began = time.monotonic()
        for _ in range(self.first):
            self._arrive()
        check(not self.refused, f"the first users could not log in: {self.refused}")
        self._arrivals = threading.Thread(target=self._keep_arriving, daemon=True)
        self._arrivals.start()

    def users(self) -> int:
        with self.lock:
            return len(self.names)

    def total(self) -> int:
        with self.lock:
            return sum(self.codes.values())

    def failed(self) -> dict[int | None, int]:
        with self.lock:
            return {code: n for code, n in self.codes.items() if code != 200}

    def halt(self) -> None:
        self.stop.set()
        if self._arrivals is not None:
            self._arrivals.join(120)
        for t in list(self.threads):
            t.join(120)


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

# Every tenant of the suite runs as its own system user, as an operator would run them. The .deb's postinst makes
# the shipped example's two (00-install checks it); the others are made once the package is in (make_users).
DEB_USERS = ("elastic-acme", "elastic-globex")
# ... and their app roots, made by the postinst too (packaging/demo-tenants for ./dev)
DEB_ROOTS = (("elastic-acme", "/srv/acme/shop"), ("elastic-globex", "/srv/globex/blog"))


def tenant_user(tenant: str) -> str:
    return f"elastic-{tenant}"


# The tenants of the scenarios with a configuration of their own (small_config, 12-pool, 13-pool-limits,
# 21-bursts, 22-upgrade, 24-crash).
OTHER_TENANTS = ("solo", "elastic", "capped", "bursty", "steady", "sturdy")


def suite_users() -> list[str]:
    return [tenant_user(t) for t in [*(t for t, *_ in SUITE_APPS), *OTHER_TENANTS] if tenant_user(t) not in DEB_USERS]


def make_users() -> None:
    """The suite's tenants' users the .deb does not make, and the app roots their workers write into (the io
    tenant's writer writes its file into its root, so that root is its user's)."""
    for name in suite_users():
        if run(["getent", "passwd", name]).returncode != 0:
            made = run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name])
            check(made.returncode == 0, f"useradd {name} exited {made.returncode}: {made.stderr.strip()}")
    io = Path("/srv/io/writer")
    io.mkdir(parents=True, exist_ok=True)
    shutil.chown(io, tenant_user("io"), tenant_user("io"))


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
    user: elastic-%(tenant)s
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


# A scenario returns (figure, details) or raises Failed. The figure is the one line the host's table shows.
Scenario = Callable[[], tuple[str, dict[str, Any]]]


class PoolWatch:
    """One app group as ``GET /v1/apps/T/A/pool`` shows it, polled; every decision seen is kept (the API shows
    the journal's last 50, which under load are mostly logins' keep/pass/admit: polled often, none is lost)."""

    def __init__(self, tenant: str, app: str, group: str) -> None:
        self.tenant, self.app, self.group = tenant, app, group
        self.journal: dict[tuple[float, str, str | None], dict[str, Any]] = {}

    def __call__(self) -> dict[str, Any]:
        code, data = admin("GET", f"/v1/apps/{self.tenant}/{self.app}/pool", timeout=30)
        check(code == 200, f"GET /v1/apps/{self.tenant}/{self.app}/pool answered {code}: {data}")
        group = data["groups"][self.group]
        for d in group["decisions"]:
            self.journal.setdefault((d["at"], d["decision"], d["worker"]), d)
        return group

    def decisions(self) -> list[dict[str, Any]]:
        return sorted(self.journal.values(), key=lambda d: d["at"])


def running(group: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in group["workers"] if w["state"] == "running"]
