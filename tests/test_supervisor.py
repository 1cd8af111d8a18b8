from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from elasticd.config.model import App, Group
from elasticd.supervisor.backoff import RestartPolicy
from elasticd.supervisor.lifecycle import WorkerState
from elasticd.supervisor.plan import Desired, Running, plan
from elasticd.supervisor.spawn import TRAMPOLINE, UMASK, WorkerSpec, spawn_argv, spec_for, worker_env
from elasticd.supervisor.supervisor import Supervisor
from elasticd.supervisor.worker_process import Worker

# ---------------------------------------------------------------------- backoff (pure, a table)

# (seconds the worker ran, seconds since the previous death) → expected delay (None = failed)
BACKOFF_TABLE = [
    ("first crash waits 1s", [(0.1, 0)], [1.0]),
    ("doubling", [(0.1, 0), (0.1, 1), (0.1, 2)], [1.0, 2.0, 4.0]),
    ("five deaths within 60s: failed", [(0.1, 0), (0.1, 1), (0.1, 2), (0.1, 4), (0.1, 8)],
     [1.0, 2.0, 4.0, 8.0, None]),
    ("healthy for 60s resets the delay", [(0.1, 0), (0.1, 1), (0.1, 2), (61, 65)], [1.0, 2.0, 4.0, 1.0]),
    ("old deaths leave the window", [(5, 0), (5, 10), (5, 20), (5, 40), (5, 70), (5, 90)],
     [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]),
    ("capped at 60s", [(30, 0), (30, 61), (30, 122), (30, 183), (30, 244), (30, 305), (30, 366), (30, 427)],
     [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]),
]


@pytest.mark.parametrize(("name", "events", "expected"), BACKOFF_TABLE, ids=[r[0] for r in BACKOFF_TABLE])
def test_backoff(name, events, expected):
    policy = RestartPolicy()
    now = 1000.0
    got = []
    for ran, gap in events:
        now += gap
        got.append(policy.on_exit(now, now - ran))
    assert got == expected


# ---------------------------------------------------------------------- plan (pure, a table)


def _spec(argv: str = "app", env: tuple = ()) -> WorkerSpec:
    return WorkerSpec(argv=(argv,), env=env, cwd="/srv", leaf="/cg/t/a")


def test_plan_diff():
    running = {
        ("t", "a", "keep"): Running(_spec(), 1),
        ("t", "a", "grown"): Running(_spec(), 3),  # the pool grew it: still within bounds, kept
        ("t", "a", "cmd"): Running(_spec("old"), 1),
        ("t", "a", "env"): Running(_spec(env=(("A", "1"),)), 1),
        ("t", "a", "more"): Running(_spec(), 1),
        ("t", "a", "less"): Running(_spec(), 4),
        ("t", "gone", "g"): Running(_spec(), 1),
    }
    desired = {
        ("t", "a", "keep"): Desired(_spec(), 1, 4),
        ("t", "a", "grown"): Desired(_spec(), 1, 4),
        ("t", "a", "cmd"): Desired(_spec("new"), 1, 4),
        ("t", "a", "env"): Desired(_spec(env=(("A", "2"),)), 1, 4),
        ("t", "a", "more"): Desired(_spec(), 3, 4),
        ("t", "a", "less"): Desired(_spec(), 1, 2),
        ("t", "new", "g"): Desired(_spec(), 1, None),
    }
    result = plan(running, desired)
    assert result.keep == [("t", "a", "keep"), ("t", "a", "grown")]
    assert sorted(result.replace) == [("t", "a", "cmd"), ("t", "a", "env")]
    assert result.resize == [("t", "a", "more"), ("t", "a", "less")]
    assert result.start == [("t", "new", "g")]
    assert result.stop == [("t", "gone", "g")]


def test_spec_substitutes_python_and_keeps_argv_verbatim():
    group = Group(name="g", command=("{python}", "-m", "app", "{python}x"), python="/venv/bin/python")
    app = App(name="a", domains=("a.localhost",), root="/srv/a", default_group="g", groups={"g": group})
    spec = spec_for(app, group, "/cg/tenants/t/a")
    assert spec.argv == ("/venv/bin/python", "-m", "app", "/venv/bin/pythonx")
    # A tenant without a user: the umask and the parent-death signal only.
    keep = ["/bin/sh", "-c", UMASK, "umask", "/usr/bin/setpriv", "--pdeathsig", "SIGKILL", "--"]
    assert spawn_argv(spec) == ["/bin/sh", "-c", TRAMPOLINE, "/cg/tenants/t/a", *keep, *spec.argv]
    own = spec_for(app, Group(name="g", command=("{python}",)), None)
    assert own.argv == (sys.executable,)
    assert spawn_argv(own) == [*keep, sys.executable]
    gunicorn = WorkerSpec(argv=("gunicorn", "--bind", "unix:{socket}", "app:app"), env=(), cwd="/", leaf=None)
    assert spawn_argv(gunicorn, "/run/elasticd/workers/t.a.g.1.sock") == [
        *keep, "gunicorn", "--bind", "unix:/run/elasticd/workers/t.a.g.1.sock", "app:app"]


def test_a_tenant_with_a_user_drops_everything_after_the_trampoline():
    from elasticd.config.model import RunAs
    group = Group(name="g", command=("app", "$(id)"))
    app = App(name="a", domains=("a.localhost",), root="/srv/a", default_group="g", groups={"g": group})
    spec = spec_for(app, group, "/cg/tenants/t/a", RunAs("shop", 1234, "shop", 1235, "/home/shop"))
    assert spawn_argv(spec) == [
        "/bin/sh", "-c", TRAMPOLINE, "/cg/tenants/t/a",  # the one constant script, as root: the pid is placed
        "/bin/sh", "-c", UMASK, "umask",  # the umask, still as root
        "/usr/bin/setpriv", "--reuid=1234", "--regid=1235", "--clear-groups", "--no-new-privs", "--inh-caps=-all",
        "--bounding-set=-all", "--pdeathsig", "SIGKILL", "--", "app", "$(id)"]
    assert TRAMPOLINE == 'echo $$ > "$0/cgroup.procs" && exec "$@"'  # unchanged by any tenant setting
    env = worker_env(spec, {"PATH": "/usr/bin", "HOME": "/root", "USER": "root", "SECRET": "elasticd's"},
                     worker_id="t.a.g.1", token="x", runtime_dir="/run/elasticd", occupancy_interval=1.0)
    assert (env["HOME"], env["USER"], env["LOGNAME"], env["PATH"]) == ("/home/shop", "shop", "shop", "/usr/bin")
    assert "SECRET" not in env


def test_worker_env_contract():
    spec = WorkerSpec(argv=("x",), env=(("APP_MODE", "prod"),), cwd="/", leaf=None)
    env = worker_env(spec, {"PATH": "/bin", "NOTIFY_SOCKET": "/run/systemd/notify", "JOURNAL_STREAM": "1:2",
                            "LANG": "C.UTF-8", "AWS_SECRET_ACCESS_KEY": "elasticd's own", "PYTHONPATH": "/x"},
                     worker_id="t.a.g.1", token="secret", runtime_dir="/run/elasticd", occupancy_interval=0.5)
    assert env == {  # nothing of elasticd's own environment but PATH and LANG (and HOME/USER/LOGNAME)
        "PATH": "/bin", "LANG": "C.UTF-8", "APP_MODE": "prod",
        "ELASTIC_LISTEN": "unix:/run/elasticd/workers/t/a.g.1.sock",
        "ELASTIC_CHANNEL": "unix:/run/elasticd/workers/t/channel.sock",
        "ELASTIC_WORKER_ID": "t.a.g.1", "ELASTIC_TOKEN": "secret", "ELASTIC_OCCUPANCY_INTERVAL": "0.5",
    }


# ---------------------------------------------------------------------- the trampoline, for real

HOSTILE = [
    "$(touch {canary})",
    "`touch {canary}`",
    "; rm -rf / ; touch {canary}",
    "a' \"b\" 'c",
    "line1\nline2\n",
    "$HOME ${PATH} $0 $@ $$",
    "* ? [a-z] ~",
    "| touch {canary} &",
    "ünïcødé ✓ 中文",
    "",
    " leading and trailing ",
    "-c",
    "\\x00-ish \\ backslash",
]

ECHO_ARGV = "import json, os, sys; json.dump({'argv': sys.argv[1:], 'pid': os.getpid()}, open(os.environ['OUT'], 'w'))"


def test_hostile_argv_reaches_the_worker_byte_for_byte(tmp_path):
    leaf = tmp_path / "leaf"
    leaf.mkdir()
    (leaf / "cgroup.procs").write_text("")
    canary = tmp_path / "pwned"
    args = [a.replace("{canary}", str(canary)) for a in HOSTILE]
    spec = WorkerSpec(argv=(sys.executable, "-c", ECHO_ARGV, *args), env=(), cwd=str(tmp_path), leaf=str(leaf))
    out = tmp_path / "out.json"
    subprocess.run(spawn_argv(spec), env={**os.environ, "OUT": str(out)}, check=True, timeout=30)
    seen = json.loads(out.read_text())
    assert seen["argv"] == args
    assert not canary.exists()
    # The pid the shell wrote is the worker's own: `exec` kept it.
    assert (leaf / "cgroup.procs").read_text().strip() == str(seen["pid"])


def test_trampoline_refuses_to_run_unconfined(tmp_path):
    canary = tmp_path / "ran"
    spec = WorkerSpec(argv=("/usr/bin/touch", str(canary)), env=(), cwd="/", leaf=str(tmp_path / "no-such-leaf"))
    result = subprocess.run(spawn_argv(spec), capture_output=True, timeout=30)
    assert result.returncode != 0
    assert not canary.exists()


# ---------------------------------------------------------------------- a worker, for real

SERVER = """
import os, signal, socket, sys, time
path = os.environ["ELASTIC_LISTEN"].removeprefix("unix:")
mode = os.environ.get("MODE", "serve")
if mode == "crash":
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "orphans":
    import subprocess
    child = subprocess.Popen(["sleep", "300"])
    open(os.environ["CHILD_PID"], "w").write(str(child.pid))
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen()
print("listening", os.environ["ELASTIC_WORKER_ID"], flush=True)
while True:
    conn, _ = s.accept()
    conn.close()
"""


def _worker(tmp_path, mode: str = "serve", **env: str) -> Worker:
    (tmp_path / "workers").mkdir(exist_ok=True)
    spec = WorkerSpec(argv=(sys.executable, "-c", SERVER), env=(("MODE", mode), *env.items()), cwd=str(tmp_path),
                      leaf=None)
    fast = RestartPolicy(base=0.05, cap=0.2, max_deaths=3, window=60.0)
    return Worker("t.a.g.1", "t", "a", "g", spec, runtime_dir=str(tmp_path), occupancy_interval=1.0, policy=fast)


async def test_worker_becomes_routable_and_logs_with_its_id(tmp_path, caplog):
    caplog.set_level("INFO", logger="elasticd.worker")
    worker = _worker(tmp_path)
    worker.start()
    assert await worker.wait_routable(10)
    assert worker.pid is not None and psutil.pid_exists(worker.pid)
    await asyncio.sleep(0.2)
    await worker.stop(5)
    assert worker.state == "stopped"
    assert "[t.a.g.1] listening t.a.g.1" in caplog.text


async def test_worker_is_restarted_then_marked_failed(tmp_path):
    worker = _worker(tmp_path, "crash")
    worker.start()
    assert not await worker.wait_routable(10)
    assert worker.state == "failed"
    assert worker.restarts == 2  # three deaths with max_deaths=3: two restarts, then failed
    await worker.stop(1)


async def test_killed_worker_is_restarted(tmp_path):
    worker = _worker(tmp_path)
    worker.start()
    assert await worker.wait_routable(10)
    first = worker.pid
    os.kill(first, 9)
    deadline = time.monotonic() + 10
    while not (worker.routable and worker.pid != first) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert worker.routable and worker.pid != first
    assert worker.restarts == 1
    await worker.stop(5)


async def test_stop_escalates_to_sigkill(tmp_path):
    worker = _worker(tmp_path, "stubborn")
    worker.start()
    assert await worker.wait_routable(10)
    pid = worker.pid
    started = time.monotonic()
    await worker.stop(0.5)
    assert time.monotonic() - started < 5
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_stop_leaves_no_child_behind(tmp_path):
    child_file = tmp_path / "child.pid"
    worker = _worker(tmp_path, "orphans", CHILD_PID=str(child_file))
    worker.start()
    assert await worker.wait_routable(10)
    child = int(child_file.read_text())
    await worker.stop(5)
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not psutil.pid_exists(child)


async def test_a_worker_being_started_is_found_before_it_is_routable(tmp_path):
    """A worker runs (and announces itself on the channel) before the start or reload that launched it has seen
    it routable; find() must know it then, or the channel refuses it as "no worker … runs here" (in the VM suite
    that warning came for most workers at every start)."""
    (tmp_path / "workers").mkdir()
    slow = "import time; time.sleep(1.5)\n" + SERVER  # runs, but does not listen yet
    spec = WorkerSpec(argv=(sys.executable, "-c", slow), env=(), cwd=str(tmp_path), leaf=None)
    supervisor = Supervisor(str(tmp_path), lambda tenant, app: None, start_wait=10)
    launch = asyncio.create_task(supervisor._start_group(("t", "a", "g"), Desired(spec, 1, 1)))
    deadline = time.monotonic() + 10
    while (supervisor.find("t.a.g.1") is None or supervisor.find("t.a.g.1").pid is None) \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    found = supervisor.find("t.a.g.1")
    assert found is not None and found.pid is not None and found.token
    assert found.state == "starting"  # not routable yet: the launch is still waiting for it
    assert not launch.done()
    assert await launch == []
    assert supervisor.find("t.a.g.1") is found and found.routable
    await supervisor.stop_all()
    assert supervisor.find("t.a.g.1") is None


async def test_a_stop_cancelled_half_way_leaves_the_worker_for_stop_all(tmp_path):
    """A retire cancelled at shutdown while its worker ignores SIGTERM: the worker must stay known, so that
    stop_all finishes it (it would otherwise outlive the daemon)."""
    (tmp_path / "workers").mkdir()
    spec = WorkerSpec(argv=(sys.executable, "-c", SERVER), env=(("MODE", "stubborn"),), cwd=str(tmp_path), leaf=None)
    supervisor = Supervisor(str(tmp_path), lambda tenant, app: None, start_wait=10, stop_timeout=0.5)
    assert await supervisor._start_group(("t", "a", "g"), Desired(spec, 1, 1)) == []
    worker = supervisor.find("t.a.g.1")
    pid = worker.pid
    retire = asyncio.create_task(supervisor.retire("t.a.g.1"))
    await asyncio.sleep(0.2)  # inside its grace: SIGTERM sent, ignored
    retire.cancel()
    with pytest.raises(asyncio.CancelledError):
        await retire
    assert supervisor.find("t.a.g.1") is worker and psutil.pid_exists(pid)
    await supervisor.stop_all()
    assert supervisor.find("t.a.g.1") is None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_a_reload_reviving_a_failed_worker_shows_a_start_in_flight_while_the_failed_one_stops(tmp_path):
    """While the reload stops the failed worker, a request for the group must see a start in flight (the pool then
    waits for it), not a group at zero with room under max_workers: its cold start would be one worker too many
    (a soak saw two running in a group of max_workers 1)."""
    (tmp_path / "workers").mkdir()
    spec = WorkerSpec(argv=(sys.executable, "-c", SERVER), env=(), cwd=str(tmp_path), leaf=None)
    key = ("t", "a", "g")
    seen: list[tuple[bool, int]] = []

    class Watched(Supervisor):
        async def _stop_workers(self, workers):
            seen.append((self.launching(key), self.counted(key)))
            await super()._stop_workers(workers)

    supervisor = Watched(str(tmp_path), lambda tenant, app: None, start_wait=10)
    assert await supervisor._start_group(key, Desired(spec, 1, 1)) == []
    [failed] = supervisor.workers_of(key)
    await failed.stop(5)
    failed.state = WorkerState.FAILED  # (as a crash loop leaves it)
    assert await supervisor._revive_failed(key) == []
    assert seen == [(True, 1)]  # a start in flight, counted against the cap
    assert [w.id for w in supervisor.workers_of(key)] == ["t.a.g.2"]
    await supervisor.stop_all()


async def test_a_group_removed_and_added_again_while_draining_gets_new_worker_ids(tmp_path):
    (tmp_path / "workers").mkdir()
    spec = WorkerSpec(argv=(sys.executable, "-c", SERVER), env=(), cwd=str(tmp_path), leaf=None)
    supervisor = Supervisor(str(tmp_path), lambda tenant, app: None, start_wait=10)
    release = asyncio.Event()

    async def drain(workers, timeout):
        await release.wait()  # the removed group's worker still has a request open

    supervisor.wait_drained = drain
    key = ("t", "a", "g")
    assert await supervisor._start_group(key, Desired(spec, 1, 1)) == []
    draining = supervisor._stop_group(key)
    assert await supervisor._start_group(key, Desired(spec, 1, 1)) == []  # a reload brings it back
    assert [w.id for w in supervisor.workers_of(key)] == ["t.a.g.2"]
    assert supervisor.find("t.a.g.1") is not None and supervisor.counted(key) == 2  # both alive, both counted
    release.set()
    await draining
    assert supervisor.find("t.a.g.1") is None and supervisor.find("t.a.g.2").routable
    await supervisor.stop_all()


@pytest.mark.parametrize(("mode", "uid", "gid", "who", "want", "ok"), [
    (0o755, 0, 0, (1000, 1000), 1, True),  # others may search/execute
    (0o750, 0, 0, (1000, 1000), 1, False),  # not its group, others have nothing
    (0o750, 0, 1000, (1000, 1000), 1, True),  # its group may
    (0o700, 1000, 0, (1000, 1000), 1, True),  # its own
    (0o070, 1000, 1000, (1000, 1000), 1, False),  # the owner's bits count, not the group's, for the owner
    (0o711, 0, 0, (1000, 1000), 4, False),  # executable, not readable (a script could not run)
    (0o700, 5, 5, (0, 0), 1, True),  # root
])
def test_permits(mode, uid, gid, who, want, ok):
    from elasticd.supervisor.spawn import permits
    st = os.stat_result((0o100000 | mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))
    assert permits(st, *who, want) is ok


def test_runnable_names_the_path_and_why():
    import shutil
    import tempfile
    from pathlib import Path

    from elasticd.config.model import RunAs
    from elasticd.supervisor.runnable import runnable
    nobody = RunAs("nobody", 65534, "nogroup", 65534, "/")
    tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own tmp_path is under a 0700 directory of root's
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    tool = private / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    tmp_path.chmod(0o755)
    refusal = runnable(str(tool), "/usr/bin", nobody)
    assert refusal is not None and f"{private} (owner uid 0" in refusal
    assert "cannot be searched by user nobody" in refusal
    assert runnable("sh", "/usr/bin:/bin", nobody) is None
    assert "is not found in PATH=/nowhere" in runnable("no-such-tool", "/nowhere", nobody)
    private.chmod(0o755)
    tool.chmod(0o711)
    assert "is a script user nobody cannot read" in runnable(str(tool), "/usr/bin", nobody)
    shutil.rmtree(tmp_path)


async def test_every_change_of_what_is_routable_is_counted(tmp_path):
    """The daemon caches the front's routing per group until ``changes`` moves: a membership change or a
    worker's state change that went uncounted would keep routing to a worker that left its group."""
    (tmp_path / "workers").mkdir()
    spec = WorkerSpec(argv=(sys.executable, "-c", SERVER), env=(), cwd=str(tmp_path), leaf=None)
    supervisor = Supervisor(str(tmp_path), lambda tenant, app: None, start_wait=10)
    key = ("t", "a", "g")
    seen = supervisor.changes
    assert await supervisor._start_group(key, Desired(spec, 1, 1)) == []
    assert supervisor.changes > seen  # the group, its worker's states, its membership
    seen = supervisor.changes
    assert await supervisor._resize_group(key, Desired(spec, 2, 2)) == []
    assert supervisor.changes > seen and len(supervisor.workers_of(key)) == 2
    seen = supervisor.changes
    await supervisor._resize_group(key, Desired(spec, 1, 1))  # the newest leaves the group at once
    assert supervisor.changes > seen and [w.id for w in supervisor.workers_of(key)] == ["t.a.g.1"]
    with pytest.raises(AttributeError):  # membership is replaced whole, through the counting setter
        supervisor.workers_of(key).append(None)  # type: ignore[attr-defined]
    seen = supervisor.changes
    await supervisor.stop_all()
    assert supervisor.changes > seen  # their states: stopping, stopped
