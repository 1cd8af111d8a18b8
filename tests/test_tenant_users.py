"""Tenants as their own Unix users, through the real daemon on a fake cgroup tree: a worker with ``user:`` runs
with that uid, its group, no supplementary groups, no capabilities and no way to regain privileges; its
sockets live in a directory only its user can enter; the channel refuses another tenant's uid.

Two throw-away system users are made for the test and removed after it. The daemon's files live under a
directory of /tmp that the users may traverse (pytest's own tmp_path is root's alone). The workers run Debian's
/usr/bin/python3 with this venv's packages on PYTHONPATH: the venv's own interpreter lives under /root (0700),
which the tenants' users cannot search — elasticd refuses to start them there, as the second test shows."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

import pytest
from harness import Daemon, browse

import elasticd
from elasticd.supervisor.sandbox_host import command_pid

SYSTEM_PYTHON = "/usr/bin/python3"
SITE = sysconfig.get_paths()["purelib"]
SOURCE = str(Path(elasticd.__file__).resolve().parent.parent)  # an editable install: its .pth is not read here


def _same_python() -> bool:
    try:
        out = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except OSError:
        return False
    return out == str(sys.version_info[:2])


pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None or not _same_python(),
                                reason="needs root, useradd, and a /usr/bin/python3 of this venv's version")

TENANTS = """\
tenants:
{tenants}
"""
TENANT = """\
  {name}:
    user: {user}
    apps:
      web:
        domains: [{name}.localhost]
        root: {root}
        groups:
          main:
            command: ["{python}", "-m", "elasticd.demo"]
            env: {{PYTHONPATH: "{pythonpath}"}}
    isolation: {{read_only: [{read_only}]}}
"""


def _status_fields(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def test_a_tenant_with_a_user_runs_unprivileged_and_apart(users, base):
    (alice, alice_uid, alice_gid), (bob, bob_uid, _) = users(), users()
    for name in ("a", "b"):
        (base / "srv" / name).mkdir(mode=0o755, parents=True)
    tenants = "".join(TENANT.format(name=n, user=u, root=base / "srv" / n, python=SYSTEM_PYTHON,
                                    pythonpath=f"{SITE}:{SOURCE}", read_only=f"{SITE}, {SOURCE}")
                      for n, u in (("a", alice), ("b", bob)))
    d = Daemon(base, TENANTS.format(tenants=tenants))
    d.start()
    try:
        [worker] = d.workers("a", "web", "main")
        command = command_pid(worker["pid"])  # (in its sandbox: the pid elasticd started is bubblewrap's)
        assert command is not None
        fields = _status_fields(command)
        assert fields["Uid"].split() == [str(alice_uid)] * 4 and fields["Gid"].split() == [str(alice_gid)] * 4
        assert fields["Groups"] == ""  # --clear-groups: none of root's
        assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0 and int(fields["CapInh"], 16) == 0
        assert fields["NoNewPrivs"] == "1" and fields["Umask"] == "0027"
        code, body, _ = browse(d, "/", host="a.localhost")
        assert code == 200 and "worker a.web.main.1" in body
        # Its sockets: a directory only its user may enter.
        a_dir = d.runtime / "workers" / "a"
        info = a_dir.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (alice_uid, 0o700)
        b_socket = d.runtime / "workers" / "b" / "web.main.1.sock"
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
                 "except PermissionError:\n    print('denied')\nelse:\n    print('connected')\n")
        as_alice = ["setpriv", f"--reuid={alice_uid}", f"--regid={alice_gid}", "--clear-groups", SYSTEM_PYTHON, "-c",
                 probe]
        assert subprocess.run([*as_alice, str(b_socket)], capture_output=True, text=True,
                              timeout=30).stdout.strip() == "denied"
        # The library worker announced itself with its own uid; bob's uid with alice's worker's token is refused.
        pool = json.loads(d.ctl("pool", "a/web", "--json").stdout)["groups"]["main"]
        assert pool["workers"][0]["announced"]
        env = dict(item.split("=", 1) for item in
                   Path(f"/proc/{command}/environ").read_text().split("\0") if "=" in item)
        assert env["USER"] == alice and env["LOGNAME"] == alice and "NOTIFY_SOCKET" not in env
        # Alice's channel socket is in her directory: bob cannot even connect to it (with her worker's token).
        a_channel = env["ELASTIC_CHANNEL"].removeprefix("unix:")
        assert a_channel == str(a_dir / "channel.sock")
        as_bob_probe = ["setpriv", f"--reuid={bob_uid}", f"--regid={bob_uid}", "--clear-groups", SYSTEM_PYTHON,
                        "-c", probe]
        assert subprocess.run([*as_bob_probe, a_channel], capture_output=True, text=True,
                              timeout=30).stdout.strip() == "denied"
        # On his own tenant's socket, alice's worker id with its token is refused: not a worker of tenant b.
        forge = ("import json, socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                 "s.sendall(json.dumps({'type': 'announce', 'worker': 'a.web.main.1', 'token': sys.argv[2]})"
                 ".encode() + b'\\n')\nprint(s.makefile().readline())\n")
        as_bob = ["setpriv", f"--reuid={bob_uid}", f"--regid={bob_uid}", "--clear-groups", SYSTEM_PYTHON, "-c",
              forge]
        b_channel = str(d.runtime / "workers" / "b" / "channel.sock")
        answer = json.loads(subprocess.run([*as_bob, b_channel, env["ELASTIC_TOKEN"]], capture_output=True,
                                           text=True, timeout=30).stdout)
        assert answer["type"] == "error" and "no worker 'a.web.main.1' of tenant b" in answer["reason"]
        with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert 'elasticd_channel_refused_total{app="",reason="announce-refused",tenant="b"} 1.0' in metrics
        tenants_api = json.loads(d.ctl("status", "--json").stdout)["tenants"]
        assert tenants_api["a"]["user"]["name"] == alice and tenants_api["b"]["user"]["uid"] == bob_uid
        assert "runs as root" not in d.log_text()
    finally:
        d.stop()
        d.kill_leftovers()


def test_an_interpreter_the_user_cannot_run_is_named_not_looped_on(users, base):
    (carol, _, _) = users()
    hidden = base / "hidden"
    hidden.mkdir(mode=0o700)  # root's, closed: as a venv under /root would be
    venv_python = hidden / "python"
    venv_python.symlink_to(SYSTEM_PYTHON)
    root = base / "srv"
    root.mkdir(mode=0o755)
    # (in the view: one it does not show is refused at load, config/programs.py; shown, it is the user's rights)
    tenants = TENANT.format(name="c", user=carol, root=root, python=venv_python, pythonpath=SITE,
                            read_only=f"{SITE}, {hidden}")
    d = Daemon(base, TENANTS.format(tenants=tenants))
    d.start()
    try:
        [worker] = d.wait_workers("c", "web", "main", lambda ws: ws and ws[0]["state"] == "failed", timeout=20)
        assert worker["restarts"] == 0  # not a crash loop until failed
        text = d.log_text()
        assert text.count("cannot start:") == 1
        assert f"worker c.web.main.1 of tenant c cannot start: {hidden} (owner uid 0, gid 0, mode 0700) cannot " \
               f"be searched by user {carol}" in text
    finally:
        d.stop()
        d.kill_leftovers()
