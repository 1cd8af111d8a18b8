"""The keeper's process: ``python -m elasticd.keeper --socket PATH`` (the unit ``elasticd-keeper.service`` runs it;
elasticd starts one of its own, tied to its life, where there is none).

One thread, one ``selectors`` loop: the listening socket, elasticd's connection (one at a time: a newer one
replaces it — the older is a dead instance's), and the wake-up pipe that signals write into (``SIGCHLD``: reap;
``SIGTERM``: stop). No asyncio: a fork from a process with one thread and nothing running is the simple, safe case,
and the keeper forks for every worker.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import errno
import logging
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Final

from elasticd.keeper.table import Child, Children, orphans_expired
from elasticd.keeper.wire import MAX_MESSAGE, Spawn, WireError, decode, encode, parse_spawn
from elasticd.supervisor.identity import start_time
from elasticd.systemd import listen_fds

__all__ = ["main"]

log = logging.getLogger("elasticd.keeper")

_MAX_FDS: Final = 8  # per message received: a spawn's four
_STOP_GRACE: Final = 5.0  # SIGTERM to the children's groups, then SIGKILL
_PR_SET_PDEATHSIG: Final = 1
_SEND_TIMEOUT: Final = 5.0


class Keeper:
    __slots__ = ("away_since", "base", "base_refused", "bound", "children", "conn", "listener", "selector",
                 "stopping", "wake_read")

    def __init__(self, listener: socket.socket, bound: float, base: str | None = None,
                 base_refused: str | None = None) -> None:
        self.listener = listener
        self.base = base  # the tenants' cgroup base, when the keeper's unit gives it one (--place)
        self.base_refused = base_refused  # why the keeper could not take it (placing itself failed)
        self.bound = bound
        self.children = Children()
        self.conn: socket.socket | None = None
        self.away_since: float | None = time.monotonic()  # no elasticd yet: the bound runs from the start
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: None)  # (a handler, so that the signal reaches the wake-up fd)
        self.selector.register(listener, selectors.EVENT_READ, self._accept)
        self.selector.register(self.wake_read, selectors.EVENT_READ, self._woken)

    def run(self) -> int:
        while not self.stopping:
            timeout = None
            if self.away_since is not None and self.bound > 0:
                timeout = max(0.0, self.away_since + self.bound - time.monotonic())
            for key, _ in self.selector.select(timeout):
                key.data()
            self._reap()
            if orphans_expired(time.monotonic(), self.away_since, self.bound):
                if self.children.live:
                    log.warning("no elasticd came back within %gs: stopping its %d workers", self.bound,
                                len(self.children.live))
                self.stopping = True
        self._stop_children()
        return 0

    # ------------------------------------------------------------------ elasticd's connection

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        if self.conn is not None:  # the newer elasticd wins: the older is gone (a crash) or re-executed itself
            self._drop_conn("replaced by a newer connection")
        # Blocking, within a bound: each message is small and elasticd reads them as they come; one that does not read
        # for that long (hung: its watchdog ends it soon) loses its connection rather than stopping the keeper.
        conn.settimeout(_SEND_TIMEOUT)
        self.conn = conn
        self.away_since = None
        self.selector.register(conn, selectors.EVENT_READ, self._readable)

    def _drop_conn(self, why: str) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        log.info("elasticd's connection ended (%s)", why)
        self.selector.unregister(conn)
        conn.close()
        self.away_since = time.monotonic()

    def _send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        if self.conn is None:
            return
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self.conn.sendmsg([encode(message)], ancillary)
        except OSError as exc:
            self._drop_conn(f"a send failed: {exc}")

    def _readable(self) -> None:
        conn = self.conn
        assert conn is not None
        fds = array.array("i")
        try:
            data, ancdata, flags, _ = conn.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize),
                                                   socket.MSG_CMSG_CLOEXEC)  # (no worker inherits another's)
        except OSError as exc:
            self._drop_conn(f"a read failed: {exc}")
            return
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        received = list(fds)
        try:
            if not data:
                self._drop_conn("elasticd closed it")
                return
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise WireError("a message or its descriptors were cut")
            self._handle(decode(data), received)
        except WireError as exc:
            log.error("elasticd sent what the keeper cannot take (%s): its connection is closed", exc)
            self._drop_conn(str(exc))
        finally:
            for fd in received:  # (a child has its own copies; a held output descriptor was dup'ed)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message["op"]
        if op == "hello":
            for child in self.children.rows():
                row = {"op": "child", "pid": child.pid, "label": child.label, "started": child.started,
                       "code": child.code, "output": child.output is not None}
                self._send(row, [child.output] if child.output is not None else None)
            self._send({"op": "ready", "pid": os.getpid(), "base": self.base, "base_refused": self.base_refused})
        elif op == "spawn":
            self._spawn(parse_spawn(message, len(fds)), fds)
        elif op == "forget":
            pid = message.get("pid")
            forgotten = self.children.forget(pid) if isinstance(pid, int) else None
            if forgotten is not None and forgotten.output is not None:
                os.close(forgotten.output)
        elif op == "stop":
            log.info("elasticd stops for good: the keeper stops too")
            self.stopping = True
        else:
            raise WireError(f"unknown op {op!r}")

    # ------------------------------------------------------------------ children

    def _spawn(self, spawn: Spawn, fds: list[int]) -> None:
        try:
            pid = _fork_exec(spawn, fds[:3])
        except OSError as exc:
            self._send({"op": "refused", "seq": spawn.seq, "error": str(exc)})
            return
        output = os.dup(fds[3]) if spawn.hold else None
        started = start_time(pid) or 0  # (0: it ended already; its exit follows)
        self.children.spawned(Child(pid, spawn.label, started, output))
        self._send({"op": "spawned", "seq": spawn.seq, "pid": pid, "started": started})

    def _woken(self) -> None:
        with contextlib.suppress(BlockingIOError):
            for signum in os.read(self.wake_read, 512):
                if signum in (signal.SIGTERM, signal.SIGINT):
                    log.info("asked to stop (signal %d): the workers stop with the keeper", signum)
                    self.stopping = True

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child, dropped = self.children.ended(pid, os.waitstatus_to_exitcode(status))
            for old in dropped:
                if old.output is not None:
                    os.close(old.output)
            if child is not None:
                self._send({"op": "exited", "pid": pid, "code": child.code})

    def _stop_children(self) -> None:
        """Every child's process group, SIGTERM, then what is left SIGKILL: nothing outlives the keeper."""
        live = list(self.children.live)
        for signum, wait in ((signal.SIGTERM, _STOP_GRACE), (signal.SIGKILL, 1.0)):
            for pid in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signum)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            deadline = time.monotonic() + wait
            while self.children.live and time.monotonic() < deadline:
                time.sleep(0.05)
                self._reap()
            live = list(self.children.live)
            if not live:
                return


def _fork_exec(spawn: Spawn, stdio: list[int]) -> int:
    """Fork; in the child, a session of its own, the three descriptors, the directory, then exec. An exec that fails is
    reported through a close-on-exec pipe (as subprocess does): OSError here, with the child's errno."""
    path = _resolve(spawn.argv[0], spawn.env)
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: nothing but system calls until exec
        code = 127
        try:
            os.close(report_read)
            os.setsid()
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            os.chdir(spawn.cwd)
            # What Python set for itself is not the worker's: SIGPIPE ignored, and the keeper's handlers (exec
            # resets a handled signal, not an ignored one) and wake-up fd.
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.execve(path, list(spawn.argv), spawn.env)
        except OSError as exc:
            os.write(report_write, str(exc.errno or errno.EIO).encode())
        finally:
            os._exit(code)
    os.close(report_write)
    try:
        report = os.read(report_read, 64)
    finally:
        os.close(report_read)
    if report:
        os.waitpid(pid, 0)
        number = int(report)
        raise OSError(number, f"{spawn.argv[0]}: {os.strerror(number)}")
    return pid


def _resolve(program: str, env: dict[str, str]) -> str:
    if "/" in program:
        return program
    for directory in os.get_exec_path(env):
        candidate = os.path.join(directory, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return program  # (execve fails with ENOENT, reported as such)


def place_in_own_leaf() -> tuple[str, str | None]:
    """Under its unit (``Delegate=yes``), the keeper's cgroup becomes the tenants' base: the keeper moves to the leaf
    ``<base>/keeper`` (the no-internal-process rule: a cgroup that hands controllers to its children holds no process
    itself) and hands its children every controller it has. The base's path, and why it could not be taken (a
    read-only cgroupfs: the workers could not be put in their leaves either), for elasticd's ``cgroups.mode`` to
    decide on."""
    relative = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1]
    base = Path("/sys/fs/cgroup") / relative.lstrip("/")
    if base.name == "keeper":  # (placed already: a re-exec of the keeper)
        return str(base.parent), None
    try:
        leaf = base / "keeper"
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        controllers = (base / "cgroup.controllers").read_text().split()
        if controllers:
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{name}" for name in controllers))
    except OSError as exc:
        log.warning("cannot take the cgroup %s for the tenants: %s", base, exc)
        return str(base), exc.strerror or str(exc)
    return str(base), None


def listening_socket(path: str) -> socket.socket:
    """The keeper's socket, root's alone: systemd's (``elasticd-keeper.socket``, passed as descriptor 3: it listens
    while no keeper runs, and a connect starts one); else bound here with a umask that leaves it 0600, in a
    directory made 0700."""
    passed = [fd for fds in listen_fds(os.environ).values() for fd in fds]
    if passed:
        for extra in passed[1:]:
            os.close(extra)
        sock = socket.socket(fileno=passed[0])
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            raise SystemExit(f"elasticd-keeper: the socket systemd passed is not a Unix seqpacket one: {sock}")
        sock.setblocking(False)
        os.set_inheritable(sock.fileno(), False)
        return sock
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(4)
    sock.setblocking(False)
    return sock


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elasticd-keeper", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="where elasticd connects (made 0600, its directory 0700)")
    parser.add_argument("--orphan-bound", type=float, default=60.0,
                        help="seconds the workers wait for an elasticd to connect before the keeper stops them "
                             "(0: forever)")
    parser.add_argument("--place", action="store_true",
                        help="move into <own cgroup>/keeper and make the own cgroup the tenants' base (its unit)")
    parser.add_argument("--parent-death", action="store_true",
                        help="stop (and stop the workers) when the process that started the keeper dies")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="elasticd-keeper: %(message)s", stream=sys.stderr)
    if args.parent_death:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:  # the parent died before the prctl: nothing would ever signal
            return 0
    base = refused = None
    if args.place:
        base, refused = place_in_own_leaf()
        if refused is None:
            log.info("the tenants' cgroups are under %s", base)
    keeper = Keeper(listening_socket(args.socket), args.orphan_bound, base, refused)
    log.info("listening on %s (pid %d)", args.socket, os.getpid())
    return keeper.run()
