"""What the sandbox of an isolated tenant costs a worker (bubblewrap: ``supervisor/sandbox.py``), run on demand (not a
test): its start time and its memory, with and without the sandbox, the spec otherwise the same.

    .venv/bin/python benchmarks/sandbox_bench.py [--rounds 30] [--concurrent 20] [--mem-rounds 3] [--settle 1]

Both workers are started as elasticd starts them: the argv of ``spawn.spawn_argv`` (the umask script, for the
sandboxed one bubblewrap with the view of ``Sandbox.argv`` and the masks of ``sandbox_host.present_masks``, then
setpriv to the tenant's user), forked with ``subprocess.Popen`` in the app's root, in a session of its own. The
tenant's user is a throw-away system user (made with useradd at the start, removed with userdel in a finally); no
cgroup leaf (``leaf=None``: the trampoline is not part of either argv). The view is a real one, in a temporary
directory: the app's root (read-write), the tenant's socket directory, its /tmp and /var/tmp (mode 1777), the
mode-0000 file bound over hidden files, and every one of ``sandbox.SECRETS`` this host has, plus a config file.

1. Start time: ``/bin/sh -c 'echo ready'`` as the command, ``--rounds`` times each (30), the two kinds alternating:
   from before the fork until the first byte of its stdout is read (the command's first instructions have run),
   and until its exit is reaped. Median and p90 in ms of each, and the difference (goal, issue: < 50 ms more per
   worker). Two rounds of each are run first and not counted (a cold page cache).
2. Memory: ``--concurrent`` long-running workers (20) of each kind at once (``/bin/sleep``), ``--mem-rounds`` times
   (3). A sandboxed worker is three processes: bubblewrap's monitor (the pid started), bubblewrap's init (pid 1 in
   the worker's namespace) and the command (``sandbox_host.command_pid``); what the sandbox adds is the first two.
   Their USS (``psutil``'s ``memory_full_info().uss``: what their exit would give back) summed per worker is the
   headline, median over every worker (goal, issue: < 1 MiB more per worker); PSS and RSS (shared libraries
   counted in full) for reference, and the command's own USS in both kinds. The kernel's side (the namespaces,
   mounts, /proc instance, kernel stacks, page tables) is the host's ``/proc/meminfo`` with the sandboxed set
   running minus with the plain set running, divided by the number of workers: noisy (it is the whole host's, and
   caches come and go), a median of the rounds, an indication only.

Needs root (bubblewrap runs as root here, as under elasticd; setpriv drops to the user), useradd/userdel, setpriv
and bubblewrap (``apt-get install -y bubblewrap``). Every process it starts is killed by its pid (its session's
group: with the sandbox, bubblewrap's monitor, init and the command) and reaped (this script is their subreaper:
a killed monitor's orphans are its children, not the host's pid 1's), also on Ctrl-C; the temporary directory and
the user are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import pwd
import secrets
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticd.config.isolation import BWRAP  # noqa: E402
from elasticd.config.model import RunAs  # noqa: E402
from elasticd.supervisor.sandbox import SECRETS, Sandbox, tmp_dirs  # noqa: E402
from elasticd.supervisor.sandbox_host import command_pid, present_masks  # noqa: E402
from elasticd.supervisor.spawn import SETPRIV, WorkerSpec, spawn_argv  # noqa: E402

TENANT = "bench"
READY = ("/bin/sh", "-c", "echo ready")
SLEEP = ("/bin/sleep", "600")  # killed long before: the bound only matters if this script itself is killed
WARMUP = 2
DEADLINE = 10.0  # seconds for any one worker to answer, or to be ready
START_GOAL_MS, MEMORY_GOAL_MIB = 50.0, 1.0
MEMINFO_KEYS = ("Slab", "KernelStack", "PageTables", "Shmem", "MemAvailable")
KERNEL_KEYS = ("Slab", "KernelStack", "PageTables")  # the kernel's own memory, summed
MIB = 2**20
PR_SET_CHILD_SUBREAPER = 36


# ------------------------------------------------------------------------------------------ the tenant


def make_user() -> RunAs:
    name = f"elsbx{secrets.token_hex(3)}"
    made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                           name], capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        raise RuntimeError(f"useradd failed: {made.stderr.strip()}")
    entry = pwd.getpwnam(name)
    return RunAs(user=name, uid=entry.pw_uid, group=name, gid=entry.pw_gid, home=entry.pw_dir)


def remove_user(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True, timeout=60)
    subprocess.run(["groupdel", name], capture_output=True, timeout=60)  # gone with the user where USERGROUPS_ENAB


@dataclass(frozen=True, slots=True)
class Tenant:
    root: str  # the app's root: the workers' directory
    run_as: RunAs
    sandbox: Sandbox
    env: dict[str, str]

    def spec(self, argv: tuple[str, ...], sandboxed: bool) -> WorkerSpec:
        return WorkerSpec(argv=argv, env=(), cwd=self.root, leaf=None, run_as=self.run_as,
                          sandbox=self.sandbox if sandboxed else None)


def make_tenant(where: Path, run_as: RunAs) -> Tenant:
    """The host side of a view, as the supervisor prepares it (``_prepare_views``, the socket directory)."""
    where.chmod(0o755)
    root = where / "srv" / TENANT / "app"
    root.mkdir(parents=True, mode=0o755)
    os.chown(root, run_as.uid, run_as.gid)
    runtime = where / "run"
    sockets = runtime / "workers" / TENANT
    sockets.mkdir(parents=True, mode=0o700)
    os.chown(sockets, run_as.uid, run_as.gid)
    blank = runtime / "inaccessible"
    with open(os.open(blank, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o000), "wb"):
        pass
    blank.chmod(0o000)
    tenant_tmp = where / "tmp" / TENANT
    tenant_tmp.mkdir(parents=True, mode=0o700)
    (where / "tmp").chmod(0o700)
    for path in tmp_dirs(str(tenant_tmp)):
        os.makedirs(path)
        os.chmod(path, 0o1777)
    config = where / "etc" / "elastic.yaml"
    config.parent.mkdir(mode=0o755)
    config.write_text("# elasticd's config: hidden in the view\n")
    config.chmod(0o600)
    # The app's root read-write: in ``roots`` where the Sandbox has that field, else in ``read_write``.
    own = {"roots": (str(root),), "read_write": ()} if "roots" in {f.name for f in fields(Sandbox)} else \
        {"read_write": (str(root),)}
    sandbox = Sandbox(tenant=TENANT, **own, read_only=(), sockets=str(sockets), tmp=str(tenant_tmp),
                      hidden=(*SECRETS, str(config)), inaccessible=str(blank))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": run_as.home, "USER": run_as.user,
           "LOGNAME": run_as.user}
    return Tenant(root=str(root), run_as=run_as, sandbox=sandbox, env=env)


# ------------------------------------------------------------------------------------------ workers


@dataclass(slots=True)
class Started:
    """What this script started: each worker's Popen (its own session: the group's id is its pid), and the processes
    found in their trees (psutil remembers each one's start time: a pid reused since is never signalled)."""

    popens: list[subprocess.Popen[bytes]] = field(default_factory=list)
    found: list[psutil.Process] = field(default_factory=list)

    def start(self, tenant: Tenant, argv: tuple[str, ...], sandboxed: bool) -> subprocess.Popen[bytes]:
        spec = tenant.spec(argv, sandboxed)
        masks = present_masks(spec.sandbox.hidden) if spec.sandbox is not None else []
        popen = subprocess.Popen(spawn_argv(spec, cwd=tenant.root, masks=masks), cwd=tenant.root, env=tenant.env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 bufsize=0, start_new_session=True)
        self.popens.append(popen)
        return popen

    def reap(self, popen: subprocess.Popen[bytes]) -> None:
        """Waits for a worker that exits by itself (killed after DEADLINE)."""
        try:
            popen.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            self.kill(popen)
        self._close(popen)

    def kill(self, popen: subprocess.Popen[bytes]) -> None:
        if popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)  # its own session's group: monitor, init and command
            popen.wait()
        self._close(popen)

    def _close(self, popen: subprocess.Popen[bytes]) -> None:
        for pipe in (popen.stdout, popen.stderr):
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(ValueError):
            self.popens.remove(popen)

    def stop_all(self) -> None:
        for popen in list(self.popens):
            self.kill(popen)
        for process in self.found:  # (none should be left: the group was killed, and bwrap's die with their parent)
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.found.clear()
        reap_orphans()


def become_subreaper() -> None:
    """A killed monitor's init and command are reparented to this script (not to the host's pid 1, which may reap
    them late): ``reap_orphans`` collects them, and no zombie of one set is left while the next one is measured."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_orphans() -> None:
    """Every child left once each Popen is reaped: the orphans of killed sandboxes (bounded by DEADLINE)."""
    limit = time.monotonic() + DEADLINE
    while time.monotonic() < limit:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)


def failed(popen: subprocess.Popen[bytes], what: str) -> RuntimeError:
    err = b""
    if popen.stderr is not None:
        with contextlib.suppress(OSError):
            os.set_blocking(popen.stderr.fileno(), False)
            err = popen.stderr.read() or b""
    return RuntimeError(f"{what} (exit {popen.poll()}): {err.decode(errors='replace').strip() or 'no stderr'}")


def time_start(started: Started, tenant: Tenant, sandboxed: bool) -> tuple[float, float]:
    """Seconds from before the fork to the first byte of ``echo ready``, and to its exit reaped."""
    begin = time.perf_counter()
    popen = started.start(tenant, READY, sandboxed)
    assert popen.stdout is not None
    fd = popen.stdout.fileno()
    readable, _, _ = select.select([fd], [], [], DEADLINE)
    first = os.read(fd, 64) if readable else b""
    ready = time.perf_counter()
    if not first.startswith(b"r"):
        started.kill(popen)
        raise failed(popen, "the worker did not say ready")
    popen.wait(DEADLINE)
    ended = time.perf_counter()
    if popen.returncode != 0:
        raise failed(popen, "the worker failed")
    started.reap(popen)
    return ready - begin, ended - begin


def wait_for(what: str, probe: Callable[[], psutil.Process | None]) -> psutil.Process:
    limit = time.monotonic() + DEADLINE
    while time.monotonic() < limit:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.005)
    raise RuntimeError(f"{what}: not there after {DEADLINE:.0f} s")


def running_command(pid: int | None) -> psutil.Process | None:
    """The process, once it is the command itself (setpriv has exec'd it)."""
    if pid is None:
        return None
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        if process.cmdline() == list(SLEEP):  # (not its exe: in the view it is /bin/sleep, /usr/bin/sleep outside)
            return process
    return None


@dataclass(slots=True)
class Tree:
    command: psutil.Process
    bwrap: list[psutil.Process]  # monitor and init; empty without the sandbox


def start_sleepers(started: Started, tenant: Tenant, sandboxed: bool, count: int) -> list[Tree]:
    popens = [started.start(tenant, SLEEP, sandboxed) for _ in range(count)]
    trees = []
    for popen in popens:
        def probe(popen: subprocess.Popen[bytes] = popen) -> psutil.Process | None:
            if popen.poll() is not None:
                raise failed(popen, "a worker ended early")
            return running_command(command_pid(popen.pid) if sandboxed else popen.pid)

        command = wait_for(f"worker {popen.pid}", probe)
        if sandboxed:
            monitor = psutil.Process(popen.pid)
            inits = [c for c in monitor.children() if c.pid != command.pid]
            started.found += [command, *inits]
            trees.append(Tree(command, [monitor, *inits]))
        else:
            trees.append(Tree(command, []))
    return trees


def meminfo() -> dict[str, int]:
    """Bytes, of the keys this script reports."""
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in MEMINFO_KEYS:
            values[key] = int(rest.split()[0]) * 1024
    return values


@dataclass(slots=True)
class Memory:
    uss: list[float] = field(default_factory=list)  # per sandboxed worker: its monitor's + its init's, bytes
    pss: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    monitor_uss: list[float] = field(default_factory=list)
    init_uss: list[float] = field(default_factory=list)
    command_uss: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    kernel: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in MEMINFO_KEYS})  # per worker


def measure_memory(started: Started, tenant: Tenant, count: int, settle: float, memory: Memory) -> None:
    """One round: ``count`` plain workers, then ``count`` sandboxed ones; the host's meminfo with each set running."""
    with_set: dict[bool, dict[str, int]] = {}
    for sandboxed in (False, True):
        time.sleep(settle)
        try:
            trees = start_sleepers(started, tenant, sandboxed, count)
            time.sleep(settle)
            with_set[sandboxed] = meminfo()
            for tree in trees:
                memory.command_uss[sandboxed].append(tree.command.memory_full_info().uss)
                if not sandboxed:
                    continue
                infos = [p.memory_full_info() for p in tree.bwrap]
                memory.uss.append(sum(i.uss for i in infos))
                memory.pss.append(sum(i.pss for i in infos))
                memory.rss.append(sum(i.rss for i in infos))
                memory.monitor_uss.append(infos[0].uss)
                memory.init_uss.append(sum(i.uss for i in infos[1:]))
        finally:
            started.stop_all()
    for key in MEMINFO_KEYS:
        memory.kernel[key].append((with_set[True][key] - with_set[False][key]) / count)


# ------------------------------------------------------------------------------------------ figures


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def start_figures(times: dict[bool, list[tuple[float, float]]], rounds: int) -> Iterator[str]:
    yield (f"worker start, {rounds} rounds of each, alternating ({' '.join(READY[:2])} '{READY[2]}' as the "
           f"tenant's user, no leaf), ms")
    yield f"  {'':27} {'median':>8} {'p90':>8}"
    for index, what in ((0, "until the first byte"), (1, "until its exit is reaped")):
        plain = [t[index] * 1000 for t in times[False]]
        boxed = [t[index] * 1000 for t in times[True]]
        yield f"  {what}"
        yield f"    {'without the sandbox':25} {statistics.median(plain):8.2f} {p90(plain):8.2f}"
        yield f"    {'with the sandbox':25} {statistics.median(boxed):8.2f} {p90(boxed):8.2f}"
        more = statistics.median(boxed) - statistics.median(plain)
        yield (f"    {'the sandbox adds':25} {more:8.2f} {p90(boxed) - p90(plain):8.2f}"
               + (f"   (goal < {START_GOAL_MS:.0f} ms: {'met' if more < START_GOAL_MS else 'NOT met'})"
                  if index == 0 else ""))


def memory_figures(memory: Memory, count: int, rounds: int) -> Iterator[str]:
    def mib(values: list[float]) -> str:
        return f"{statistics.median(values) / MIB:6.3f} MiB (min {min(values) / MIB:.3f}, max {max(values) / MIB:.3f})"

    headline = statistics.median(memory.uss) / MIB
    yield (f"memory the sandbox adds per worker: bubblewrap's monitor + init, {count} workers at once x {rounds} "
           f"rounds, median over {len(memory.uss)} workers")
    yield (f"  USS  {mib(memory.uss)}   (goal < {MEMORY_GOAL_MIB:.0f} MiB: "
           f"{'met' if headline < MEMORY_GOAL_MIB else 'NOT met'})")
    yield f"       monitor {statistics.median(memory.monitor_uss) / 1024:.0f} KiB, init " \
          f"{statistics.median(memory.init_uss) / 1024:.0f} KiB"
    yield f"  PSS  {mib(memory.pss)}   (for reference: shared pages divided among their users)"
    yield f"  RSS  {mib(memory.rss)}   (for reference: shared libraries counted in full)"
    yield (f"  the command's own USS: {statistics.median(memory.command_uss[False]) / 1024:.0f} KiB without the "
           f"sandbox, {statistics.median(memory.command_uss[True]) / 1024:.0f} KiB with it ({SLEEP[0]})")
    yield (f"kernel side, noisy (the host's /proc/meminfo with {count} sandboxed workers running minus with {count} "
           f"plain ones, / {count}; median of {rounds} rounds, each round's in brackets), KiB per worker")
    for key in MEMINFO_KEYS:
        values = memory.kernel[key]
        note = "  (negative: less available; user and kernel memory together, the USS above included)" \
            if key == "MemAvailable" else ""
        each = ", ".join(f"{v / 1024:+.0f}" for v in values)
        yield f"  {key + ':':13} {statistics.median(values) / 1024:+8.0f}   [{each}]{note}"
    kernel = [sum(memory.kernel[k][n] for k in KERNEL_KEYS) for n in range(rounds)]
    each = ", ".join(f"{v / 1024:+.0f}" for v in kernel)
    yield f"  {' + '.join(KERNEL_KEYS)}: {statistics.median(kernel) / 1024:+.0f}   [{each}]"


# ------------------------------------------------------------------------------------------ main


def missing() -> str | None:
    if os.geteuid() != 0:
        return "must run as root (bubblewrap runs as root under elasticd, then setpriv drops to the tenant's user)"
    for tool in (BWRAP, SETPRIV):
        if not os.access(tool, os.X_OK):
            return f"missing: {tool}"
    for tool in ("useradd", "userdel", "groupdel"):
        if shutil.which(tool) is None:
            return f"missing: {tool}"
    return None


def run(started: Started, tenant: Tenant, args: argparse.Namespace) -> None:
    version = subprocess.run([BWRAP, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    print(f"{version}; {os.cpu_count()} CPUs; tenant's user {tenant.run_as.user} (uid {tenant.run_as.uid}); "
          f"{len(present_masks(tenant.sandbox.hidden))} paths masked in the view", flush=True)
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for n in range(WARMUP + args.rounds):
        order = (False, True) if n % 2 == 0 else (True, False)
        for sandboxed in order:
            timed = time_start(started, tenant, sandboxed)
            if n >= WARMUP:
                times[sandboxed].append(timed)
    print()
    for line in start_figures(times, args.rounds):
        print(line)
    memory = Memory()
    for _ in range(args.mem_rounds):
        measure_memory(started, tenant, args.concurrent, args.settle, memory)
    print()
    for line in memory_figures(memory, args.concurrent, args.mem_rounds):
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="starts of each kind timed (default 30)")
    parser.add_argument("--concurrent", type=int, default=20,
                        help="long-running workers of each kind at once for the memory figures (default 20)")
    parser.add_argument("--mem-rounds", type=int, default=3, help="rounds of the memory measure (default 3)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds before reading memory, after starting or stopping a set (default 1)")
    args = parser.parse_args()
    if args.rounds < 2 or args.concurrent < 1 or args.mem_rounds < 1:
        parser.error("--rounds must be at least 2, --concurrent and --mem-rounds at least 1")
    why = missing()
    if why is not None:
        print(why, file=sys.stderr)
        return 2
    become_subreaper()
    started = Started()
    run_as: RunAs | None = None
    try:
        run_as = make_user()
        with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
            try:
                run(started, make_tenant(Path(tmp), run_as), args)
            finally:
                started.stop_all()  # before the directory goes: nothing started may still be in it
    except KeyboardInterrupt:
        print("\ninterrupted: stopping what was started", file=sys.stderr)
        return 130
    finally:
        started.stop_all()
        if run_as is not None:
            remove_user(run_as.user)
    return 0


if __name__ == "__main__":
    sys.exit(main())
