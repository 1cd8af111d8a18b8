"""Scenario 24, issue #42 (elasticd's own crash is invisible to the tenants), under the shipped units:

1. **kill -9 of elasticd's MainPID under load** (two clients: a connection per request, and one kept alive), with
   three users logged in, each holding a counter in its worker's memory. systemd restarts elasticd (Restart=), the
   new instance reads the running state from systemd's store and adopts the workers from the keeper
   (elasticd-keeper.service, which outlived elasticd). Judged: no worker's pid changed, the keeper's neither; each
   user's counter continues on the same worker; no connection was refused (the front's socket waited in the store);
   the only failures are requests in flight at the kill (at most one per client); ``GET /v1/status`` says
   ``began: crash`` with every worker adopted; the time from the kill to the first answer.
2. **A crash loop**: three kills in a row, the second and third as soon as the new instance has a pid (before it
   adopts): the fourth instance adopts the same workers.
3. **A watchdog abort**: elasticd stopped with SIGSTOP (hung) past ``WatchdogSec=30``: systemd aborts it and starts
   another, which adopts the same workers.
4. **An OOM kill of elasticd alone**: its unit's ``memory.max`` set under what it uses, at run time; the kernel
   kills it there (the workers are the keeper's unit's), and the next instance adopts them.
5. **systemd gives up** (``StartLimitBurst=5`` in ``StartLimitIntervalSec=120``): kills in a row until systemd
   refuses another start ("Start request repeated too quickly"); no elasticd adopts the orphans, and the keeper stops
   them once its bound (``--orphan-bound 120``) has passed with no elasticd connected, and exits: no process is left
   in either unit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    BASE,
    ELASTICD_CGROUP,
    KEEPER_UNIT,
    UNIT,
    admin,
    browse,
    check,
    journal_cursor,
    journal_since,
    keeper_pid,
    procs,
    read,
    read_kv,
    run,
    say,
    show,
    start_with,
    status,
    stop_units,
    suite_config,
    systemctl,
    tenant_user,
    wait_for,
    workers,
    write_config,
)

TENANT, APP, GROUP, HOST = "sturdy", "web", "main", "sturdy.localhost"
ROOT = Path("/srv", TENANT, APP)
ORPHAN_BOUND = 120  # the shipped unit's --orphan-bound

CONFIG = f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 10s
  occupancy_interval: 1s
tenants:
  {TENANT}:
    user: {tenant_user(TENANT)}
    resources: {{cpu: 100%, memory: 512M}}
    apps:
      {APP}:
        domains: [{HOST}]
        root: {ROOT}
        groups:
          {GROUP}:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 2, max_workers: 2}}
"""


class Load:
    """Two clients until halted, one request at a time each: a connection per request, and a kept-alive one
    (reconnected after a failure). Each outcome is counted by kind, with the time from ``mark`` to the first answer
    to a request sent after it."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.counts = {"200": 0, "refused": 0, "cut": 0, "other": 0}
        self.others: list[str] = []
        self.mark: float | None = None
        self.first_after_mark: float | None = None
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._fresh, daemon=True),
                        threading.Thread(target=self._kept, daemon=True)]

    def begin(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def halt(self) -> dict[str, int]:
        self.stop.set()
        for thread in self.threads:
            thread.join(150)
        return dict(self.counts)

    def _fresh(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            code, body, _ = browse(HOST, "/", timeout=120)
            self._count(code, body, sent)
            time.sleep(0.05)

    def _kept(self) -> None:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", 8080, timeout=120)
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                conn.request("GET", "/", headers={"Host": HOST})
                response = conn.getresponse()
                response.read()
                self._count(response.status, b"", sent)
            except (OSError, http.client.HTTPException) as exc:
                self._count(None, f"{type(exc).__name__}: {exc}".encode(), sent)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", 8080, timeout=120)
            time.sleep(0.05)
        conn.close()

    def _count(self, code: int | None, body: bytes, sent: float) -> None:
        with self.lock:
            if code == 200:
                self.counts["200"] += 1
                if self.mark is not None and sent > self.mark and self.first_after_mark is None:
                    self.first_after_mark = time.monotonic() - self.mark
            elif code is None and b"ConnectionRefused" in body:
                self.counts["refused"] += 1
            elif code is None:
                self.counts["cut"] += 1  # (reset, or closed before an answer: a request in flight at the kill)
                self.others.append(body[:160].decode(errors="replace"))
            else:
                self.counts["other"] += 1
                self.others.append(f"{code} {body[:160]!r}")


def _pids() -> dict[str, int]:
    return {w["id"]: w["pid"] for w in workers(status(), TENANT, APP) if w["state"] == "running"}


def _counter(cookie: str) -> dict[str, Any]:
    import json

    code, body, _ = browse(HOST, "/counter", cookie)
    check(code == 200, f"/counter answered {code}: {body[:200]!r}")
    return json.loads(body)


def _main() -> int:
    return int(show("MainPID")["MainPID"])


def _ready_after(previous: int, timeout: float) -> tuple[int, float]:
    """The new MainPID once the unit is active again (READY=1: the workers adopted), and how long that took."""
    began = time.monotonic()

    def ready() -> int | None:
        props = show("MainPID", "ActiveState", "SubState")
        pid = int(props["MainPID"])
        return pid if pid not in (0, previous) and props["ActiveState"] == "active" else None

    pid = wait_for(ready, timeout, 0.2)
    check(pid, f"elasticd was not active again within {timeout:.0f}s of losing pid {previous}:\n"
          + systemctl("status", UNIT, "--no-pager", "-l", "-n", "30").stdout)
    return pid, time.monotonic() - began


def _began() -> dict[str, Any]:
    code, body = admin("GET", "/v1/status")
    check(code == 200, f"GET /v1/status answered {code}")
    return body["began"]


def _kill_when_started(previous: int, timeout: float = 120) -> int:
    """SIGKILL the next instance as soon as it has a pid (before it adopts anything); its pid."""
    pid = wait_for(lambda: (p := _main()) not in (0, previous) and p, timeout, 0.05)
    check(pid, f"no new elasticd within {timeout:.0f}s of {previous}: {show('ActiveState', 'Result')}")
    os.kill(pid, signal.SIGKILL)
    return pid


def _adopted_all(before: dict[str, int], keeper: int, what: str) -> dict[str, Any]:
    wait_for(lambda: _pids() == before, 30, 0.5)
    now = _pids()
    check(now == before, f"after {what} the workers are {now}, not {before} (restarted, or not adopted)")
    check(keeper_pid() == keeper, f"after {what} the keeper's pid is {keeper_pid()}, not {keeper}")
    began = _began()
    check(began.get("how") == "crash" and began.get("adopted") == len(before) and not began.get("not_adopted")
          and began.get("users_dropped") == 0, f"after {what} GET /v1/status says began {began}")
    return began


def s_crash() -> tuple[str, dict[str, Any]]:
    try:
        return _scenario()
    finally:
        stop_units()
        write_config(suite_config())


def _scenario() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    start_with(CONFIG)
    wait_for(lambda: len(_pids()) == 2, 120, 0.5)
    before, keeper = _pids(), keeper_pid()
    check(len(before) == 2 and keeper, f"two workers and a keeper never ran: {before}, keeper {keeper}")
    users = {}
    for name in ("alice", "bob", "carol"):
        _, _, cookie = browse(HOST, "/")
        check(cookie is not None, "no cookie from the front")
        check(browse(HOST, f"/login?name={name}", cookie)[0] == 200, f"{name} could not log in")
        for _ in range(3):
            seen = _counter(cookie)
        users[name] = (cookie, seen["count"], seen["worker"])
    time.sleep(2.5)  # (the running state is rewritten at most once a second: the users are in it)

    # 1. kill -9 under load.
    restarts0 = int(show("NRestarts")["NRestarts"])
    cursor = journal_cursor()
    load = Load().begin()
    time.sleep(3)
    main0 = _main()
    load.mark = time.monotonic()
    os.kill(main0, signal.SIGKILL)
    main1, to_ready = _ready_after(main0, 180)
    time.sleep(3)
    counts = load.halt()
    to_answer = load.first_after_mark
    check(int(show("NRestarts")["NRestarts"]) == restarts0 + 1, "systemd did not count one restart")
    began = _adopted_all(before, keeper, "kill -9")
    check(counts["refused"] == 0, f"connections refused across the crash: {counts}")
    check(counts["other"] == 0 and counts["cut"] <= 2, f"requests failed beyond the two in flight at the kill "
          f"(one per client): {counts}; {load.others[:6]}")
    for name, (cookie, count, worker) in users.items():
        now = _counter(cookie)
        check(now["count"] == count + 1 and now["worker"] == worker,
              f"{name}'s state: was {count} on {worker}, now {now}")
        users[name] = (cookie, now["count"], worker)
    journal = journal_since(cursor, (UNIT,))
    said = [ln for ln in journal.splitlines() if "after a crash" in ln or "crashed" in ln]
    check(said, f"the journal does not say the instance began after a crash:\n{journal[-3000:]}")
    say(f"    kill -9: active again in {to_ready:.1f}s, first answer {to_answer or 0:.1f}s after the kill; {counts}; "
        f"began {began}")

    # 2. A crash loop: three kills in a row, each before the new instance adopted anything.
    systemctl("reset-failed", UNIT)  # (the start limit counts from here: part 4 trips it on purpose)
    os.kill(main1, signal.SIGKILL)
    previous = main1
    for _ in range(2):  # (the next two, each as soon as systemd started it)
        previous = _kill_when_started(previous)
    main_loop, loop_ready = _ready_after(previous, 180)
    _adopted_all(before, keeper, "three crashes in a row")
    for name, (cookie, count, worker) in users.items():
        now = _counter(cookie)
        check(now["count"] == count + 1 and now["worker"] == worker,
              f"after the crash loop {name}'s state: was {count} on {worker}, now {now}")
    say(f"    crash loop: the 4th instance (pid {main_loop}) active {loop_ready:.1f}s after the 3rd kill, adopted both")

    # 3. A watchdog abort: hung (SIGSTOP) past WatchdogSec.
    watchdog = show("WatchdogUSec")["WatchdogUSec"]
    cursor = journal_cursor()
    stopped_at = time.monotonic()
    os.kill(main_loop, signal.SIGSTOP)
    main_wd, _ = _ready_after(main_loop, 240)
    wd_seconds = time.monotonic() - stopped_at
    _adopted_all(before, keeper, "a watchdog abort")
    systemd_said = run(["journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"--after-cursor={cursor}"]).stdout
    check("watchdog" in systemd_said.lower(), f"systemd's journal does not name the watchdog:\n{systemd_said[-2000:]}")
    say(f"    watchdog ({watchdog}): SIGSTOP → a new instance active {wd_seconds:.1f}s later, adopted both")

    # 4. The kernel's OOM killer, in elasticd's unit alone: its memory.max set under what it uses (the workers are the
    # keeper's unit's, out of its reach); set back once elasticd is killed, so that the next instance can run.
    oom_before = _oom_kills()
    using = int(read(ELASTICD_CGROUP / "memory.current"))
    cursor = journal_cursor()
    oomed_at = time.monotonic()
    systemctl("set-property", "--runtime", UNIT, f"MemoryMax={max(using // 4, 4 << 20)}")
    try:
        # (the kernel kills it there, in the write.) The limit goes as soon as the main process has: systemd restarts
        # the unit 2 s later (RestartSec=), and a limit still in place kills each next start too, until
        # systemd gives up (Debian 12, where its "killed by the OOM killer" line comes late, got there).
        killed = wait_for(lambda: _oom_kills() > oom_before or _main() != main_wd, 60, 0.1)
    finally:
        systemctl("set-property", "--runtime", UNIT, "MemoryMax=infinity")

    # Who killed it: the kernel's own line ("Memory cgroup out of memory: Killed process PID (elasticd)"), or
    # systemd's in the unit's journal ("... killed by the OOM killer"), which Debian 13's systemd writes a moment after
    # "Main process exited" and Debian 12's only when it reads the unit's memory.events before the restart (not when
    # the limit is lifted at once): either, waited for up to a minute.
    def said() -> str | None:
        unit = run(["journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"--after-cursor={cursor}"]).stdout
        kernel = run(["journalctl", "--no-pager", "-o", "cat", "-k", f"--after-cursor={cursor}"]).stdout
        if "killed by the oom killer" in unit.lower():
            return unit
        return kernel if f"Killed process {main_wd} (" in kernel else None

    systemd_said = wait_for(said, 60, 0.5)
    check(killed and systemd_said, f"no OOM kill of elasticd with its memory.max under its {using} bytes:\n"
          + run(["journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"--after-cursor={cursor}"]).stdout[-2000:])
    main_oom, _ = _ready_after(main_wd, 180)
    oom_seconds = time.monotonic() - oomed_at
    _adopted_all(before, keeper, "an OOM kill of elasticd")
    say(f"    OOM kill of elasticd alone (memory.max {max(using // 4, 4 << 20) >> 20} MiB of its "
        f"{using >> 20} MiB): a new instance active {oom_seconds:.1f}s later, adopted both")

    # 5. systemd gives up: kills in a row until it refuses to start elasticd again (six starts, 10-15 s each under
    # TCG). No instance lived to reach the keeper since the first kill: the keeper
    # stops the orphans once its bound (as long as systemd's start-limit interval) has passed since then.
    systemctl("reset-failed", UNIT)
    cursor = journal_cursor()
    previous, kills, first_kill = main_oom, 0, time.monotonic()
    while previous > 0 and kills < 12:
        with contextlib.suppress(ProcessLookupError):
            os.kill(previous, signal.SIGKILL)
        kills += 1
        previous = _next_instance(previous)
    gave_up_seconds = time.monotonic() - first_kill
    systemd_said = run(["journalctl", "--no-pager", "-o", "cat", "-u", UNIT, f"--after-cursor={cursor}"]).stdout
    check(show("ActiveState")["ActiveState"] == "failed" and "Start request repeated too quickly" in systemd_said,
          f"systemd did not give up after {kills} kills: {show('ActiveState', 'Result')}\n{systemd_said[-2000:]}")
    ended = wait_for(lambda: keeper_pid() == 0 and not _alive(before.values()), ORPHAN_BOUND + 60, 1.0)
    orphans_seconds = time.monotonic() - first_kill
    left = [cg for cg in (BASE.rglob("cgroup.procs") if BASE.exists() else []) if procs(cg.parent)]
    check(ended and not left, f"{ORPHAN_BOUND + 60}s after systemd gave up: keeper {keeper_pid()}, workers alive "
          f"{_alive(before.values())}, processes in {left}")
    keeper_said = run(["journalctl", "--no-pager", "-o", "cat", "-u", KEEPER_UNIT, "-n", "20"]).stdout
    check(f"no elasticd came back within {ORPHAN_BOUND}s: stopping its {len(before)} workers" in keeper_said,
          f"the keeper did not say why it stopped them:\n{keeper_said}")
    say(f"    systemd gave up {gave_up_seconds:.0f}s after the first of {kills} kills; the keeper had stopped the "
        f"orphans {orphans_seconds:.0f}s after it")
    return (f"kill -9 under load: 0 of 2 workers restarted, the keeper's pid kept, 3 users' counters continued on "
            f"their workers, {counts['refused']} connections refused, {counts['cut']} requests cut in flight, "
            f"{counts['200']} answered 200; active again {to_ready:.1f}s after the kill, first answer "
            f"{to_answer or 0:.1f}s; 3 crashes in a row: the 4th instance adopted both; watchdog abort (SIGSTOP): "
            f"adopted both {wd_seconds:.0f}s later; an OOM kill of elasticd alone: adopted both {oom_seconds:.0f}s "
            f"later; {kills} kills in a row: systemd gave up {gave_up_seconds:.0f}s after the first, the keeper had "
            f"stopped the orphans {orphans_seconds:.0f}s after it (bound {ORPHAN_BOUND}s), nothing left"), {
                "counts": counts, "to_ready": to_ready, "to_answer": to_answer, "began": began,
                "watchdog_seconds": wd_seconds, "oom_seconds": oom_seconds, "kills_to_give_up": kills,
                "gave_up_seconds": gave_up_seconds, "orphans_seconds": orphans_seconds}


def _next_instance(previous: int) -> int:
    """The pid of the instance systemd starts after ``previous``; -1 once the unit failed (systemd gave up)."""
    def seen() -> int | None:
        props = show("MainPID", "ActiveState")
        if props["ActiveState"] == "failed":
            return -1
        pid = int(props["MainPID"])
        return pid if pid not in (0, previous) else None

    found = wait_for(seen, 60, 0.05)
    check(found, f"no new elasticd within 60s of {previous}, and the unit did not fail: "
          f"{show('ActiveState', 'Result')}")
    return int(found)


def _oom_kills() -> int:
    try:
        return read_kv(ELASTICD_CGROUP / "memory.events").get("oom_kill", 0)
    except OSError:
        return -1


def _alive(pids: Any) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]
