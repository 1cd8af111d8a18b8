"""The re-exec in place, both sides: the running image hands itself over (``begin``: preflight, then ``_hand_over``),
and the image it execs takes over (``take_over``). ``elasticctl upgrade``, ``POST /v1/upgrade`` and ``SIGUSR2``
all come here.

The old image's order, and why:

1. **Preflight** (before anything stops): the installed elasticd, run as it will be (same interpreter, same argv) with
   ``--check --state-format N``, must load its code, accept the configuration and read this image's state format. A
   broken install or an older elasticd is refused here, and the old image serves on untouched.
2. ``RELOADING=1`` to systemd; the reload lock (no reload runs across the step); live moves aborted (each user stays
   where it is, with its state); the pool's retires and replacements cancelled.
3. **Stop accepting**: the front's servers close, its listening sockets stay open (``listeners``): connections wait
   in the backlog. Requests in flight finish (up to ``server.stop_timeout``); connections are settled
   (``front.handover``).
4. **The state** (``state.SavedState``) is written to a memfd, every descriptor it names is made inheritable, and
   the installed elasticd is exec'd — the same process: systemd sees one main pid, the workers stay its children.
5. If ``execve`` fails (the file vanished since the preflight, E2BIG, ENOMEM), it returns here and every step is
   undone: the descriptors are closed or made close-on-exec again, the connections resume, the front accepts again.

The new image, in ``Daemon.run`` before its first activation: read the state (a document it cannot read, or none
given, is a fresh start — the previous image's workers, its children still, are killed, and the journal says why),
adopt the workers (``adoption.plan_adoption``: the same process of an unchanged group), restore the users on them,
the quota buckets, the limit overrides and the worker numbers; the first activation then finds those groups running
as configured; the front accepts on the inherited sockets, and takes the carried connections and tunnels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Protocol

import psutil

from elasticd import __version__
from elasticd.config.notices import few
from elasticd.front import handover as front_handover
from elasticd.front import takeover as front_takeover
from elasticd.supervisor.lifecycle import WorkerState
from elasticd.supervisor.worker_process import Adopt, kill_tree
from elasticd.upgrade.adoption import Verdict, plan_adoption
from elasticd.upgrade.report import DONE, FAILED, FRESH, REFUSED, NotKept, UpgradeReport
from elasticd.upgrade.snapshot import restore_buckets, restore_users, saved_buckets, saved_users
from elasticd.upgrade.state import (
    FORMAT,
    SavedHandover,
    SavedState,
    SavedWorker,
    StateError,
    digest,
    dump,
    load,
)

if TYPE_CHECKING:
    from elasticd.cgroup.activation import Activation
    from elasticd.config import Config
    from elasticd.crash.keeping import StateKeeping
    from elasticd.front import Front
    from elasticd.keeper.link import KeeperLink, KeptRow
    from elasticd.limits.runtime import RuntimeLimits
    from elasticd.listeners import Listeners
    from elasticd.pool.channel_server import ChannelServer
    from elasticd.pool.manager import PoolManager
    from elasticd.pool.mover import Mover
    from elasticd.supervisor.supervisor import Supervisor
    from elasticd.systemd import Notifier
    from elasticd.upstream_lists import UpstreamLists


class UpgradeHost(Protocol):
    """The daemon, as the re-exec reads and drives it (a Protocol: this module does not import the daemon's)."""

    config: Config
    supervisor: Supervisor
    front: Front
    pool: PoolManager
    mover: Mover
    channel: ChannelServer
    limits: RuntimeLimits
    cgroups: Activation
    listeners: Listeners
    notifier: Notifier
    upstreams: UpstreamLists
    keeper: KeeperLink | None
    kept_rows: list[KeptRow]
    keeping: StateKeeping | None

    @property
    def stopping(self) -> bool: ...

    @property
    def reload_lock(self) -> asyncio.Lock: ...

    def track(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

__all__ = ["STATE_ENV", "ReExec", "exec_argv", "read_inherited_state"]

log = logging.getLogger("elasticd.upgrade")

STATE_ENV: Final = "ELASTICD_UPGRADE_STATE"  # the descriptor of the memfd holding the state, for the next image
PREFLIGHT_TIMEOUT: Final = 30.0
_SAVED_STATES: Final = frozenset({WorkerState.STARTING, WorkerState.RUNNING})  # a process to carry on watching


def exec_argv() -> list[str]:
    """How this image was started, to start the installed one the same way: the interpreter (by its path: an upgraded
    python3 is the new one) and its original arguments (``/usr/bin/elasticd --config …``, ``-m elasticd.daemon …``)."""
    return [sys.executable, *sys.orig_argv[1:]]


def read_inherited_state(environ: dict[str, str] | os._Environ[str]) -> tuple[SavedState | None, str | None]:
    """The state the previous image left (its descriptor in ``STATE_ENV``, removed from the environment so that
    nothing started from here inherits it): (the state, None), (None, why it cannot be taken), or (None, None) for a
    plain start."""
    value = environ.pop(STATE_ENV, None)
    if value is None:
        return None, None
    try:
        fd = int(value)
        with os.fdopen(fd, "rb") as memfd:
            memfd.seek(0)
            data = memfd.read()
    except (ValueError, OSError) as exc:
        return None, f"the state's descriptor {value!r} cannot be read: {exc}"
    try:
        return load(data), None
    except StateError as exc:
        return None, str(exc)


class ReExec:
    __slots__ = ("_began", "_daemon", "_gap_began", "began", "generation", "report", "under_way")

    def __init__(self, daemon: UpgradeHost) -> None:
        self._daemon = daemon
        self.under_way = False
        self.report: UpgradeReport | None = None
        self.generation = 0
        # How this instance began (GET /v1/status): a start, an upgrade in place, or after a crash; with what it
        # adopted then.
        self.began: dict[str, Any] = {"how": "start", "at": time.time(), "adopted": 0, "not_adopted": []}
        self._began = self._gap_began = 0.0  # (the new image's: when the upgrade was asked, when accepting stopped)

    def state(self) -> dict[str, Any]:
        """``GET /v1/upgrade``: this process, whether a hand-over is under way, and the last report."""
        return {"pid": os.getpid(), "version": __version__, "generation": self.generation,
                "under_way": self.under_way, "report": self.report.as_json() if self.report is not None else None,
                "began": self.began}

    # ------------------------------------------------------------------ the old image

    async def begin(self) -> tuple[bool, str]:
        """The preflight, then the hand-over in the background: (True, what happens next) or (False, why not)."""
        daemon = self._daemon
        if daemon.stopping:
            return False, "elasticd is stopping"
        if self.under_way:
            return False, "an upgrade is under way already"
        self.under_way = True
        began = time.monotonic()
        argv = exec_argv()
        refusal = await preflight(argv)
        if refusal is not None:
            self.under_way = False
            log.error("upgrade refused, elasticd serves on: %s", refusal)
            self.report = UpgradeReport(REFUSED, self.generation, os.getpid(), __version__, "", error=refusal)
            return False, refusal
        daemon.track(self._hand_over(argv, began))
        return True, f"re-executing {argv[1] if len(argv) > 1 else argv[0]} in place (pid {os.getpid()})"

    async def _hand_over(self, argv: list[str], began: float) -> None:
        daemon = self._daemon
        await asyncio.sleep(0.05)  # the answer to the request that asked goes out first
        async with daemon.reload_lock:
            if daemon.stopping:
                self.under_way = False
                return
            daemon.notifier.reloading()
            daemon.notifier.status("upgrading in place: waiting for requests in flight")
            log.info("upgrade: handing over to %s", " ".join(argv))
            daemon.mover.abort_all("elasticd is upgrading in place")
            daemon.pool.stop()
            # Anything that fails from here to the exec (a descriptor the kernel will not give — clients can hold
            # many connections —, the state's memfd, the exec itself) is undone the same way: this image serves on.
            settled: front_handover.Settled | None = None
            memfd: int | None = None
            outputs: list[int] = []
            step = "the hand-over"
            try:
                settled = await front_handover.settle(daemon.front.listening, daemon.config.server.stop_timeout,
                                                      time.monotonic)
                state = self._state(settled, began, settled.stopped_accepting)
                memfd = os.memfd_create("elasticd-state", 0)
                document = memoryview(dump(state))
                while document:  # (one write() may take less than all of it)
                    document = document[os.write(memfd, document):]
                os.set_inheritable(memfd, True)
                env = dict(os.environ)
                env[STATE_ENV] = str(memfd)
                outputs = [w.output for w in state.workers if w.output is not None]
                if state.state_store is not None:
                    outputs.append(state.state_store)  # (carried as the outputs are: undone the same way)
                for fd in outputs:
                    os.set_inheritable(fd, True)
                log.info("upgrade: %d workers, %d users, %d connections, %d tunnels, %d requests awaiting their "
                         "answer and %d not yet sent handed over; exec", len(state.workers), len(state.users),
                         len(settled.connections), len(settled.tunnels), len(settled.requests), len(settled.unsent))
                for handler in logging.getLogger().handlers:
                    with contextlib.suppress(Exception):
                        handler.flush()
                # Signals blocked here would stay blocked in the new image (a mask survives exec): none are.
                signal.pthread_sigmask(signal.SIG_SETMASK, set())
                step = f"exec {argv[0]}"
                os.execve(argv[0], argv, env)
            except Exception as exc:
                error = f"{step} failed: {exc}"
            # Only a failure comes back here: undo, and serve on.
            log.error("upgrade failed, elasticd serves on: %s", error)
            if memfd is not None:
                os.close(memfd)
            for fd in outputs:
                with contextlib.suppress(OSError):
                    os.set_inheritable(fd, False)
            daemon.listeners.handover_failed()
            if settled is not None:  # (a settle that failed undid itself)
                front_handover.resume(daemon.front.listening, settled)
            await daemon.front.start(daemon.listeners.dups("front"))
            daemon.notifier.ready(daemon.supervisor.summary())
            self.report = UpgradeReport(FAILED, self.generation, os.getpid(), __version__, "", error=error)
            self.under_way = False

    def _state(self, settled: front_handover.Settled, began: float, stopped_accepting: float) -> SavedState:
        daemon = self._daemon
        handover = SavedHandover(self.generation, __version__, began, stopped_accepting, settled.waited, settled.cut,
                                 settled.closed)
        keeping = daemon.keeping
        return replace(running_state(daemon, outputs=True), listeners=daemon.listeners.handover(),
                       connections=tuple(settled.connections), tunnels=tuple(settled.tunnels),
                       requests=tuple(settled.requests), unsent=tuple(settled.unsent), handover=handover,
                       state_store=keeping.stored.fd if keeping is not None else None)

    # ------------------------------------------------------------------ the new image

    def adopt(self, saved: SavedState | None, refused: str | None, *, crash: bool = False) -> None:
        """Before the first activation: take the previous image's workers (or stop them, when the state cannot be
        taken), its users, buckets, overrides and worker numbers. ``crash``: the state is the one kept in systemd's
        store by an instance that died (elasticd/crash): its workers' output pipes are the keeper's held ones, and
        no connection was carried."""
        daemon = self._daemon
        if saved is None:
            killed = stop_unadopted(daemon, set())
            if refused is not None:
                log.error("upgrade: the previous image's state cannot be taken (%s): starting fresh; its %d workers "
                          "were stopped", refused, killed)
                self.report = UpgradeReport(FRESH, self.generation, os.getpid(), "?", __version__, error=refused)
            elif killed:
                log.warning("the keeper had %d workers of an elasticd before this one, and no state to adopt them "
                            "by: stopped", killed)
            return
        said = "after a crash" if crash else "upgrade"
        handover = saved.handover
        if not crash:
            self.generation = (handover.generation if handover is not None else 0) + 1
            self.under_way = True  # until the front accepts again and the report is whole (``serving``)
        supervisor = daemon.supervisor
        config = daemon.config
        desired = supervisor.desired(config)
        groups = {"/".join(key): digest(want.spec) for key, want in desired.items()}
        # The keeper's word on which processes live, and since when: the workers are its children, not this one's.
        alive = {row.pid: row.started for row in daemon.kept_rows if row.code is None}
        held = {row.pid: row.output for row in daemon.kept_rows if row.output is not None}
        # (a worker an elasticd before the keeper started is this process's own child, not the keeper's)
        plan = plan_adoption(saved, groups, alive, foreign=_own_children())
        taken: set[int] = set()  # the pids whose held output pipe an adopted worker reads from now on
        kept: list[tuple[str, tuple[str, str, str], Adopt, int, bool]] = []
        leaving: list[tuple[str, tuple[str, str, str], Adopt, bool]] = []
        not_kept = []
        for worker, verdict, reason in plan.workers:
            key = (worker.tenant, worker.app, worker.group)
            process = None
            if verdict is not Verdict.GONE and daemon.keeper is not None:
                process = daemon.keeper.watch(worker.pid, alive[worker.pid])
            if process is None:
                if worker.output is not None:
                    with contextlib.suppress(OSError):
                        os.close(worker.output)
                not_kept.append(NotKept(worker.id, verdict.value, reason))
                log.warning("%s: worker %s not adopted: %s", said, worker.id, reason)
                continue
            output = worker.output
            if output is None and crash and worker.pid in held:  # (the keeper's, held while no elasticd read it)
                output = held[worker.pid]
                taken.add(worker.pid)
            adopt = Adopt(process, worker.token, output)
            if verdict is Verdict.ADOPT and worker.listed:
                kept.append((worker.id, key, adopt, worker.restarts, worker.served))
            else:
                why = reason if verdict is not Verdict.ADOPT else "it was being retired"
                leaving.append((worker.id, key, adopt, worker.sandboxed))
                not_kept.append(NotKept(worker.id, verdict.value if verdict is not Verdict.ADOPT else "retiring", why))
                log.info("%s: worker %s adopted to be retired: %s", said, worker.id, why)
        numbers = {group: number for name, number in saved.next_ids.items()
                   if (group := _group_key(name)) is not None}
        if not crash:
            supervisor.carried_in = asyncio.Event()  # (set by serving(): the retiring wait for what was carried in)
        supervisor.adopt(config, kept, leaving, numbers)
        daemon.kept_rows = [replace(row, output=None) if row.pid in taken else row for row in daemon.kept_rows]
        adopted_pids = {w.pid for w in saved.workers if w.pid in alive}
        killed = stop_unadopted(daemon, adopted_pids)
        if killed:
            log.warning("%s: %d processes of the previous instance's that were no adopted worker were killed "
                        "(workers being stopped, or started since the state was written)", said, killed)
        kept_ids = {worker_id for worker_id, *_ in kept}
        users = restore_users(daemon.front.surface, saved.users, lambda user: user.worker in kept_ids)
        restore_buckets(daemon.front.quotas, saved.buckets)
        daemon.limits.overrides.update({tenant: dict(values) for tenant, values in saved.overrides.items()
                                        if tenant in config.tenants})
        self.began = {"how": "crash" if crash else "upgrade", "at": time.time(), "adopted": len(kept_ids),
                      "not_adopted": [{"worker": row.worker, "verdict": row.verdict, "reason": row.reason}
                                      for row in not_kept], "users_kept": users,
                      "users_dropped": len(saved.users) - users}
        if crash:
            age = time.monotonic() - saved.written_at
            log.warning("elasticd began after a crash: %d workers adopted, %d not (%s); %d users kept, %d not; the "
                        "state was written %.1fs before this start", len(kept_ids), len(not_kept),
                        few([row.worker for row in not_kept]) if not_kept else "none", users,
                        len(saved.users) - users, age)
            return
        now = time.monotonic()
        gap_began = handover.stopped_accepting if handover is not None else now
        self.report = UpgradeReport(
            DONE, self.generation, os.getpid(), handover.version if handover is not None else "?", __version__,
            kept=tuple(sorted(kept_ids)), not_kept=tuple(not_kept), users_kept=users,
            users_dropped=len(saved.users) - users, cut=handover.cut if handover is not None else 0,
            closed=handover.closed if handover is not None else 0,
            waited=handover.waited if handover is not None else 0.0)
        self._gap_began = gap_began
        self._began = handover.began if handover is not None else now

    async def serving(self, saved: SavedState | None) -> None:
        """The front accepts again: take the carried connections and tunnels, and close the report."""
        try:
            await self._serving(saved)
        finally:
            carried_in = self._daemon.supervisor.carried_in
            if carried_in is not None:
                carried_in.set()

    async def _serving(self, saved: SavedState | None) -> None:
        if saved is None or self.report is None or self.report.outcome != DONE:
            self.under_way = False
            return
        daemon = self._daemon
        now = time.monotonic()
        connections, tunnels, requests = await front_takeover.carry_in(daemon.front, saved, daemon.upstreams.of)
        unclaimed = daemon.listeners.close_unclaimed()
        report = self.report
        notes = tuple(f"the previous image's {name} socket is not configured now: closed" for name in unclaimed)
        self.report = replace(
            report, connections=connections, tunnels=tunnels, requests=requests,
            closed=report.closed + (len(saved.connections) - connections) + (len(saved.tunnels) - tunnels)
            + (len(saved.requests) + len(saved.unsent) - requests),
            accept_gap=now - self._gap_began, wall=time.monotonic() - self._began, notes=notes)
        log.info("upgrade: done, re-exec %d: %d workers kept, %d not; %d users kept; %d connections, %d tunnels and %d "
                 "requests (awaiting their answer, or not yet sent) carried; accept gap %.0f ms", report.generation,
                 len(report.kept), len(report.not_kept), report.users_kept, connections, tunnels, requests,
                 (now - self._gap_began) * 1000)
        self.under_way = False


def running_state(daemon: UpgradeHost, *, outputs: bool) -> SavedState:
    """What the next image needs of the running one, descriptors aside: its workers (``outputs``: with the read end of
    each one's output pipe, which an exec keeps open; a crash does not), users, overrides, quota buckets, worker
    numbers, channel socket inodes and the cgroup base."""
    workers = []
    for worker, listed in daemon.supervisor.alive():
        pid = worker.pid
        started = worker.process_started()
        if pid is None or started is None or worker.state not in _SAVED_STATES:
            continue  # no process to carry on watching (in backoff, stopping): its group's floor restarts it
        workers.append(SavedWorker(worker.id, worker.tenant, worker.app, worker.group, pid, started,
                                   worker.socket_path, worker.token, digest(worker.spec), worker.restarts,
                                   worker.served, worker.sandboxed, listed, worker.output_fd() if outputs else None))
    return SavedState(
        workers=tuple(workers), users=saved_users(daemon.front.surface),
        overrides={t: dict(values) for t, values in daemon.limits.overrides.items()},
        buckets=saved_buckets(daemon.front.quotas),
        next_ids={"/".join(key): number for key, number in daemon.supervisor.next_numbers().items()},
        written_at=time.monotonic(), channel_inodes=daemon.channel.inodes(),
        cgroup_base=daemon.cgroups.base if daemon.cgroups.enforced else None)


async def preflight(argv: list[str]) -> str | None:
    """None when the installed elasticd, started as the re-exec will start it, loads, accepts the configuration
    and reads this image's state format; else why not (its own words)."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, "--check", "--state-format", str(FORMAT), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    except OSError as exc:
        return f"{argv[0]} cannot be run: {exc}"
    try:
        output, _ = await asyncio.wait_for(process.communicate(), PREFLIGHT_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return f"`{' '.join(argv)} --check` did not finish within {PREFLIGHT_TIMEOUT:g}s"
    if process.returncode != 0:
        text = output.decode(errors="replace").strip()
        lines = text.splitlines()
        return (f"`{' '.join(argv)} --check --state-format {FORMAT}` failed (status {process.returncode}): "
                + "\n".join(lines[-12:]))
    return None


def _group_key(name: str) -> tuple[str, str, str] | None:
    parts = name.split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def stop_unadopted(daemon: UpgradeHost, keep: set[int]) -> int:
    """Every worker of the keeper's that no adopted worker is (being stopped by the previous image, or started after
    its state was written): killed, its exit then read by the keeper (watched, so that the keeper forgets it); what
    the keeper told had ended is forgotten; the held output descriptors of its table are closed (a re-exec carries
    elasticd's own). Then this process's own children that are neither a worker nor the keeper. How many were
    killed."""
    keeper = daemon.keeper
    killed = 0
    for row in daemon.kept_rows:
        if row.output is not None:
            with contextlib.suppress(OSError):
                os.close(row.output)
        if keeper is None:
            continue
        if row.code is not None:
            keeper.forget(row.pid)
        elif row.pid not in keep:
            kill_tree(row.pid)
            keeper.watch(row.pid, row.started)
            killed += 1
    daemon.kept_rows = []
    return killed + _kill_children(keep | ({keeper.keeper_pid} if keeper is not None else set()))


def _own_children() -> set[int]:
    try:
        return {child.pid for child in psutil.Process().children()}
    except psutil.Error:
        return set()


def _kill_children(keep: set[int]) -> int:
    """Kill (SIGKILL, the process group and the tree) and reap every child of this process not in ``keep``: the
    previous image's processes that no adopted worker is (a worker being stopped, a probe). Returns how many."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return 0
    killed = 0
    for child in children:
        if child.pid in keep:
            continue
        try:
            descendants = child.children(recursive=True)
        except psutil.Error:
            descendants = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        for process in [child, *descendants]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, 0)
        killed += 1
    return killed
