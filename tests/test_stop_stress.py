"""SIGTERM at random moments of the pool's life: the daemon exits within its bound, with 0, and no worker it ever
started outlives it.

One round per phase, each on a fresh daemon: while load arrives (scale-up), while the pool compacts (load
stopped), while a retiring worker drains a long open request, while a SIGSTOPped worker is found hung and
replaced, during a reload that replaces a group (its env changed), during a reload that removes an app, and
during a reload under load. The moment of the SIGTERM is drawn from a seeded ``random.Random``: a failure
names its seed and phase, and ``STOP_STRESS_SEED=<seed> pytest tests/test_stop_stress.py -k <phase>``
replays the same choices (the machine's timing is not replayed, only the test's choices).

A last round stops the daemon while nothing reads its notify socket (a stalled systemd). It found that
elasticd blocked its event loop in libsystemd's sd_notify once the socket's queue was full, and so never
handled the SIGTERM; elasticd now sends its notifications on a non-blocking socket (see elasticd/systemd.py).
The other rounds read the socket all the time, as systemd does.

The moments are found from the daemon's log (the lines it writes when it scales up, compacts, declares a
worker hung, finishes a reload): reading a file is cheap and exact, where asking elasticctl takes a whole
Python start each time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from harness import PYTHON, browse

SEED = int(os.environ.get("STOP_STRESS_SEED") or random.SystemRandom().randrange(1 << 32))
STOP_TIMEOUT = 2.0
# After SIGTERM: the front drains within stop_timeout; then every alive worker gets SIGTERM at once and SIGKILL
# after stop_timeout (in parallel: one stop_timeout for all); then the leaves are emptied (≤ 5 s).
EXIT_BOUND = 2 * STOP_TIMEOUT + 5.0
REAP_GRACE = 1.0  # after the daemon exits, how long a worker may take to be reaped (a zombie counts as gone)

SHOP = """\
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{DEMO_X: "{x}"}}
            concurrency: 4
            pool: {{min_workers: {min_workers}, max_workers: 3, drain_timeout: 5s}}
"""
BLOG = """\
      blog:
        domains: [blog.localhost]
        root: {root}
        groups:
          main:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 1, max_workers: 1, drain_timeout: 5s}}
"""
SERVER = "  occupancy_interval: 200ms\n  hung_after: 600ms\n"


def tenants(root: Path, x: str = "1", *, blog: bool = False, min_workers: int = 1) -> str:
    apps = SHOP.format(root=root, x=x, min_workers=min_workers) + (BLOG.format(root=root) if blog else "")
    return "tenants:\n  acme:\n    apps:\n" + apps


PHASES = ["scale-up", "compaction", "drain", "hung", "reload-replace", "reload-remove", "reload-under-load"]
TIMINGS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    if TIMINGS:
        print(f"\nstop stress, seed {SEED} (bound {EXIT_BOUND:g}s):")
        for line in TIMINGS:
            print("  " + line)


# ---------------------------------------------------------------------- talking to the daemon


class LogWatch:
    """Waits for a line of the daemon's log, from where the last wait stopped."""

    def __init__(self, d, where: str) -> None:
        self.d = d
        self.where = where
        self.offset = 0

    def wait(self, pattern: str, timeout: float) -> re.Match[str]:
        regex = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while True:
            text = self.d.log_text()
            found = regex.search(text, self.offset)
            if found:
                self.offset = found.end()
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.where}: no log line /{pattern}/ within {timeout:g}s before the "
                                     f"SIGTERM; pool: {_pool_brief(self.d)}; log tail:\n{_tail(text)}")
            time.sleep(0.02)


def _pool_brief(d) -> str:
    """The pool's counts and last decisions, for a message (at most 5 s: the daemon may be the problem)."""
    try:
        result = subprocess.run([PYTHON, "-m", "elasticd.ctl", "--socket", str(d.admin), "pool", "acme/shop",
                                 "--json"], capture_output=True, text=True, timeout=5)
        group = json.loads(result.stdout)["groups"]["green"]
    except Exception as exc:
        return f"unavailable ({exc!r})"
    last = [(x["decision"], x.get("reason")) for x in group["decisions"][-4:]]
    return f"counts {group['decision_counts']}, last {last}"


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


class Load:
    """Users arriving one after the other (new logins while the reception is busy are passed to other workers:
    that spreads them), each keeping one request in flight on its worker (``/sleep``: a slot of the worker's
    executor, which a loaded machine does not bend the way it bends CPU readings, and light on a shared
    2-core machine). Every thread ends by itself at ``seconds``."""

    def __init__(self, d, users: int = 6, seconds: float = 25.0, every: float = 0.6) -> None:
        self.d = d
        self.halted = threading.Event()
        self.deadline = time.monotonic() + seconds
        self.threads: list[threading.Thread] = []
        self._arrivals = threading.Thread(target=self._arrive, args=(users, every), daemon=True)
        self._arrivals.start()

    def _arrive(self, users: int, every: float) -> None:
        for i in range(users):
            if self.halted.is_set() or time.monotonic() > self.deadline:
                return
            thread = threading.Thread(target=self._user, args=(i,), daemon=True)
            self.threads.append(thread)
            thread.start()
            self.halted.wait(every if i else every / 2)

    def _user(self, i: int) -> None:
        try:
            _, _, uid = browse(self.d, "/")
            browse(self.d, f"/login?name=u{i}", uid)
        except (OSError, http.client.HTTPException):
            return
        while not self.halted.is_set() and time.monotonic() < self.deadline:
            try:
                browse(self.d, "/sleep?ms=150", uid, timeout=10)
            except (OSError, http.client.HTTPException):  # the daemon stopping, or a slow answer: back off
                self.halted.wait(0.1)

    def halt(self) -> None:
        self.halted.set()
        self._arrivals.join(15)
        for thread in list(self.threads):
            thread.join(15)


def _open_request(d, host: str, ms: int) -> threading.Thread:
    """A long request open on the front (answered or cut: either is fine, the test is about the stop)."""

    def run() -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):
            browse(d, f"/sleep?ms={ms}", host=host, timeout=ms / 1000 + 10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------- the workers of a daemon


def _ours(d, pid: int) -> bool:
    """Alive, not a zombie, and a worker of this daemon (pid_max is small here: a pid seen earlier may have been
    reused by a process that has nothing to do with us)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.environ().get("ELASTIC_LISTEN", "").startswith(f"unix:{d.runtime}/")
    except psutil.AccessDenied:
        return False  # another user's process: not one of ours
    except psutil.NoSuchProcess:
        return False


def _describe(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        return (f"pid {pid} {process.status()} {' '.join(process.cmdline())[:80]} "
                f"ELASTIC_WORKER_ID={process.environ().get('ELASTIC_WORKER_ID')}")
    except psutil.Error as exc:
        return f"pid {pid}: {exc!r}"


def _diagnose(d) -> str:
    """A daemon that did not exit: is it spinning or waiting, and where (SIGABRT: faulthandler dumps every
    thread's stack into its log)."""
    try:
        process = psutil.Process(d.process.pid)
        before = sum(process.cpu_times()[:2])
        time.sleep(0.5)
        spent = sum(process.cpu_times()[:2]) - before
        threads = len(process.threads())
        state = f"daemon {process.status()}, {spent / 0.5:.0%} CPU over 0.5 s, {threads} threads"
    except psutil.Error as exc:
        state = f"daemon: {exc!r}"
    d.process.send_signal(signal.SIGABRT)
    with contextlib.suppress(Exception):
        d.process.wait(3)
    return state


_STARTED = re.compile(r"worker (\S+) started, pid (\d+)$", re.M)


# ---------------------------------------------------------------------- the phases: each returns what it did


def _scale_up(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    state["load"] = Load(d)
    log.wait(r"pool acme/shop/green: scale-up to \d+ workers", 40)
    what = "after scale-up #1"
    if rng.random() < 0.5:  # a second one, if the load asks for it soon (four users do not always)
        with contextlib.suppress(AssertionError):
            log.wait(r"pool acme/shop/green: scale-up to \d+ workers", 8)
            what = "after scale-up #2"
    delay = rng.uniform(0.0, 1.0)  # a worker being launched (not routable yet) or just joined
    time.sleep(delay)
    return f"{what} +{delay:.2f}s"


def _compaction(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    load = state["load"] = Load(d)
    log.wait(r"pool acme/shop/green: scale-up to \d+ workers", 40)
    log.wait(r"worker acme\.shop\.green\.2 started", 10)
    time.sleep(rng.uniform(1.5, 3.0))  # let the new worker take users and load
    d.pool()
    load.halt()
    log.wait(r"pool acme/shop/green: compaction: draining", 30)
    delay = rng.uniform(0.0, 0.3)  # the retiring worker: draining, being stopped, or gone
    time.sleep(delay)
    return f"after the first compaction +{delay:.2f}s"


def _drain(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    ms = rng.choice([3000, 6000])  # 6 s outlasts the front's drain (stop_timeout): the front cuts it
    state["open"] = _open_request(d, "shop.localhost", ms)
    time.sleep(0.4)
    d.write_config(tenants(d.tmp, x="2"))
    d.signal(signal.SIGHUP)
    log.wait(r"elasticd: reloaded ", 20)  # the new worker serves; the old one drains the open request
    delay = rng.uniform(0.0, 1.0)
    time.sleep(delay)
    return f"sleep {ms}ms open on the retiring worker, reloaded +{delay:.2f}s"


def _hung(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    deadline = time.monotonic() + 10
    while True:  # a reporting worker is hung once its reports stop (hung_after) and so does its CPU
        [worker] = d.pool()["workers"]
        if worker["announced"] and worker["state"] == "running":
            break
        assert time.monotonic() < deadline, f"{log.where}: the worker never announced itself: {worker}"
        time.sleep(0.2)
    os.kill(worker["pid"], signal.SIGSTOP)  # the worker our daemon started: the daemon must SIGKILL it
    state["stopped_pid"] = worker["pid"]
    delay = rng.uniform(0.0, 2.5)  # before it is found hung (~0.6-1 s), while it is replaced, or after
    time.sleep(delay)
    found = "found hung" if re.search(r"is hung: ", d.log_text()) else "not found hung yet"
    return f"SIGSTOP pid {worker['pid']} +{delay:.2f}s ({found})"


def _reload_replace(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    min_workers = rng.choice([1, 2])
    d.write_config(tenants(d.tmp, x="2", min_workers=min_workers))
    d.signal(signal.SIGHUP)
    delay = rng.uniform(0.0, 1.5)  # new workers launching (reload under way) or the old one retiring
    time.sleep(delay)
    return f"env changed (min_workers {min_workers}), SIGHUP +{delay:.2f}s"


def _reload_remove(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    sleeping = rng.random() < 0.5
    if sleeping:
        state["open"] = _open_request(d, "blog.localhost", 3000)
        time.sleep(0.4)
    also_replace = rng.random() < 0.5
    d.write_config(tenants(d.tmp, x="2" if also_replace else "1"))
    d.signal(signal.SIGHUP)
    delay = rng.uniform(0.0, 1.5)
    time.sleep(delay)
    return (f"blog removed{' with sleep 3000ms open on it' if sleeping else ''}"
            f"{' and shop replaced' if also_replace else ''}, SIGHUP +{delay:.2f}s")


def _reload_under_load(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    state["load"] = Load(d)
    log.wait(r"pool acme/shop/green: scale-up to \d+ workers", 40)
    time.sleep(rng.uniform(0.0, 1.0))
    d.write_config(tenants(d.tmp, x="2"))
    d.signal(signal.SIGHUP)
    delay = rng.uniform(0.0, 1.5)
    time.sleep(delay)
    return f"scaling up, env changed, SIGHUP +{delay:.2f}s"


def _stalled_notify(d, rng: random.Random, log: LogWatch, state: dict) -> str:
    # Nothing reads the notify socket after READY: after 11 unread datagrams (net.unix.max_dgram_qlen + 1)
    # the next sd_notify blocks. Two reloads that each replace a worker send 12 (RELOADING, READY, and a
    # STATUS for each of starting, running, stopping, stopped).
    d.write_config(tenants(d.tmp, x="2"))
    d.signal(signal.SIGHUP)
    log.wait(r"elasticd: reloaded ", 20)
    time.sleep(0.5)
    d.write_config(tenants(d.tmp, x="3"))
    d.signal(signal.SIGHUP)
    delay = rng.uniform(1.0, 2.0)
    time.sleep(delay)
    return f"notify socket not read, two reloads, SIGHUP +{delay:.2f}s"


RUN = {"scale-up": _scale_up, "compaction": _compaction, "drain": _drain, "hung": _hung,
       "reload-replace": _reload_replace, "reload-remove": _reload_remove, "reload-under-load": _reload_under_load,
       "stalled-notify": _stalled_notify}


class Systemd:
    """The systemd side of the notify socket, reading it all the time as PID 1 does (the harness reads it only
    in ``wait_for``; the stalled-notify round leaves it unread on purpose)."""

    def __init__(self, d) -> None:
        self.d = d
        self.halted = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.halted.wait(0.05):
            self.d.notify.drain()

    def halt(self) -> None:
        self.halted.set()
        self.thread.join(5)


# ---------------------------------------------------------------------- the test


@pytest.mark.parametrize("phase", [*PHASES, "stalled-notify"])
def test_sigterm_at_a_random_moment(daemons, tmp_path, monkeypatch, phase):
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # a daemon that hangs is sent SIGABRT: its stacks go to its log
    core = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, core[1]))  # and leaves no core file (inherited by the daemon)
    rng = random.Random(f"{SEED}-{phase}")
    where = (f"seed={SEED} phase={phase} (replay: STOP_STRESS_SEED={SEED} .venv/bin/python -m pytest "
             f"tests/test_stop_stress.py -k {phase})")
    d = daemons(tenants(tmp_path, blog=phase == "reload-remove"), stop_timeout=f"{STOP_TIMEOUT:g}s",
                extra_server=SERVER)
    log = LogWatch(d, where)
    state: dict = {}
    systemd = None
    try:
        d.start()
        if phase != "stalled-notify":
            systemd = Systemd(d)
        d.status()
        what = RUN[phase](d, rng, log, state)
        # Every worker of this daemon right now (its environment points into the runtime dir), and every pid
        # status or the pool showed before.
        alive = set(d._workers_of_this_daemon())
        before = alive | d.seen_pids
        sent = time.monotonic()
        d.signal(signal.SIGTERM)
        try:
            d.process.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            left = [_describe(p) for p in d._workers_of_this_daemon()]
            diagnosis = _diagnose(d)
            pytest.fail(f"{where}: the daemon did not exit within {EXIT_BOUND:g}s of SIGTERM ({what}); "
                        f"{diagnosis}; workers alive: {left}; log tail:\n{_tail(d.log_text(), 150)}")
        seconds = time.monotonic() - sent
        exited = time.monotonic()
        if "load" in state:
            state["load"].halt()
        text = d.log_text()
        started = {int(pid) for _, pid in _STARTED.findall(text)}
        candidates = before | started | d.seen_pids
        while True:  # a worker may take a moment to be reaped; a zombie is gone
            survivors = sorted({p for p in candidates if _ours(d, p)} | set(d._workers_of_this_daemon()))
            if not survivors or time.monotonic() > exited + REAP_GRACE:
                break
            time.sleep(0.05)
        stopping = text[text.find(" elasticd: stopping"):]
        killed = len(re.findall(r"did not stop within", stopping))
        line = (f"{phase:18} stop {seconds:5.2f}s  exit {d.process.returncode}  workers at SIGTERM {len(alive)}, "
                f"started {len(started)}, SIGKILLed at stop {killed}  [{what}]")
        TIMINGS.append(line)
        print(f"\n{where}\n  {line}")
        assert seconds <= EXIT_BOUND, f"{where}: exit took {seconds:.2f}s"
        assert d.process.returncode == 0, f"{where}: exit code {d.process.returncode}; log tail:\n{_tail(text, 80)}"
        assert re.search(r" elasticd: stopping$", text, re.M), f"{where}: no 'stopping' in the log:\n{_tail(text)}"
        assert re.search(r" elasticd: stopped$", text, re.M), f"{where}: no 'stopped' in the log:\n{_tail(text)}"
        assert not survivors, (f"{where}: workers outlived the daemon ({what}): "
                               f"{[_describe(p) for p in survivors]}; log tail:\n{_tail(text, 120)}")
        if "stopped_pid" in state:  # the SIGSTOPped worker too: SIGKILL reaches a stopped process
            assert not _ours(d, state["stopped_pid"]), f"{where}: the SIGSTOPped worker survived"
    finally:
        if "load" in state:
            state["load"].halt()
        if systemd is not None:
            systemd.halt()
        if d.process is not None and d.process.poll() is None:
            d.process.kill()  # only after a failure: its workers are killed by pid below
            d.process.wait(10)
        d.stop()
        d.kill_leftovers()
        if "open" in state:
            state["open"].join(15)
        resource.setrlimit(resource.RLIMIT_CORE, core)
