"""Runs a real elasticd as a subprocess on a fake cgroup tree, with a real NOTIFY_SOCKET, for functional tests.

Everything lives under one temporary directory: the fake tree, the runtime dir, the admin socket, the config.
The daemon is stopped by its pid at the end; every worker pid it reported is checked to be gone.
"""

from __future__ import annotations

import array
import contextlib
import http.client
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

PYTHON = sys.executable


# Ports for the tests' servers come from below Linux's ephemeral range (32768-60999 by default): a port that
# bind(0) gave and the test then released could be taken, before the server binds it, by any outgoing connection
# (a worker's, a client's), which draws from that range; and two calls could return the same just-released port.
# Once in a clean-clone run a daemon's front failed on "address already in use" that way.
_ALL_PORTS = range(20000, 32768)
# ./dev test runs two suites at once on one loopback (the sources', and Debian 13's in its test root): each takes its
# half, ELASTICD_TEST_PORTS=lower or upper, so that neither can take a port the other just found free.
_HALVES = {"": _ALL_PORTS, "lower": _ALL_PORTS[:len(_ALL_PORTS) // 2], "upper": _ALL_PORTS[len(_ALL_PORTS) // 2:]}
_half = os.environ.get("ELASTICD_TEST_PORTS", "")
if _half not in _HALVES:
    raise RuntimeError(f"ELASTICD_TEST_PORTS={_half!r}: name the half of the tests' ports, lower or upper (or unset)")
_PORTS = _HALVES[_half]
_given: set[int] = set()


def free_port() -> int:
    """A loopback port free now, never one given before in this test run, outside the ephemeral range."""
    for _ in range(200):
        port = random.choice(_PORTS)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {_PORTS.start}-{_PORTS.stop - 1} after 200 tries")


def fake_cgroup_tree(path: Path, controllers: str = "cpu memory pids io") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.procs").write_text("")
    return path


def browse(d: Daemon, path: str, cookie: str | None = None, host: str = "shop.localhost",
           timeout: float = 30) -> tuple[int, str, str | None]:
    """GET through the front as a browser would: (status, body, the elastic_uid it holds afterwards)."""
    conn = http.client.HTTPConnection(d.host, d.port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": host, **({"Cookie": f"elastic_uid={cookie}"} if cookie else {})})
        response = conn.getresponse()
        body = response.read().decode(errors="replace")
        set_cookie = response.getheader("Set-Cookie")
        return response.status, body, set_cookie.split("elastic_uid=")[1].split(";")[0] if set_cookie else cookie
    finally:
        conn.close()


# Started as a restarted service is: the stored descriptors moved to 3, 4, … (in the order LISTEN_FDNAMES names them)
# and LISTEN_PID set to the very process that then execs elasticd (sd_listen_fds(3) checks it).
_LISTEN_EXEC = """\
import fcntl, os, sys
fds = [int(fd) for fd in sys.argv[1].split(",")]
copies = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1000) for fd in fds]
for index, fd in enumerate(copies):
    os.dup2(fd, 3 + index)
os.environ.update(LISTEN_FDS=str(len(fds)), LISTEN_PID=str(os.getpid()))
os.execv(sys.argv[2], sys.argv[2:])
"""


class NotifySocket:
    """The systemd side of sd_notify: a datagram socket collecting every message the daemon sends, and systemd's
    file-descriptor store (``FDSTORE=1`` with ``FDNAME=``, ``FDSTOREREMOVE=1``): what it keeps is handed to the next
    start as ``LISTEN_FDS`` (``Daemon.crash``), as systemd hands it to a restarted service."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []
        self.store: dict[str, list[int]] = {}

    def _take(self, data: bytes, ancdata: list) -> None:
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        message = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.messages.append(message)
        name = message.get("FDNAME", "stored")
        if message.get("FDSTORE") == "1":
            kept = self.store.setdefault(name, [])
            for fd in fds:  # (systemd keeps one copy of a file however often it is sent)
                if any(os.path.samestat(os.fstat(fd), os.fstat(old)) for old in kept):
                    os.close(fd)
                else:
                    kept.append(fd)
            return
        if message.get("FDSTOREREMOVE") == "1":
            for fd in self.store.pop(name, []):
                os.close(fd)
        for fd in fds:
            os.close(fd)

    def _receive(self) -> None:
        data, ancdata, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(64 * 4))
        self._take(data, ancdata)

    def wait_for(self, key: str, value: str | None = None, timeout: float = 30.0, after: int = 0) -> dict[str, str]:
        """The first message (from index ``after``) that sets ``key`` (to ``value``)."""
        deadline = time.monotonic() + timeout
        index = after
        while True:
            while index < len(self.messages):
                message = self.messages[index]
                index += 1
                if key in message and (value is None or message[key] == value):
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {key}={value} from the daemon in {timeout}s; got {self.messages}")
            self.sock.settimeout(remaining)
            try:
                self._receive()
            except TimeoutError:
                continue

    def drain(self) -> None:
        """Collect what was sent and not yet read (e.g. STOPPING=1 from a daemon that has exited)."""
        self.sock.setblocking(False)
        try:
            while True:
                self._receive()
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        if self.sock.fileno() != -1:
            self.drain()
            self.sock.close()
        for fds in self.store.values():
            for fd in fds:
                os.close(fd)
        self.store.clear()


class Daemon:
    def __init__(self, tmp: Path, tenants_yaml: str, *, mode: str = "required", stop_timeout: str = "3s",
                 extra_server: str = "", host: str = "127.0.0.1", netns: str | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.args = args  # more of elasticd's command line (--keeper SOCKET: a keeper of the test's, as its unit's)
        self.cgroup = fake_cgroup_tree(tmp / "cg")
        self.runtime = tmp / "run"
        self.admin = tmp / "admin.sock"
        self.host = host  # the front's address (another loopback address, or one in ``netns``: a second host)
        self.netns = netns  # a network namespace the daemon runs in (`ip netns exec` execs: the pid is the same)
        self.port = free_port()
        self.metrics_port = free_port()
        self.config_path = tmp / "elastic.yaml"
        self.log_path = tmp / "elasticd.log"
        self.server_yaml = textwrap.dedent(f"""\
            server:
              listen: {host}:{self.port}
              metrics_listen: 127.0.0.1:{self.metrics_port}
              admin_socket: {self.admin}
              runtime_dir: {self.runtime}
              tmp_dir: {tmp / "tenant-tmp"}
              stop_timeout: {stop_timeout}
              cgroups: {{mode: {mode}, path: {self.cgroup}}}
            """) + extra_server
        self.write_config(tenants_yaml)
        self.notify = NotifySocket(tmp / "notify.sock")
        self.process: subprocess.Popen[bytes] | None = None
        self.seen_pids: set[int] = set()

    def write_config(self, tenants_yaml: str) -> None:
        self.config_path.write_text(self.server_yaml + textwrap.dedent(tenants_yaml))

    def start(self, wait_ready: bool = True, nofile: int | None = None, ready_timeout: float = 30.0,
              stored: bool = False) -> None:
        """``nofile``: the daemon's descriptor limit (soft and hard), as a unit's LimitNOFILE= sets it. ``stored``:
        with what the store keeps passed as systemd passes it (LISTEN_FDS, from descriptor 3, and their names)."""
        env = {**os.environ, "NOTIFY_SOCKET": str(self.notify.path)}
        env.pop("JOURNAL_STREAM", None)
        mark = len(self.notify.messages)
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        inside = ["ip", "netns", "exec", self.netns] if self.netns is not None else []
        passed = [(name, fd) for name, fds in self.notify.store.items() for fd in fds] if stored else []
        wrapper = []
        if passed:
            env["LISTEN_FDNAMES"] = ":".join(name for name, _ in passed)
            wrapper = [PYTHON, "-c", _LISTEN_EXEC, ",".join(str(fd) for _, fd in passed)]

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        self.process = subprocess.Popen([*inside, *wrapper, PYTHON, "-m", "elasticd.daemon", "--config",
                                         str(self.config_path), *self.args],
                                        env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        preexec_fn=limit if nofile is not None else None,
                                        pass_fds=[fd for _, fd in passed])
        if wait_ready:
            self.notify.wait_for("READY", "1", after=mark, timeout=ready_timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def reload(self) -> dict[str, str]:
        """SIGHUP, then the READY=1 that follows RELOADING=1."""
        mark = len(self.notify.messages)
        self.signal(signal.SIGHUP)
        reloading = self.notify.wait_for("RELOADING", "1", after=mark)
        index = self.notify.messages.index(reloading)
        return self.notify.wait_for("READY", "1", after=index + 1)

    def ctl(self, *args: str, input_file: Path | None = None) -> subprocess.CompletedProcess[str]:
        """elasticctl against this daemon; ``input_file`` as its standard input."""
        stdin = open(input_file) if input_file is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
        try:
            return subprocess.run([PYTHON, "-m", "elasticd.ctl", "--socket", str(self.admin), *args],
                                  capture_output=True, text=True, timeout=60, stdin=stdin)
        finally:
            if input_file is not None:
                stdin.close()

    def status(self) -> dict[str, Any]:
        result = self.ctl("status", "--json")
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        for tenant in data["tenants"].values():
            for app in tenant["apps"].values():
                for group in app["groups"].values():
                    self.seen_pids.update(w["pid"] for w in group["workers"] if w["pid"])
        return data

    def workers(self, tenant: str, app: str, group: str) -> list[dict[str, Any]]:
        return self.status()["tenants"][tenant]["apps"][app]["groups"][group]["workers"]

    def wait_workers(self, tenant: str, app: str, group: str, predicate, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while True:
            workers = self.workers(tenant, app, group)
            if predicate(workers):
                return workers
            if time.monotonic() > deadline:
                raise AssertionError(f"workers of {tenant}/{app}/{group} never matched: {workers}")
            time.sleep(0.1)

    def get(self, host: str, path: str = "/", headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path, headers={"Host": host, **(headers or {})})
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace"), response.headers
        finally:
            conn.close()

    def announced(self, count: int, timeout: float = 30.0, app: str = "acme/shop",
                  group: str = "green") -> dict[str, Any]:
        """The group's pool once ``count`` of its workers run and announced themselves on the channel."""
        deadline = time.monotonic() + timeout
        while True:
            pool = self.pool(app, group)
            running = [w for w in pool["workers"] if w["state"] == "running" and w["announced"]]
            if len(running) >= count:
                return pool
            assert time.monotonic() < deadline, f"{count} workers never announced: {pool['workers']}"
            time.sleep(0.1)

    def pool(self, app: str = "acme/shop", group: str = "green") -> dict[str, Any]:
        """One group of ``elasticctl pool APP --json``; its worker pids join seen_pids."""
        result = self.ctl("pool", app, "--json")
        assert result.returncode == 0, result.stderr
        found = json.loads(result.stdout)["groups"][group]
        self.seen_pids.update(w["pid"] for w in found["workers"] if w.get("pid"))
        return found

    def wait_pool(self, predicate, timeout: float, what: str, app: str = "acme/shop",
                  group: str = "green") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.pool(app, group)
            if predicate(found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout}s; pool: {json.dumps(found)[:4000]}")
            time.sleep(0.1)

    def crash(self, signum: int = 9) -> None:  # (SIGKILL: the class's own signal() hides the module here)
        """elasticd dies (SIGKILL: no word of its own) and is started again as systemd restarts it: with what it
        left in the store."""
        assert self.process is not None
        self.process.send_signal(signum)
        self.process.wait(30)
        self.log.close()
        self.notify.drain()  # (what it sent the store before it died)
        self.start(stored=True)

    def restart(self) -> None:
        """SIGTERM and wait, then start again on the same files (and the same notify socket), with what the store
        kept, as ``systemctl restart`` does."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)
        self.log.close()
        self.notify.drain()
        self.start(stored=True)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        self.notify.close()
        return self.process.returncode

    def leftover_workers(self) -> list[int]:
        alive = []
        for pid in self.seen_pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def _workers_of_this_daemon(self) -> list[int]:
        """Every process whose ELASTIC_LISTEN points into this daemon's runtime dir: a worker the pool started
        after the test last asked for status is not in seen_pids, and must not outlive a failed test either."""
        prefix = f"unix:{self.runtime}/"
        found = []
        for process in psutil.process_iter(["pid"]):
            try:
                if process.environ().get("ELASTIC_LISTEN", "").startswith(prefix):
                    found.append(process.pid)
            except psutil.Error:
                continue
        return found

    def kill_leftovers(self) -> None:
        self.seen_pids.update(self._workers_of_this_daemon())
        for pid in self.leftover_workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
