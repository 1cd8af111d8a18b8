"""Real third-party apps as isolated tenants, through the real daemon on a fake cgroup tree: a Flask app served by
gunicorn (two workers), a Starlette app served by uvicorn and a Node.js http server, each tenant its own throw-away
Unix user with an app root of its own, each answering through elasticd's front by its Host.

Every app answers ``GET /`` with what it sees from inside its sandbox (tests/apps/isolation/: view.py for the
Python apps, server.js for Node): the pids in its /proc (its own pid namespace: bubblewrap's init and its own few
processes, not the host's), whether the other two tenants' roots exist (given in ``$OTHER_ROOTS`` by the group's
``env:``; they must not), its uid, its own root, and whether its private /tmp takes a file (gunicorn's worker
heartbeat files live there: its workers would not boot otherwise).

The apps are Debian's (gunicorn, python3-flask, python3-uvicorn, python3-starlette for /usr/bin/python3; node),
all under /usr, which every sandbox shows read-only: no ``read_only:`` path is needed. The daemon's files live
under a directory of /tmp that the users may traverse (pytest's own tmp_path is root's alone)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness import Daemon, browse

APPS = Path(__file__).resolve().parent / "apps" / "isolation"
SYSTEM_PYTHON = "/usr/bin/python3"
GUNICORN = "/usr/bin/gunicorn"
NODE = "/usr/bin/node"
BWRAP = "/usr/bin/bwrap"


def _missing() -> list[str]:
    """What this machine lacks for the test (empty: it can run)."""
    missing = [path for path in (GUNICORN, NODE, BWRAP, SYSTEM_PYTHON) if not os.access(path, os.X_OK)]
    if shutil.which("useradd") is None:
        missing.append("useradd")
    if os.access(SYSTEM_PYTHON, os.X_OK):
        for module in ("flask", "uvicorn", "starlette"):
            try:
                found = subprocess.run([SYSTEM_PYTHON, "-c", f"import {module}"], capture_output=True,
                                       timeout=30).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                found = False
            if not found:
                missing.append(f"{SYSTEM_PYTHON} module {module}")
    return missing


MISSING = _missing() if os.geteuid() == 0 else []
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or bool(MISSING),
                                reason="needs root" if os.geteuid() != 0 else f"needs {', '.join(MISSING)}")

TENANT = """\
  {name}:
    user: {user}
    apps:
      web:
        domains: [{name}.localhost]
        root: {root}
        groups:
          main:
            command: {command}
            env: {{OTHER_ROOTS: "{others}"}}
            pool: {{min_workers: 1, max_workers: 1}}
"""


# tenant: (its command, the files of tests/apps/isolation copied into its root: source -> name in the root)
APP_SPECS: dict[str, tuple[list[str], dict[str, str]]] = {
    "flask": ([GUNICORN, "--bind", "unix:{socket}", "--workers", "2", "app:app"],
              {"flask_app.py": "app.py", "view.py": "view.py"}),
    "starlette": ([SYSTEM_PYTHON, "-m", "uvicorn", "--uds", "{socket}", "app:app"],
                  {"starlette_app.py": "app.py", "view.py": "view.py"}),
    "node": ([NODE, "server.js"], {"server.js": "server.js"}),
}


def _root(base: Path, tenant: str, uid: int, gid: int) -> Path:
    """The tenant's own app root, owned by its user, holding its app's files."""
    root = base / "srv" / tenant
    root.mkdir(mode=0o755, parents=True)
    for source, name in APP_SPECS[tenant][1].items():
        target = root / name
        shutil.copyfile(APPS / source, target)
        target.chmod(0o644)
        os.chown(target, uid, gid)
    os.chown(root, uid, gid)
    return root


def test_real_apps_run_isolated_and_answer_through_the_front(users, base):
    started = time.monotonic()
    (base / "srv").mkdir(mode=0o755)
    accounts = {tenant: users() for tenant in APP_SPECS}
    roots = {tenant: _root(base, tenant, uid, gid) for tenant, (_, uid, gid) in accounts.items()}
    assert len(set(roots.values())) == len(roots)  # no two tenants share a root
    tenants = "".join(
        TENANT.format(name=tenant, user=accounts[tenant][0], root=roots[tenant],
                      command=json.dumps(APP_SPECS[tenant][0]),
                      others=":".join(str(roots[other]) for other in APP_SPECS if other != tenant))
        for tenant in APP_SPECS)
    d = Daemon(base, "tenants:\n" + tenants)
    d.start()
    try:
        for tenant in APP_SPECS:
            try:
                d.wait_workers(tenant, "web", "main", lambda ws: bool(ws) and ws[0]["state"] == "running",
                               timeout=20)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- daemon log ---\n{d.log_text()[-6000:]}") from None
        for tenant in APP_SPECS:
            code, body, _ = browse(d, "/", host=f"{tenant}.localhost", timeout=10)
            assert code == 200, f"{tenant}: {code} {body[:2000]}\n--- daemon log ---\n{d.log_text()[-6000:]}"
            seen = json.loads(body)
            assert seen["app"] == tenant
            assert seen["uid"] == accounts[tenant][1]  # its own user, not root
            # Its own pid namespace: bubblewrap's init (1) and its own processes (gunicorn: master and 2 workers).
            assert 1 in seen["pids"] and seen["pid"] in seen["pids"], seen
            assert 2 <= len(seen["pids"]) < 10, seen
            if tenant == "flask":
                assert len(seen["pids"]) == 4, seen  # init, gunicorn's master and its two workers, nothing else
            # The other tenants' roots are absent from its view; its own is there, and /tmp is its to write.
            others = {str(roots[other]) for other in APP_SPECS if other != tenant}
            assert seen["others"] == dict.fromkeys(others, False), seen
            assert seen["cwd"] == str(roots[tenant]) and seen["own_root"], seen
            assert seen["tmp_writable"], seen
        # The host, outside any sandbox, sees every root: their absence above is the view's doing.
        assert all(root.is_dir() for root in roots.values())
    finally:
        d.stop()
        d.kill_leftovers()
    assert not d.leftover_workers()
    assert time.monotonic() - started < 30
