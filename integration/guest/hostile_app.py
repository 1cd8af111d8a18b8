#!/usr/bin/python3
"""Scenario 14's hostile tenant: a worker that tries to break out, and says how each try ended.

Copied by isolation.py into the evil tenant's app root and started by elasticd as that tenant's worker (through
the trampoline and setpriv, as the tenant's user). Plain python3, standard library only.

It serves HTTP on the Unix socket of ``ELASTIC_LISTEN`` (``unix:<path>``):

- ``GET /`` answers 200 "hostile";
- ``GET /attempts`` makes every attempt now, and answers JSON: ``attempts`` (name → ``{ok, error, errno}``,
  where ok means the attempt SUCCEEDED, which is the bad outcome), the worker's own ``/proc/self/status`` lines
  (Uid, Gid, Groups, Cap*, NoNewPrivs, Umask), its pid, parent pid, cgroup, cwd, and the names of its
  environment (a few values: USER, HOME, LOGNAME, ELASTIC_LISTEN; never ELASTIC_TOKEN's).

Its targets come from the group's env (the scenario sets them): HOSTILE_GOOD_ROOT (the other tenant's app root),
HOSTILE_GOOD_SOCKET (the other tenant's worker socket), HOSTILE_GOOD_USER (the other tenant's user, whose
processes it tries to signal and whose environment, holding its token, it tries to read).
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import os
import pwd
import signal
import socket
import socketserver
import sys
from pathlib import Path

CGROOT = Path("/sys/fs/cgroup")
MARK = "elt-hostile"  # the prefix of every file it tries to create (the scenario looks for it afterwards)
GOOD_ROOT = os.environ.get("HOSTILE_GOOD_ROOT", "/srv/good/app")
GOOD_SOCKET = os.environ.get("HOSTILE_GOOD_SOCKET", "/run/elasticd/workers/good/app.main.1.sock")
GOOD_USER = os.environ.get("HOSTILE_GOOD_USER", "eltgood")
STATUS_KEYS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Umask",
               "Seccomp")
SHOWN_ENV = ("USER", "HOME", "LOGNAME", "PWD", "ELASTIC_LISTEN")


def own_leaf() -> Path:
    """Its cgroup, from /proc/self/cgroup (the v2 line ``0::/path``)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return CGROOT / line[3:].lstrip("/")
    raise RuntimeError("no cgroup v2 line in /proc/self/cgroup")


def _write(path: Path | str, data: str) -> str:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)
    return f"wrote {data!r} into {path}"


def _create(directory: str) -> str:
    path = os.path.join(directory, f"{MARK}-{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"pwned\n")
    os.close(fd)
    return f"created {path}"


def _pids_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("Uid:") and int(line.split()[1]) == uid:
                    found.append(int(entry.name))
    return sorted(found)


def _good_pid() -> int:
    pids = _pids_of(pwd.getpwnam(GOOD_USER).pw_uid)
    if not pids:
        raise LookupError(f"no process of user {GOOD_USER} found in /proc")
    return pids[0]


def _connect(path: str) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(path)
    finally:
        sock.close()
    return f"connected to {path}"


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f"read {len(f.read(4096))} bytes of {path}"


def _elasticd_pid() -> int:
    """elasticd's pid, as any process that sees the host's /proc finds it (its keeper, the worker's parent, is
    systemd's child, not elasticd's)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"/usr/bin/elasticd" in argv and b"--config" in argv:
                return int(entry)
    raise ProcessLookupError("no elasticd process in /proc")


def _attempts() -> dict[str, tuple[str, object]]:
    """name → (what it tries, how): the callables are made at each request, so each request tries afresh."""
    leaf = own_leaf()
    tenant_cg, base = leaf.parent, leaf.parents[2]
    return {
        "tenant_cpu_max": (f"write 'max 100000' into {tenant_cg / 'cpu.max'}",
                           lambda: _write(tenant_cg / "cpu.max", "max 100000")),
        "leave_leaf": (f"write its pid into {base / 'keeper' / 'cgroup.procs'}",
                       lambda: _write(base / "keeper" / "cgroup.procs", str(os.getpid()))),
        "read_shadow": ("read /etc/shadow", lambda: _read("/etc/shadow")),
        "create_in_etc": (f"create /etc/{MARK}-<pid>", lambda: _create("/etc")),
        "kill_keeper": (f"SIGTERM its parent, elasticd's keeper (pid {os.getppid()})",
                        lambda: os.kill(os.getppid(), signal.SIGTERM)),
        "kill_elasticd": (f"SIGTERM elasticd (pid {_elasticd_pid()}, found in /proc)",
                          lambda: os.kill(_elasticd_pid(), signal.SIGTERM)),
        "create_in_good_root": (f"create {GOOD_ROOT}/{MARK}-<pid>", lambda: _create(GOOD_ROOT)),
        "connect_good_socket": (f"connect to {GOOD_SOCKET}", lambda: _connect(GOOD_SOCKET)),
        "setuid_root": ("setuid(0)", lambda: os.setuid(0)),
        "kill_good_worker": (f"SIGTERM a process of user {GOOD_USER}",
                             lambda: os.kill(_good_pid(), signal.SIGTERM)),
        "read_good_environ": (f"read /proc/<pid>/environ of a process of user {GOOD_USER} (its token)",
                              lambda: _read(f"/proc/{_good_pid()}/environ")),
    }


def attempt(fn) -> dict[str, object]:
    try:
        done = fn()
    except OSError as exc:
        name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else "?"
        return {"ok": False, "errno": name, "error": f"{name}: {exc.strerror or exc}"}
    except Exception as exc:  # not the kernel's refusal: the scenario tells it apart
        return {"ok": False, "errno": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "errno": None, "error": "", "done": str(done)[:300]}


def report() -> dict[str, object]:
    attempts = {}
    for name, (what, fn) in _attempts().items():
        attempts[name] = {"what": what, **attempt(fn)}
    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
            status[key] = value.strip()
    ppid = os.getppid()
    try:
        parent = Path(f"/proc/{ppid}/comm").read_text().strip()
    except OSError as exc:
        parent = f"? ({exc.strerror})"
    return {
        "attempts": attempts, "status": status, "pid": os.getpid(), "ppid": ppid, "parent_comm": parent,
        "cgroup": str(own_leaf()), "cwd": os.getcwd(), "uid": os.getuid(), "euid": os.geteuid(),
        "gid": os.getgid(), "groups": os.getgroups(), "env_names": sorted(os.environ),
        "env": {k: os.environ.get(k) for k in SHOWN_ENV},
    }


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "hostile/1"

    def address_string(self) -> str:  # a Unix peer has no address
        return "unix"

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("hostile: " + (format % args) + "\n")
        sys.stderr.flush()

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/attempts":
            self._send(200, json.dumps(report(), indent=1).encode(), "application/json")
        elif path == "/":
            self._send(200, b"hostile\n", "text/plain")
        else:
            self._send(404, b"not found\n", "text/plain")


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main() -> int:
    listen = os.environ["ELASTIC_LISTEN"]
    if not listen.startswith("unix:"):
        sys.exit(f"hostile: ELASTIC_LISTEN is not unix:<path>: {listen!r}")
    path = listen[len("unix:"):]
    with contextlib.suppress(FileNotFoundError):  # a socket left by an earlier run of the same worker
        os.unlink(path)
    server = Server(path, Handler)
    sys.stderr.write(f"hostile: pid {os.getpid()} uid {os.getuid()} serving on {path}\n")
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
