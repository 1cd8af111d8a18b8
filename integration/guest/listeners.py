"""Scenario 25, issue #43: elasticd's own listeners answer no tenant's process, under the shipped unit.

Four tenants run tests/apps/listener_probe.py (run.py puts it beside this file in the share) on Debian's python3:
``lsa`` and ``lsb`` with users of their own and isolated (the default), ``lsc`` with a user and no view of its own
(``isolation: {enabled: false}``), ``lsr`` without a user (its workers run as root: only its socket's cgroup tells
it from the operator's tooling). ``GET /`` on a tenant has its worker ask ``metrics_listen`` for ``/metrics``,
``/monitor`` and the other tenant's ``/monitor/state``, and ``agent_listen`` for a check.

Judged: every one of those is refused (reset before a byte of an answer), for each tenant, counted as
``tenant-cgroup`` (each worker's socket is made in its leaf: root's tenant included); a scrape by a tenant's user
from outside its cgroup (its SSH session, its cron job) is refused as ``tenant-user``; root's scrape and check and
the ``prometheus`` user's scrape (the operator's Prometheus runs as it) are served; one journal line per tenant,
listener and reason; a thousand connections at once from one tenant are all refused, and elasticd's descriptors
come back to where they were.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from common import (
    UNIT,
    check,
    ensure_user,
    front,
    http_get,
    journal_cursor,
    journal_since,
    remove_users,
    run,
    say,
    start_with,
    status,
    suite_config,
    systemctl,
    wait_for,
    workers,
    write_config,
)

HERE = Path(__file__).resolve().parent
METRICS_PORT, AGENT_PORT = 9464, 9465
USERS: dict[str, str | None] = {"lsa": "eltlsa", "lsb": "eltlsb", "lsc": "eltlsc", "lsr": None}
OTHER = {"lsa": "lsb", "lsb": "lsa", "lsc": "lsa", "lsr": "lsa"}
ROOTS = {tenant: Path(f"/srv/{tenant}/app") for tenant in USERS}
REFUSED = ("closed", "error: ConnectionResetError: [Errno 104] Connection reset by peer")


def _config() -> str:
    tenants = ""
    for tenant, user in USERS.items():
        tenants += f"  {tenant}:\n"
        if user is not None:
            tenants += f"    user: {user}\n"
        if tenant == "lsc":
            tenants += "    isolation: {enabled: false}\n"
        tenants += f"""\
    apps:
      app:
        domains: [{tenant}.localhost]
        root: {ROOTS[tenant]}
        groups:
          main:
            command: ["/usr/bin/python3", "listener_probe.py"]
            env: {{PROBE_METRICS: "127.0.0.1:{METRICS_PORT}", PROBE_AGENT: "127.0.0.1:{AGENT_PORT}",
                   PROBE_OTHER_APP: "{OTHER[tenant]}/app"}}
            pool: {{min_workers: 1, max_workers: 1}}
"""
    return f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:{METRICS_PORT}
  agent_listen: 127.0.0.1:{AGENT_PORT}
  cgroups: {{mode: required}}
  stop_timeout: 5s
tenants:
{tenants}"""


def _prepare() -> None:
    for tenant, user in USERS.items():
        uid, gid = (0, 0)
        if user is not None:
            entry, _ = ensure_user(user)
            uid, gid = entry.pw_uid, entry.pw_gid
        root = ROOTS[tenant]
        root.parent.mkdir(exist_ok=True)
        root.parent.chmod(0o755)
        root.mkdir(exist_ok=True)
        shutil.copyfile(HERE / "listener_probe.py", root / "listener_probe.py")
        for path in (root, root / "listener_probe.py"):
            os.chown(path, uid, gid)
            path.chmod(0o755 if path.is_dir() else 0o644)


def _all_running() -> dict[str, Any] | None:
    st = status()
    return st if all(len(ws := workers(st, t, "app")) == 1 and ws[0]["state"] == "running" for t in USERS) else None


def _refusals() -> dict[tuple[str, str], float]:
    code, body = http_get(METRICS_PORT, "/metrics")
    check(code == 200, f"root's scrape answered {code}")
    found = re.findall(r'^elasticd_listener_refusals_total\{listener="(\w+)",reason="([\w-]+)"\} (\S+)$',
                       body.decode(), re.M)
    return {(listener, reason): float(value) for listener, reason, value in found}


def _as_user(user: str) -> str:
    """A scrape by ``user`` from the runner's own cgroup: the prometheus user (Debian's package makes it; the
    operator's Prometheus runs as it), or a tenant's user outside its workers (its SSH session, its cron job).
    "200 <bytes>", or what refused it."""
    script = ("import urllib.request\ntry:\n    r = urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=10)"
              "\n    print(r.status, len(r.read()))\nexcept Exception as e:\n    print(f'error: {e!r}')")
    result = run(["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "/usr/bin/python3", "-c", script])
    check(result.returncode == 0, f"{user}'s scrape did not run: {result.stderr[-500:]}")
    return result.stdout.strip()


def _agent() -> str:
    with socket.create_connection(("127.0.0.1", AGENT_PORT), timeout=5) as sock:
        sock.sendall(b"\n")
        return sock.recv(1024).decode().strip()


def _descriptors() -> int:
    pid = int(systemctl("show", "-P", "MainPID", UNIT).stdout.strip())
    return len(os.listdir(f"/proc/{pid}/fd"))


def s_listeners() -> tuple[str, dict[str, Any]]:
    try:
        return _scenario()
    finally:
        systemctl("stop", UNIT)
        write_config(suite_config())
        say(f"    users: {remove_users([u for u in USERS.values() if u is not None])}")


def _scenario() -> tuple[str, dict[str, Any]]:
    cursor = journal_cursor()
    _prepare()
    start_with(_config())
    check(wait_for(_all_running, 90, 0.5), "the four tenants' workers did not all come up within 90s:\n"
          + journal_since(cursor)[-3000:])
    seen: dict[str, dict[str, str]] = {}
    for tenant in USERS:
        code, body = front(f"{tenant}.localhost", "/")
        check(code == 200, f"GET / on {tenant}.localhost answered {code}: {body[:500]!r}")
        seen[tenant] = json.loads(body)
        served = {what: outcome for what, outcome in seen[tenant].items() if outcome not in REFUSED}
        check(not served, f"tenant {tenant} got an answer from elasticd's own listeners: {served}")
    refusals = _refusals()
    # Every worker is in its leaf: its socket's cgroup names its tenant first, root's (lsr) included.
    check(refusals.get(("metrics", "tenant-cgroup")) == 12 and refusals.get(("agent", "tenant-cgroup")) == 4,
          f"the refusals of the four tenants' workers: {refusals}")
    # The tenant's user outside its cgroup (an SSH session of it, a cron job): its socket's owner names it.
    session = _as_user("eltlsa")
    check(session.startswith("error: "), f"eltlsa's own scrape, outside its cgroup, was answered: {session}")
    check(_refusals().get(("metrics", "tenant-user")) == 1, f"the refusal of eltlsa's session: {_refusals()}")
    prometheus = _as_user("prometheus")
    check(prometheus.startswith("200 "), f"the prometheus user's scrape: {prometheus}")
    agent = _agent()
    check(agent.startswith("up"), f"root's agent check: {agent!r}")
    lines = [line for line in journal_since(cursor).splitlines() if "answers no tenant's process" in line]
    check(len(lines) == 9, f"{len(lines)} journal lines of refusals (one per tenant, listener and reason):\n"
          + "\n".join(lines))
    # a thousand at once from one tenant: refused, nothing left behind, the scrape served meanwhile
    before = _descriptors()
    began = time.monotonic()
    code, body = front("lsa.localhost", "/flood?n=1000", timeout=90)
    check(code == 200, f"the flood answered {code}: {body[:300]!r}")
    flood = json.loads(body)
    check(flood["unanswered"] == 0 and sum(flood["outcomes"].values()) == 1000, f"the flood: {flood}")
    flood_s = time.monotonic() - began
    scrape_began = time.monotonic()
    check(http_get(METRICS_PORT, "/metrics")[0] == 200, "the scrape after the flood")
    scrape_s = time.monotonic() - scrape_began
    after = wait_for(lambda: (n := _descriptors()) <= before + 2 and n, 15, 0.2) or _descriptors()
    check(after <= before + 2, f"elasticd's descriptors {before} before the flood, {after} after")
    flood_refusals = _refusals()[("metrics", "tenant-cgroup")] - 12
    check(flood_refusals >= 1000, f"{flood_refusals} refusals counted for the flood's 1000 connections")
    figure = (f"4 tenants (2 isolated with users, 1 with a user and no view, 1 as root) each asked /metrics, /monitor, "
              f"the other's /monitor/state and the agent: all refused ({_show(refusals)}); eltlsa's own scrape "
              f"outside its cgroup refused (tenant-user); root's scrape and agent check "
              f"({agent.split('#')[0].strip()!r}) and the prometheus user's scrape ({prometheus}) served; "
              f"{len(lines)} journal lines; 1000 connections at once from lsa: {_show_outcomes(flood)} in "
              f"{flood['last_answer_s']:.2f}s (the flood took {flood_s:.1f}s through the front), the next scrape "
              f"{scrape_s * 1000:.0f} ms, descriptors {before} → {after}")
    return figure, {"seen": seen, "refusals": {f"{k[0]}/{k[1]}": v for k, v in refusals.items()}, "flood": flood,
                    "descriptors": [before, after], "journal_lines": lines}


def _show(refusals: dict[tuple[str, str], float]) -> str:
    return ", ".join(f"{listener} {reason} {value:g}" for (listener, reason), value in sorted(refusals.items())
                     if value)


def _show_outcomes(flood: dict[str, Any]) -> str:
    return ", ".join(f"{count} {outcome.removeprefix('error: ')}" for outcome, count in flood["outcomes"].items())
