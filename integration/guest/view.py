"""Scenario 20, issue #28: each tenant sees only its own files and processes, under the shipped (hardened) unit.

Two throw-away users and tenants, ``seer`` and ``other``, each isolated by default (a ``user:``), each running
tests/apps/view_probe.py (run.py puts it beside this file in the share) from its own root, which holds a
world-readable file, as a deploy with umask 022 leaves it. ``GET /`` on a tenant answers what its worker sees.

Judged: the other tenant's root and file are absent (on the host both are readable by anyone); elasticd's config is
there but unreadable, its admin socket and the other tenant's sockets absent; /etc/shadow unreadable; /home and /root
absent; /usr and /etc read-only; its own root writable; /proc holds its own two processes (bubblewrap's init and the
probe) while the host runs many; its /tmp is its own, not the host's (a marker written there is in the unit's
/var/tmp/elasticd/<tenant>/tmp, and not in the host's /tmp); a stop's SIGTERM reaches the probe inside the sandbox.
Then ``systemd-analyze security`` of elasticd.service and elasticd-keeper.service (the workers' unit): each at most
4.0, printed.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from common import (
    KEEPER_UNIT,
    UNIT,
    check,
    ensure_user,
    front,
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
USERS = {"seer": "eltseer", "other": "eltother"}
ROOTS = {tenant: Path(f"/srv/{tenant}/app") for tenant in USERS}
CONFIG_FILE = Path("/etc/elastic.yaml")
ADMIN = Path("/run/elasticd/admin.sock")
MAX_EXPOSURE = 4.0


def _config() -> str:
    tenants = ""
    for tenant, user in USERS.items():
        other = ROOTS["other" if tenant == "seer" else "seer"]
        paths = ":".join(str(p) for p in (
            ROOTS[tenant], other, other / "index.html", CONFIG_FILE, ADMIN,
            f"/run/elasticd/workers/{'other' if tenant == 'seer' else 'seer'}", "/etc/shadow", "/home", "/root",
            "/usr", "/etc", "/tmp", "/var/tmp", "/sys/fs/cgroup/system.slice"))
        tenants += f"""\
  {tenant}:
    user: {user}
    apps:
      app:
        domains: [{tenant}.localhost]
        root: {ROOTS[tenant]}
        groups:
          main:
            command: ["/usr/bin/python3", "view_probe.py"]
            env: {{PROBE_PATHS: "{paths}"}}
            pool: {{min_workers: 1, max_workers: 1}}
"""
    return f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
tenants:
{tenants}"""


def _prepare() -> None:
    for tenant, user in USERS.items():
        entry, _ = ensure_user(user)
        root = ROOTS[tenant]
        root.parent.mkdir(exist_ok=True)
        root.parent.chmod(0o755)
        root.mkdir(exist_ok=True)
        for leftover in ("stopped-gracefully", "index.html", "view_probe.py"):
            (root / leftover).unlink(missing_ok=True)
        (root / "index.html").write_text(f"{tenant}'s own file\n")
        shutil.copyfile(HERE / "view_probe.py", root / "view_probe.py")
        for path in (root, root / "index.html", root / "view_probe.py"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
            path.chmod(0o755 if path.is_dir() else 0o644)


def _both_running() -> dict[str, Any] | None:
    st = status()
    return st if all(len(ws := workers(st, t, "app")) == 1 and ws[0]["state"] == "running" for t in USERS) else None


def _seen(tenant: str) -> dict[str, Any]:
    code, body = front(f"{tenant}.localhost", "/")
    check(code == 200, f"GET / on {tenant}.localhost answered {code}: {body[:500]!r}")
    return json.loads(body)


def s_view() -> tuple[str, dict[str, Any]]:
    try:
        return _scenario()
    finally:
        systemctl("stop", UNIT)
        write_config(suite_config())
        say(f"    users: {remove_users(list(USERS.values()))}")


def _scenario() -> tuple[str, dict[str, Any]]:
    cursor = journal_cursor()
    _prepare()
    Path("/tmp/probe-marker").unlink(missing_ok=True)
    start_with(_config())
    st = wait_for(_both_running, 90, 0.5)
    check(st, "the two tenants' workers did not both come up within 90s:\n" + journal_since(cursor)[-3000:])
    host_pids = sum(1 for p in os.listdir("/proc") if p.isdigit())
    figures: dict[str, Any] = {"host_processes": host_pids}
    for tenant in USERS:
        other = ROOTS["other" if tenant == "seer" else "seer"]
        seen = _seen(tenant)
        p = seen["paths"]
        own = p[str(ROOTS[tenant])]
        check(own == {"exists": True, "read": True, "write": True}, f"{tenant}'s own root: {own}")
        check(os.access(other / "index.html", os.R_OK) and (other / "index.html").stat().st_mode & 0o004,
              f"{other}/index.html is not world-readable on the host: the check below would prove nothing")
        check(not p[str(other)]["exists"] and not p[f"{other}/index.html"]["exists"],
              f"{tenant} sees the other tenant's root: {p[str(other)]}, {p[f'{other}/index.html']}")
        check(p[str(CONFIG_FILE)]["exists"] and not p[str(CONFIG_FILE)]["read"],
              f"{tenant} and elasticd's config: {p[str(CONFIG_FILE)]}")
        check(not p[str(ADMIN)]["exists"], f"{tenant} sees elasticd's admin socket: {p[str(ADMIN)]}")
        sockets = next(k for k in p if k.startswith("/run/elasticd/workers/"))
        check(not p[sockets]["exists"], f"{tenant} sees the other tenant's sockets: {sockets} {p[sockets]}")
        check(not p["/etc/shadow"]["read"], f"{tenant} reads /etc/shadow: {p['/etc/shadow']}")
        check(not p["/home"]["exists"] and not p["/root"]["exists"], f"{tenant} sees /home or /root: "
              f"{p['/home']}, {p['/root']}")
        check(not p["/usr"]["write"] and not p["/etc"]["write"], f"{tenant} writes /usr or /etc: {p['/usr']}, "
              f"{p['/etc']}")
        check(p["/tmp"]["write"] and p["/var/tmp"]["write"], f"{tenant}'s /tmp: {p['/tmp']}, {p['/var/tmp']}")
        check(not p["/sys/fs/cgroup/system.slice"]["exists"], f"{tenant} sees the cgroup hierarchy (every tenant's "
              f"name and usage): {p['/sys/fs/cgroup/system.slice']}")
        check(seen["pids"] == [1, 2], f"{tenant}'s /proc shows pids {seen['pids']} (the host has {host_pids})")
        check(f"/tenants/{tenant}/app" in seen["cgroup"], f"{tenant}'s /proc/self/cgroup: {seen['cgroup']!r}")
        figures[tenant] = {"pids": seen["pids"], "uid": seen["uid"]}
        say(f"    {tenant}: /proc {seen['pids']} (host: {host_pids} processes); the other's root absent; "
            f"config {p[str(CONFIG_FILE)]}; /tmp writable")
    check(not Path("/tmp/probe-marker").exists(), "a tenant's /tmp marker is in the host's /tmp")
    # The units' PrivateTmp, one for both (JoinsNamespaceOf=): /var/tmp/systemd-private-*-<the unit that started
    # first>-*/tmp on the host, where elasticd made each tenant's /tmp and the keeper's workers wrote.
    markers = glob.glob("/var/tmp/systemd-private-*-elasticd*.service-*/tmp/elasticd/*/tmp/probe-marker")
    check(len(markers) == 2, f"the tenants' /tmp markers are not in the unit's /var/tmp/elasticd/<tenant>/tmp: "
          f"{markers}")
    figures["tmp_markers"] = sorted(markers)
    show = run(["elasticctl", "status"])
    check("own mount+pid namespace (bubblewrap)" in show.stdout, f"elasticctl status shows no isolation:\n"
          f"{show.stdout}")
    # The stop: its SIGTERM reaches the probe inside its sandbox (the probe writes the file, then exits).
    systemctl("stop", UNIT)
    for tenant, root in ROOTS.items():
        got = (root / "stopped-gracefully").read_text() if (root / "stopped-gracefully").exists() else None
        check(got == "15", f"{tenant}'s probe did not get the stop's SIGTERM (stopped-gracefully: {got!r})")
    scores = []
    for unit in (UNIT, KEEPER_UNIT):  # (the workers are the keeper's unit's: its directives are theirs)
        security = run(["systemd-analyze", "security", "--no-pager", unit])
        found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\S+)", security.stdout)
        check(found, f"systemd-analyze security {unit} printed no overall level:\n{security.stdout[-2000:]}\n"
              f"{security.stderr}")
        assert found is not None
        exposure = float(found.group(1))
        say(f"    systemd-analyze security {unit}: {exposure} {found.group(2)}")
        check(exposure <= MAX_EXPOSURE, f"{unit}'s exposure is {exposure}, over {MAX_EXPOSURE}:\n"
              + "\n".join(line for line in security.stdout.splitlines() if "✗" in line))
        figures[f"exposure {unit}"] = exposure
        scores.append(f"{unit} {exposure} {found.group(2)}")
    return (f"each tenant sees its own root and 2 processes of {host_pids}; the other's root, elasticd's files and "
            f"the host's /tmp out of reach; systemd-analyze security: {', '.join(scores)}"), figures
