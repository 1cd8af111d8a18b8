"""What every scenario module shares: the guest's paths, the shell helpers, cgroupfs readers, elasticd's
interfaces (the admin socket, the front, elasticctl) and the suite's configurations.

Plain python3 and the standard library only (see run_scenarios.py, the entry point).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import time
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


# A scenario returns (figure, details) or raises Failed. The figure is the one line the host's table shows.
Scenario = Callable[[], tuple[str, dict[str, Any]]]
