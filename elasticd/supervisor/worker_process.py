"""One worker: a process tree started from a spec, watched, restarted with backoff, stopped with grace.

A ``Worker`` keeps its id across restarts (status shows its restart count); each start gets a fresh token
and process. The run loop is one task per worker; everything it decides (delays, the failed verdict) comes
from ``RestartPolicy``.

A worker's output (stdout and stderr) goes one of two ways, chosen once per daemon start
(``journal_for_workers``): under journald, straight to a journald stream of its own (``JournalStream`` in
spawn.py: elasticd never touches those bytes); elsewhere, through a pipe elasticd reads and logs line by line,
prefixed by the worker id, within a rate bound per worker (``OutputBound`` in output.py decides; this file only
reads, sleeps and logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from functools import partial

import psutil

from elasticd.background import watch
from elasticd.supervisor.backoff import RestartPolicy
from elasticd.supervisor.lifecycle import WorkerState, transition
from elasticd.supervisor.output import LINES_PER_SECOND, READ_CHUNK, LineSplitter, OutputBound
from elasticd.supervisor.runnable import runnable
from elasticd.supervisor.sandbox_host import command_pid, present_masks
from elasticd.supervisor.spawn import JournalStream, WorkerSpec, socket_path, spawn_argv, worker_env
from elasticd.supervisor.spawner import ChildProcess, DirectSpawner, Spawner, process_start_time
from elasticd.systemd import stderr_is_journal

__all__ = ["Adopt", "ChildProcess", "Worker", "journal_for_workers", "kill_tree"]

log = logging.getLogger("elasticd.worker")

_READY_POLL = 0.05  # seconds between connection attempts while a worker starts

# Where systemd-cat is looked for: the system's own directories. It runs as root (before setpriv), so never from a
# PATH that a group's env could point at files a tenant writes.
_SYSTEM_BIN = "/usr/bin:/bin"


def journal_for_workers(environ: Mapping[str, str] | None = None) -> str | None:
    """Decided once per daemon start: systemd-cat's absolute path when elasticd's own stderr is the journal (each
    worker's output then goes to journald directly), None when elasticd relays it (a terminal, ./dev run, tests;
    or systemd-cat missing, which is said here, once)."""
    env = os.environ if environ is None else environ
    if not stderr_is_journal(env.get("JOURNAL_STREAM")):
        return None
    systemd_cat = shutil.which("systemd-cat", path=_SYSTEM_BIN)
    if systemd_cat is None:
        log.warning("elasticd logs to the journal, but systemd-cat (package systemd) is not in %s: workers' output "
                    "is relayed through elasticd's own log instead, at most %g lines a second per worker",
                    _SYSTEM_BIN, LINES_PER_SECOND)
        return None
    log.info("workers' output goes straight to the journal through %s: journalctl -u elasticd -t <worker id>",
             systemd_cat)
    return systemd_cat


class Adopt:
    """What a worker adopted after a re-exec in place starts from: its running process, the token that process was
    given, and the read end of its output pipe (None under journald, where the output is not elasticd's)."""

    __slots__ = ("output", "process", "token")

    def __init__(self, process: ChildProcess, token: str, output: int | None) -> None:
        self.process = process
        self.token = token
        self.output = output


class Worker:
    """Its states and their transitions are lifecycle.py's table; ``_set_state`` is the one place a state changes."""

    __slots__ = (
        "_adopt",
        "_base_env",
        "_clock",
        "_exited",
        "_occupancy_interval",
        "_output",
        "_output_bound",
        "_process",
        "_ready",
        "_runtime_dir",
        "_spawner",
        "_stop_requested",
        "_systemd_cat",
        "_task",
        "app",
        "group",
        "id",
        "on_state",
        "policy",
        "restarts",
        "sandboxed",
        "served",
        "socket_path",
        "spec",
        "started_at",
        "state",
        "tenant",
        "token",
    )

    def __init__(self, worker_id: str, tenant: str, app: str, group: str, spec: WorkerSpec, *,
                 runtime_dir: str, occupancy_interval: float, base_env: Mapping[str, str] | None = None,
                 policy: RestartPolicy | None = None, clock: Callable[[], float] = time.monotonic,
                 systemd_cat: str | None = None, spawner: Spawner | None = None) -> None:
        self.id = worker_id
        self.tenant = tenant
        self.app = app
        self.group = group
        self.spec = spec
        self.socket_path = socket_path(runtime_dir, worker_id)
        self.token = ""
        self.state = WorkerState.NEW
        self.restarts = 0
        # Whether its command runs in a sandbox (a stop signals the command inside: sandbox_host). The spec's, or,
        # for a worker adopted after a re-exec whose group went, the saved word.
        self.sandboxed = spec.sandbox is not None
        # Whether its latest process became routable: an exit of one that did not is a start that failed (a broken
        # command), and the requests waiting for its group are answered at once; one that served and exited (killed,
        # crashed) is restarting, and they wait for it.
        self.served = False
        self.started_at: float | None = None
        self.policy = policy or RestartPolicy()
        self.on_state: Callable[[Worker], None] | None = None
        self._runtime_dir = runtime_dir
        self._occupancy_interval = occupancy_interval
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._clock = clock
        self._process: ChildProcess | None = None
        self._output: io.FileIO | None = None  # the read end of its output pipe while elasticd relays it
        self._adopt: Adopt | None = None  # set by ``adopt``: the first run watches that process instead of starting
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._exited = asyncio.Event()
        self._stop_requested = False
        # systemd-cat's path: the worker's output goes straight to journald. None: elasticd relays it.
        self._systemd_cat = systemd_cat
        self._output_bound: OutputBound | None = None  # the relay's, made at its first read; kept across restarts
        self._spawner: Spawner = spawner if spawner is not None else DirectSpawner()  # (the daemon's: its keeper)

    # ------------------------------------------------------------------ views

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    @property
    def routable(self) -> bool:
        return self.state is WorkerState.RUNNING

    def uptime(self) -> float | None:
        if self.state is not WorkerState.RUNNING or self.started_at is None:
            return None
        return self._clock() - self.started_at

    def describe(self) -> dict[str, object]:
        uptime = self.uptime()
        return {"id": self.id, "pid": self.pid, "state": self.state.value,
                "uptime": round(uptime, 3) if uptime is not None else None, "restarts": self.restarts}

    # ------------------------------------------------------------------ lifecycle

    def adopt(self, adopt: Adopt, *, restarts: int, served: bool) -> None:
        """Take over a process the previous image started (a re-exec in place), then ``start``: it is watched as
        if this image had started it (its socket is checked before it is routable), and restarted as any other
        when it exits."""
        self._adopt = adopt
        self.token = adopt.token
        self.restarts = restarts
        self.served = served
        self.start()

    def process_started(self) -> int | None:
        """The running process's start time (its identity with the pid, for a re-exec's state); None when none runs."""
        process = self._process
        return process_start_time(process) if process is not None and process.returncode is None else None

    def output_fd(self) -> int | None:
        """The read end of the running process's output pipe, when elasticd relays it (a re-exec passes it on)."""
        output = self._output
        return output.fileno() if output is not None and not output.closed else None

    def start(self) -> None:
        if self._task is None:
            self._task = watch(asyncio.create_task(self._run(), name=f"worker {self.id}"), log,
                               f"supervising worker {self.id}")

    async def wait_routable(self, timeout: float) -> bool:
        """True once the worker accepts connections; False on timeout or when it failed."""
        ready = asyncio.ensure_future(self._ready.wait())
        done = asyncio.ensure_future(self._exited.wait())
        try:
            await asyncio.wait({ready, done}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            done.cancel()
        return self.routable

    async def kill(self) -> None:
        """SIGKILL the process tree now (a hung worker: it would answer no signal it could handle); never
        restarts afterwards."""
        self._stop_requested = True
        process = self._process
        if process is not None and process.returncode is None:
            self._set_state(WorkerState.STOPPING)
            kill_tree(process.pid)
            await process.wait()
        await self._end()

    async def stop(self, grace: float) -> None:
        """SIGTERM, wait ``grace`` seconds, SIGKILL the process tree; never restarts afterwards."""
        self._stop_requested = True
        process = self._process
        if process is not None and process.returncode is None:
            self._set_state(WorkerState.STOPPING)
            with contextlib.suppress(ProcessLookupError):
                self._signal_command(process, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                log.warning("worker %s did not stop within %gs: killing it", self.id, grace)
                kill_tree(process.pid)
                await process.wait()
        await self._end()

    def _signal_command(self, process: ChildProcess, signum: int) -> None:
        """Signal the worker's command: the process elasticd started, or, for an isolated worker, the command inside
        its sandbox (``sandbox_host``: bubblewrap forwards no signal)."""
        target = command_pid(process.pid) if self.sandboxed else None
        if target is None:
            process.send_signal(signum)
        else:
            os.kill(target, signum)

    async def _end(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._set_state(WorkerState.STOPPED)
        self._exited.set()

    # ------------------------------------------------------------------ the run loop

    async def _run(self) -> None:
        while not self._stop_requested:
            adopt, self._adopt = self._adopt, None
            returncode = await (self._run_adopted(adopt) if adopt is not None else self._run_once())
            if self._stop_requested:
                return
            now = self._clock()
            delay = self.policy.on_exit(now, self.started_at or now)
            if delay is None and self.policy.given_up:  # said why already, once
                self._set_state(WorkerState.FAILED)
                self._exited.set()
                return
            if delay is None:
                log.error("worker %s exited with %s and has died %d times within %gs: marked failed, "
                          "not restarted (a reload retries it)", self.id, _describe_exit(returncode),
                          self.policy.max_deaths, self.policy.window)
                self._set_state(WorkerState.FAILED)
                self._exited.set()
                return
            log.warning("worker %s exited with %s; restarting in %gs", self.id, _describe_exit(returncode),
                        delay)
            self._set_state(WorkerState.BACKOFF)
            await asyncio.sleep(delay)
            self.restarts += 1

    async def _run_once(self) -> int | None:
        self._ready.clear()
        # The supervisor makes (and gives to the tenant's user) the socket directory at each activation; a worker
        # started on its own still needs one to bind in.
        os.makedirs(os.path.dirname(self.socket_path), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.token = secrets.token_hex(16)
        env = worker_env(self.spec, self._base_env, worker_id=self.id, token=self.token,
                         runtime_dir=self._runtime_dir, occupancy_interval=self._occupancy_interval)
        cwd = self.spec.cwd
        if not os.path.isdir(cwd):
            if self.restarts == 0:
                log.warning("worker %s: app root %s is not a directory; it runs in /", self.id, cwd)
            cwd = "/"
        run_as = self.spec.run_as
        if run_as is not None and self.spec.argv:
            refusal = runnable(self.spec.argv[0], env.get("PATH", os.defpath), run_as)
            if refusal is not None:
                # Not a crash loop until "failed": it cannot start until the files change, and says why once.
                log.error("worker %s of tenant %s cannot start: %s (a reload retries it)", self.id, self.tenant,
                          refusal)
                self.policy.give_up()
                return None
        self.started_at = self._clock()
        self._set_state(WorkerState.STARTING)
        journal = JournalStream(self._systemd_cat, self.id) if self._systemd_cat is not None else None
        relayed: io.FileIO | None = None  # the read end of the worker's output pipe, when elasticd relays it
        worker_end: int | None = None
        devnull = _devnull()
        if journal is not None:
            # systemd-cat replaces stdout and stderr before it execs anything a tenant wrote: until then, stderr is
            # elasticd's own, so that the trampoline's or systemd-cat's failure is in elasticd's log.
            stdio = (devnull, devnull, 2)
        else:
            # A pipe of elasticd's own rather than asyncio's PIPE: nothing reads it between the relay's reads (a
            # StreamReader's transport would, at every write), so it fills and the writer blocks. Only the read
            # end is non-blocking: the two ends are two open files, and the worker's writes must block, not fail.
            read_end, worker_end = os.pipe2(os.O_CLOEXEC)
            os.set_blocking(read_end, False)
            relayed = io.FileIO(read_end, "r")  # closing a file twice is harmless, unlike an fd
            stdio = (devnull, worker_end, worker_end)
        process: ChildProcess | None = None
        try:
            masks = present_masks(self.spec.sandbox.hidden) if self.spec.sandbox is not None else []
            # Its own session and process group (the spawner's): signals sent to elasticd's terminal or group do not
            # reach it, and the whole group can be killed when the worker goes. The keeper keeps a read end of its
            # output pipe too, so that the pipe outlives a crash of elasticd.
            process = await self._spawner.spawn(
                spawn_argv(self.spec, self.socket_path, journal, cwd=cwd, masks=masks), env, cwd, self.id, stdio,
                hold=relayed.fileno() if relayed is not None else None)
        except OSError as exc:
            log.error("worker %s could not be started: %s", self.id, exc)
        finally:
            if worker_end is not None:
                os.close(worker_end)  # the worker has its own copy: only its process tree keeps the pipe open now
            if process is None and relayed is not None:
                relayed.close()
        if process is None:
            return None
        log.info("worker %s started, pid %d", self.id, process.pid)
        return await self._watch(process, relayed)

    async def _run_adopted(self, adopt: Adopt) -> int | None:
        served = self.served
        self._ready.clear()
        self.started_at = self._clock()
        self._set_state(WorkerState.STARTING)
        self.served = served  # (adopted: it served before the re-exec, whatever its socket says in a moment)
        relayed = None
        if adopt.output is not None:
            os.set_blocking(adopt.output, False)
            relayed = io.FileIO(adopt.output, "r")
        log.info("worker %s adopted, pid %d", self.id, adopt.process.pid)
        return await self._watch(adopt.process, relayed)

    async def _watch(self, process: ChildProcess, relayed: io.FileIO | None) -> int | None:
        """Relay its output, mark it routable once its socket accepts, and wait for its end."""
        self._process = process
        self._output = relayed
        pump = None
        if relayed is not None:
            pump = watch(asyncio.create_task(self._relay_output(relayed)), log, f"relaying worker {self.id}'s output")
            pump.add_done_callback(partial(_close_pipe, relayed))  # also when cancelled before it ran at all
        probe = watch(asyncio.create_task(self._await_socket(process)), log,
                      f"waiting for worker {self.id}'s socket")
        try:
            returncode = await process.wait()
        finally:
            probe.cancel()
            # Children the worker left behind in its process group would otherwise outlive it (and hold
            # the leaf busy). The group id cannot be reused while any member lives, so this is safe.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            if pump is not None:
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(pump, 1.0)
        self._ready.clear()
        if not self._stop_requested:
            self._set_state(WorkerState.EXITED)
        return returncode

    async def _await_socket(self, process: ChildProcess) -> None:
        """Routable = its socket accepts a connection (the worker contract)."""
        while process.returncode is None:
            try:
                _, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError:
                await asyncio.sleep(_READY_POLL)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if process.returncode is None and not self._stop_requested:
                self._set_state(WorkerState.RUNNING)
                self._ready.set()
            return

    async def _relay_output(self, pipe: io.FileIO) -> None:
        """Worker output goes to elasticd's log, one line at a time, prefixed by the worker id, within the bound
        (``OutputBound``): reads are spaced and paused while the worker writes faster than the bound (its pipe
        fills and its writes block), and lines beyond the bound are dropped, with a note of how many."""
        loop = asyncio.get_running_loop()
        if self._output_bound is None:
            self._output_bound = OutputBound(loop.time())
        bound = self._output_bound
        lines = LineSplitter()
        try:
            while True:
                if not await _readable(loop, pipe.fileno(), bound.note_due_in(loop.time())):
                    self._note_suppressed(bound.flush(loop.time()))  # the worker went quiet after a flood
                    continue
                chunk = pipe.read(READ_CHUNK)
                if chunk is None:  # (nothing after all)
                    continue
                if not chunk:
                    break
                now = loop.time()
                block, count = lines.feed(chunk)
                if count:
                    logged, suppressed_before = bound.admit(count, now)
                    self._note_suppressed(suppressed_before)
                    for line in block.split(b"\n", logged)[:logged]:
                        self._log_line(line)
                await asyncio.sleep(bound.pause_after_read(len(chunk), now))
            rest = lines.rest()
            if rest:
                logged, suppressed_before = bound.admit(1, loop.time())
                self._note_suppressed(suppressed_before)
                if logged:
                    self._log_line(rest)
        finally:
            pipe.close()
            self._note_suppressed(bound.flush(loop.time()))

    def _log_line(self, line: bytes) -> None:
        # A NUL shown, not passed on: when elasticd's own stderr is the journal (the relay stands in for a missing
        # systemd-cat), journald ends a line at a NUL and reads a "<N>" after it as the priority — "x\0<0>..."
        # would log at emerg, which journald sends to every terminal.
        text = line.decode("utf-8", "replace").rstrip("\r").replace("\0", "\\0")
        log.info("[%s] %s", self.id, text)

    def _note_suppressed(self, count: int) -> None:
        if count:
            log.warning("worker %s: suppressed %d lines of output (more than %g a second; under journald, where "
                        "workers write to it directly, nothing is dropped by elasticd)", self.id, count,
                        LINES_PER_SECOND)

    def _set_state(self, state: WorkerState) -> None:
        """Through the table: an illegal transition raises (fails closed) instead of taking effect."""
        if state is self.state:
            return
        self.state = transition(self.state, state, self.id)
        if state is WorkerState.RUNNING:
            self.served = True
        elif state is WorkerState.STARTING:
            self.served = False
        if self.on_state is not None:
            self.on_state(self)


async def _readable(loop: asyncio.AbstractEventLoop, fd: int, timeout: float | None) -> bool:
    """Wait until ``fd`` has something to read (or its end): True; False after ``timeout`` seconds."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        done, _ = await asyncio.wait({ready}, timeout=timeout)
    finally:
        loop.remove_reader(fd)
    return bool(done)


_DEVNULL: list[int] = []


def _devnull() -> int:
    """/dev/null, opened once (close-on-exec: the spawner gives it to the worker as its stdin)."""
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
    return _DEVNULL[0]


def kill_tree(pid: int) -> None:
    """SIGKILL the worker's process group and any descendants that left it (setsid, double fork)."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "no process"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


def _close_pipe(pipe: io.FileIO, _task: object) -> None:
    pipe.close()
