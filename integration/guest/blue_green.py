"""Scenario 16, groups as runtime versions (issue #15): under systemd, with the tenant's workers running as its own
user in their cgroup leaf, a blue/green switch — ``default_group`` changed and ``systemctl reload`` — sends new
users to blue while every user placed on green stays there; as green's users log out they go to blue, and green
empties out, then stops at zero (its process gone from the leaf). An app at ``min_workers: 0`` starts its worker
on its first request (a cold start, timed) and goes back to zero after its ``idle_timeout``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import (
    BASE,
    UNIT,
    browse,
    check,
    procs,
    start_with,
    status,
    systemctl,
    tenant_user,
    wait_for,
    write_config,
)

TENANT, APP, LAZY = "solo", "site", "lazy"
HOST, LAZY_HOST = "bluegreen.localhost", "lazy.localhost"
ROOT = Path("/srv", TENANT, APP)
USERS = 4
# The lazy app's idle_timeout: long enough that the worker its cold start made is still there when the scenario
# asks (at 3 s the worker was once gone already, when the scenario asked through elasticctl: seconds under TCG).
LAZY_IDLE_S = 10

CONFIG = """\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
  occupancy_interval: 1s
tenants:
  {tenant}:
    user: {user}
    resources: {{cpu: 100%, memory: 512M}}
    apps:
      {app}:
        domains: [{host}]
        root: {root}
        default_group: {default}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{DEMO_GREETING: green}}
            pool: {{min_workers: 1, max_workers: 2}}
          blue:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{DEMO_GREETING: blue}}
            pool: {{min_workers: 1, max_workers: 2}}
      {lazy}:
        domains: [{lazy_host}]
        root: {root}
        groups:
          main:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 0, max_workers: 1, idle_timeout: {lazy_idle}s}}
"""


def _config(default: str) -> str:
    return CONFIG.format(tenant=TENANT, user=tenant_user(TENANT), app=APP, host=HOST, root=ROOT, default=default,
                         lazy=LAZY, lazy_host=LAZY_HOST, lazy_idle=LAZY_IDLE_S)


def _groups(app: str = APP) -> dict[str, Any]:
    """The app's groups from GET /v1/status (what `elasticctl status --json` prints, polled without its Python
    start-up: ~2 s of a guest CPU under TCG at every poll)."""
    groups: dict[str, Any] = status()["tenants"][TENANT]["apps"][app]["groups"]
    return groups


def _running(group: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in group["workers"] if w["state"] == "running"]


def _groups_when(ready: Any, app: str = APP) -> Any:
    """The app's groups once ``ready(groups)`` holds (None until then), for wait_for."""
    groups = _groups(app)
    return groups if ready(groups) else None


def _visit(path: str, cookie: str | None) -> tuple[str, str]:
    """(the greeting of the group that answered, the user's cookie)."""
    status, body, uid = browse(HOST, path, cookie)
    check(status == 200, f"{path} answered {status}: {body[-300:]!r}")
    return body.decode().split("\n")[0], uid or cookie or ""


def s_blue_green() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    start_with(_config("green"))
    groups = wait_for(lambda: _groups_when(lambda g: len(_running(g["green"])) == 1), 90, 0.5)
    check(groups, f"green did not come up: {_groups()}")
    check(groups["blue"]["workers"] == [], f"blue (neither default nor canary) started workers: {groups['blue']}")
    green_pid = _running(groups["green"])[0]["pid"]
    leaf = BASE / "tenants" / TENANT / APP
    check(green_pid in procs(leaf), f"green's pid {green_pid} is not in {leaf}")
    users = []
    for n in range(USERS):
        greeting, cookie = _visit(f"/login?name=user{n}", None)
        greeting, _ = _visit("/", cookie)
        check(greeting == "green", f"user{n} was answered by {greeting!r}, not green")
        users.append(cookie)

    write_config(_config("blue"))
    reloaded = systemctl("reload", UNIT)
    check(reloaded.returncode == 0, f"systemctl reload failed: {reloaded.stderr.strip()}")
    groups = wait_for(lambda: _groups_when(lambda g: bool(_running(g["blue"]))), 90, 0.5)
    check(groups, f"blue did not come up after the switch: {_groups()}")
    greeting, newcomer = _visit("/", None)
    greeting, _ = _visit("/", newcomer)
    check(greeting == "blue", f"a new user after the switch was answered by {greeting!r}, not blue")
    for n, cookie in enumerate(users):
        greeting, _ = _visit("/", cookie)
        check(greeting == "green", f"user{n}, placed before the switch, was answered by {greeting!r}")
    emptying = []
    for n, cookie in enumerate(users):
        _visit("/logout", cookie)
        greeting, _ = _visit("/", cookie)
        check(greeting == "blue", f"user{n} after its logout was answered by {greeting!r}, not blue")
        emptying.append(_groups()["green"]["sticky_users"])
    check(emptying == list(range(USERS - 1, -1, -1)), f"green's users as they logged out: {emptying}")
    began = time.monotonic()
    zero = wait_for(lambda: _groups_when(lambda g: not g["green"]["workers"]), 60, 0.5)
    check(zero, f"green did not stop at zero users: {_groups()['green']}")
    stopped_in = time.monotonic() - began
    check(wait_for(lambda: green_pid not in procs(leaf), 30, 0.5), f"green's pid {green_pid} is still in {leaf}")

    # Scale to zero: the lazy app has no worker until its first request.
    lazy_leaf = BASE / "tenants" / TENANT / LAZY
    check(_groups(LAZY)["main"]["workers"] == [], f"{LAZY} started a worker before any request")
    cold_began = time.monotonic()
    status, body, _ = browse(LAZY_HOST, "/")  # no cookie kept: no user stays on the surface
    cold = time.monotonic() - cold_began
    check(status == 200, f"the cold start answered {status}: {body[-300:]!r}")
    lazy = _running(_groups(LAZY)["main"])
    check(len(lazy) == 1 and lazy[0]["pid"] in procs(lazy_leaf), f"the cold-started worker: {lazy}")
    idle_began = time.monotonic()
    check(wait_for(lambda: not _groups(LAZY)["main"]["workers"], 60, 0.5),
          f"{LAZY} did not go back to zero after its idle_timeout: {_groups(LAZY)}")
    idle = time.monotonic() - idle_began
    return (f"after the switch to blue, {USERS} placed users stayed on green (pid {green_pid}) and a new one went "
            f"to blue; as they logged out, green's users went {emptying} and each next answer came from blue; green "
            f"stopped at zero {stopped_in:.1f}s after its last user left and its pid left the leaf; {LAZY} "
            f"(min_workers 0) answered its first request after a cold start in {cold:.1f}s (a worker as "
            f"{tenant_user(TENANT)} in its leaf), and was back at zero {idle:.1f}s later "
            f"(idle_timeout {LAZY_IDLE_S}s)",
            {"emptying": emptying, "cold_seconds": cold, "idle_seconds": idle})
