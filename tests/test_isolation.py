"""Each isolated tenant sees only its own files and processes, through the real daemon on a fake cgroup tree: two
tenants with throw-away users run tests/apps/view_probe.py, which reports what it sees from inside its sandbox.

The daemon's files live under a directory of /tmp (pytest's tmp_path is root's alone); the probe runs on Debian's
/usr/bin/python3 (standard library only), so nothing of this venv needs to be in the view."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from harness import Daemon, browse

from elasticd.config.isolation import BWRAP
from elasticd.supervisor.sandbox_host import command_pid

SYSTEM_PYTHON = "/usr/bin/python3"
PROBE = Path(__file__).resolve().parent / "apps" / "view_probe.py"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or not os.access(BWRAP, os.X_OK)
    or not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs root, useradd, bubblewrap and /usr/bin/python3")

TENANT = """\
  {name}:
    user: {user}
    apps:
      web:
        domains: [{name}.localhost]
        root: {root}
        groups:
          main:
            command: ["{python}", "probe.py"]
            env: {{PROBE_PATHS: "{paths}"}}
    isolation:
      writable: [{root}/uploads]
"""


def _root(base: Path, name: str, uid: int, gid: int) -> Path:
    root = base / "srv" / name
    (root / "uploads").mkdir(parents=True)
    (root / "secret.txt").write_text(f"{name}'s data\n")  # world-readable, as a deploy with umask 022 leaves it
    shutil.copy(PROBE, root / "probe.py")
    for path in (root, root / "uploads", root / "secret.txt", root / "probe.py"):
        os.chown(path, uid, gid)
    (base / "srv").chmod(0o755)
    return root


def _probe(d: Daemon, tenant: str) -> dict:
    code, body, _ = browse(d, "/", host=f"{tenant}.localhost")
    assert code == 200, body
    return json.loads(body)


def test_a_tenant_sees_only_its_own_files_and_processes(users, base):
    (alice, a_uid, a_gid), (bob, b_uid, b_gid) = users(), users()
    a_root, b_root = _root(base, "a", a_uid, a_gid), _root(base, "b", b_uid, b_gid)
    host_tmp_marker = Path("/tmp/probe-marker")
    assert not host_tmp_marker.exists()
    config = base / "elastic.yaml"
    paths = ":".join(str(p) for p in (
        "{own}", "{own}/uploads", "{other}", "{other}/secret.txt", config, base / "admin.sock",
        base / "run" / "workers", "/usr", "/etc", "/etc/shadow", "/home", "/root", "/proc/1/environ", "/tmp",
        "/var/tmp"))
    tenants = "".join(TENANT.format(name=n, user=u, root=r, python=SYSTEM_PYTHON,
                                    paths=paths.format(own=r, other=o))
                      for n, u, r, o in (("a", alice, a_root, b_root), ("b", bob, b_root, a_root)))
    d = Daemon(base, f"tenants:\n{tenants}")
    d.start()
    try:
        seen = _probe(d, "a")
        p = seen["paths"]
        assert seen["uid"] == a_uid
        # Its own root and declared path: there and writable; the other tenant's: absent, not merely unreadable.
        assert p[str(a_root)] == {"exists": True, "read": True, "write": True}
        assert p[f"{a_root}/uploads"]["write"]
        assert not p[str(b_root)]["exists"] and not p[f"{b_root}/secret.txt"]["exists"]
        # elasticd's own: its config, its admin socket, the other tenants' socket directories: absent.
        assert not p[str(config)]["exists"] and not p[str(base / "admin.sock")]["exists"]
        assert not p[str(base / "run" / "workers")]["read"] or set(os.listdir(base / "run" / "workers")) > {"a"}
        # The system: read-only; secrets hidden; no /home, no /root.
        assert p["/usr"] == {"exists": True, "read": True, "write": False}
        assert p["/etc"]["read"] and not p["/etc"]["write"]
        assert p["/etc/shadow"]["exists"] and not p["/etc/shadow"]["read"]
        assert not p["/home"]["exists"] and not p["/root"]["exists"]
        # /proc: its own pid namespace (bubblewrap's init and the probe), pid 1 not elasticd nor the host's init.
        assert seen["pids"] == [1, 2] and not p["/proc/1/environ"]["read"]
        # /tmp: writable, and the tenant's own, not the host's.
        assert p["/tmp"]["write"] and p["/var/tmp"]["write"], (p["/tmp"], p["/var/tmp"])
        assert not host_tmp_marker.exists()
        assert (base / "tenant-tmp" / "a" / "tmp" / "probe-marker").read_text() == "a.web.main.1"
        # Bob's view is his: the same checks the other way round.
        theirs = _probe(d, "b")
        assert not theirs["paths"][str(a_root)]["exists"] and theirs["paths"][str(b_root)]["write"]
        assert theirs["pids"] == [1, 2]
        # From the host, the command is a grandchild of the pid elasticd started, as the tenant's user.
        [worker] = d.workers("a", "web", "main")
        command = command_pid(worker["pid"])
        assert command is not None and os.stat(f"/proc/{command}").st_uid == a_uid
        status = d.ctl("status").stdout
        assert "own mount+pid namespace (bubblewrap)" in status and f"/tmp {base}/tenant-tmp/a/tmp" in status
        assert json.loads(d.ctl("status", "--json").stdout)["tenants"]["a"]["isolation"]["read_write"] == [
            str(a_root), f"{a_root}/uploads"]
    finally:
        d.stop()
        d.kill_leftovers()
    # The stop's SIGTERM reached the command inside the sandbox (not only bubblewrap around it).
    assert (a_root / "stopped-gracefully").read_text() == "15"
    assert (b_root / "stopped-gracefully").read_text() == "15"


def test_a_sandbox_that_cannot_be_made_leaves_the_worker_unstarted(users, base):
    (carol, c_uid, c_gid) = users()
    root = _root(base, "c", c_uid, c_gid)
    d = Daemon(base, f"tenants:\n{TENANT.format(name='c', user=carol, root=root, python=SYSTEM_PYTHON, paths='')}")
    d.start()
    try:
        [worker] = d.workers("c", "web", "main")
        assert worker["state"] == "running"
        # The declared path goes away after the load: the next start's bind fails, and bubblewrap execs nothing.
        shutil.rmtree(root / "uploads")
        command = command_pid(worker["pid"])
        assert command is not None
        os.kill(command, 9)
        deadline = time.monotonic() + 20
        while "Can't find source path" not in d.log_text():
            assert time.monotonic() < deadline, d.log_text()[-3000:]
            time.sleep(0.1)
        text = d.log_text()
        assert f"[c.web.main.1] bwrap: Can't find source path {root}/uploads" in text
        assert text.count("probe listening") == 1  # the command never ran again
        assert d.workers("c", "web", "main")[0]["state"] != "running"
    finally:
        d.stop()
        d.kill_leftovers()
