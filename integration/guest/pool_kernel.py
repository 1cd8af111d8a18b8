"""Scenario 13, the pool meets the kernel: a tenant at its cpu.max holds the pool's scale-ups (a new worker
would only share the same quota), a CPU-bound handler holding its event loop longer than ``hung_after`` is
busy, not hung, and raising the limit at run time lets the same load grow the pool.

The tenant has ``cpu: 50%`` and one app group with ``pool: {min_workers: 1, max_workers: 4}``,
``concurrency: 4``; ``server: {occupancy_interval: 1s, sample_interval: 1s, hung_after: 4s}`` (the pool reads the
sampler's samples of the tenant's cgroup; hung_after is short on purpose). Demo app workers. ``queue: {timeout:
60s}``: held at its quota, the one worker serves about 2.5 of these requests a second, so the users' requests wait
in the group's queue longer than its default 5 s; this tenant's operator would rather they waited than be refused.

1. Held: logged-in users keep arriving (two at once, then one 3 s after the previous one got in, up to 8;
   placement happens once, at the login) and burn CPU in their handlers (``/cpu?ms=200``), and one more user
   makes a single ``/cpu?ms=6000`` request, which holds its worker's event loop for 6 s, longer than
   hung_after. Over 25 s of this the group keeps its one worker (same pid, never a second one in the pool API,
   no scale-up), a ``held`` decision is counted whose numbers show the tenant's usage at its 0.5-core quota,
   the pool API shows ``held.resources == ["cpu"]``, ``elasticd_group_limit_bound{resource="cpu"}`` is 1, and
   no worker is called hung (the decision counts on /metrics, the decision journal, the systemd journal).
2. Raised: ``elasticctl limit capped --cpu 200%`` writes cpu.max "200000 100000" at once; with the same load
   and users still arriving (1.5 s apart, up to 16), the pool grows to 2 routable workers within 40 s,
   ``held`` is null again and the gauge 0, and still nothing is hung. Every request is answered 200.

The pool JSON is polled from the admin socket (GET /v1/apps/capped/web/pool, what ``elasticctl pool --json``
prints), which costs no Python start-up; ``elasticctl pool capped/web`` (plain text) is asked once, while held.
The run-time override is left in place: the next scenario's configuration restarts elasticd, which drops it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    BASE,
    Crowd,
    PoolWatch,
    browse,
    check,
    elasticctl,
    group_samples,
    journal_cursor,
    journal_since,
    pool_at_rest,
    pool_decision_counts,
    procs,
    read,
    read_kv,
    running,
    say,
    start_with,
    tenant_user,
    wait_for,
)

TENANT, APP, GROUP, HOST = "capped", "web", "main", "capped.localhost"
ROOT = Path("/srv", TENANT, APP)
QUOTA_CORES = 0.5
BURN_MS = 200
FIRST_USERS = 2
HELD_EVERY, HELD_USERS = 3.0, 8  # phase 1: a new user every 3 s, up to 8
RAISED_EVERY, RAISED_USERS = 1.5, 16  # phase 2: a new user every 1.5 s, up to 16
LONG_MS, LONG_AT = 6000, 6.0  # the long request: 6 s of CPU-bound handler, sent 6 s into the load
HUNG_AFTER = 4.0
HELD_LOAD = 25.0  # seconds of phase 1
GROW_TIMEOUT = 40.0  # seconds after the limit is raised for a second routable worker
MAX_WORKERS = 4

CONFIG = f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
  occupancy_interval: 1s
  sample_interval: 1s
  hung_after: {HUNG_AFTER:g}s
tenants:
  {TENANT}:
    user: {tenant_user(TENANT)}
    resources: {{cpu: 50%}}
    apps:
      {APP}:
        domains: [{HOST}]
        root: {ROOT}
        groups:
          {GROUP}:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 1, max_workers: {MAX_WORKERS}}}
            queue: {{timeout: 60s}}
"""

_pool = PoolWatch(TENANT, APP, GROUP)  # every decision seen is kept in _pool.journal
_running = running


def _counts() -> dict[str, int]:
    return pool_decision_counts(TENANT, APP, GROUP)


def _bound() -> dict[str, float]:
    """elasticd_group_limit_bound{tenant,app,group,resource} of this group, by resource."""
    return group_samples("elasticd_group_limit_bound", TENANT, APP, GROUP, "resource")


def _delta(after: dict[str, int], before: dict[str, int], kind: str) -> int:
    return after.get(kind, 0) - before.get(kind, 0)


def _decisions(kind: str, since: float, until: float | None = None) -> list[dict[str, Any]]:
    return [d for d in _pool.decisions()
            if d["decision"] == kind and d["at"] >= since and (until is None or d["at"] < until)]


def _story(began_wall: float) -> str:
    """The group's scale-ups, holds and hung verdicts so far, with the numbers behind each (for a failure)."""
    lines = []
    for d in _pool.decisions():
        if d["decision"] in ("scale-up", "held", "hung", "compaction", "retire"):
            numbers = {k: v for k, v in d["numbers"].items() if k in ("occupancies", "limits", "silent_seconds",
                                                                       "no_progress_seconds", "pid")}
            lines.append(f"  +{d['at'] - began_wall:.1f}s {d['decision']} {d['worker']}: {d['reason']} {numbers}")
    return "\n".join(lines) or "  (no scale-up, held or hung decision in the journal)"


def _brief(group: dict[str, Any]) -> dict[str, Any]:
    """The pool JSON without its journal, for details and failure messages."""
    return {"cpu_wall": group.get("cpu_wall"), "held": group.get("held"),
            "workers": [{k: w.get(k) for k in ("id", "pid", "state", "occupancy", "components")} |
                        {"users": len(w.get("sticky_users", []))} for w in group["workers"]]}


class LongRequest(threading.Thread):
    """One logged-in user making a single CPU-bound request of ``LONG_MS``, ``LONG_AT`` seconds after start()."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self._stop_event = stop
        code, body, uid = browse(HOST, "/")
        check(code == 200 and uid, f"the long request's user: GET / answered {code} {body[:200]!r}, cookie {uid}")
        code, body, _ = browse(HOST, "/login?name=long", uid)
        check(code == 200, f"the long request's user: /login answered {code} {body[:200]!r}")
        self.cookie = uid
        self.sent: float | None = None  # monotonic
        self.seconds: float | None = None
        self.code: int | None = None
        self.body = b""

    def run(self) -> None:
        if self._stop_event.wait(LONG_AT):
            return
        self.sent = time.monotonic()
        self.code, self.body, _ = browse(HOST, f"/cpu?ms={LONG_MS}", self.cookie, timeout=120)
        self.seconds = time.monotonic() - self.sent

    def answer(self) -> dict[str, Any]:
        try:
            return json.loads(self.body)
        except ValueError:
            return {}


def _hung_lines(cursor: str) -> tuple[list[str], list[str]]:
    """elasticd's journal since ``cursor``: its "is hung" lines and its "scale-up held" lines."""
    text = journal_since(cursor)
    lines = text.splitlines()
    return [ln for ln in lines if "is hung" in ln], [ln for ln in lines if "scale-up held" in ln]


def s_pool_limits() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    _pool.journal.clear()
    start_with(CONFIG)
    tenant_cg, leaf = BASE / "tenants" / TENANT, BASE / "tenants" / TENANT / APP

    def one_running() -> dict[str, Any] | None:
        g = _pool()
        return g if len(g["workers"]) == 1 and len(_running(g)) == 1 else None

    group = wait_for(one_running, 60, 0.5)
    check(group, f"the group did not come up with its one worker: {_pool()['workers']}")
    group = pool_at_rest(_pool)
    cpu_max = read(tenant_cg / "cpu.max")
    check(cpu_max == "50000 100000", f"the tenant's cpu.max is {cpu_max!r}, not '50000 100000' (cpu: 50%)")
    (first,) = group["workers"]
    check(first["pid"] in procs(leaf), f"the worker (pid {first['pid']}) is not in {leaf}: {procs(leaf)}")
    counts0, cursor = _counts(), journal_cursor()

    stop_long = threading.Event()
    long = LongRequest(stop_long)
    users = Crowd(HOST, f"/cpu?ms={BURN_MS}", first=FIRST_USERS, every=HELD_EVERY, limit=HELD_USERS)
    stat0 = read_kv(tenant_cg / "cpu.stat")
    began, began_wall = time.monotonic(), time.time()
    users.begin()
    long.start()
    most1 = 1
    seen1: set[tuple[str, int | None]] = {(first["id"], first["pid"])}
    held_polls = polls1 = 0
    first_held_poll: float | None = None
    try:
        # ---------------------------------------------------------------- phase 1: at the wall, held
        while time.monotonic() - began < HELD_LOAD:
            g = _pool()
            polls1 += 1
            most1 = max(most1, len(g["workers"]))
            seen1.update((w["id"], w["pid"]) for w in g["workers"])
            if g.get("held"):
                held_polls += 1
                if first_held_poll is None:
                    first_held_poll = time.monotonic() - began
                    say(f"    held {first_held_poll:.1f}s after the load started: {g['held'].get('reason')}")
            time.sleep(0.5)
        # The end of phase 1, still under load: the kernel's count, the pool, the gauge, the operator's view.
        stat1, held_s = read_kv(tenant_cg / "cpu.stat"), time.monotonic() - began
        at_held = _pool()
        bound1, counts1 = _bound(), _counts()
        text = elasticctl("pool", f"{TENANT}/{APP}")
        raised_wall = time.time()
        story = _story(began_wall)
        usage = (stat1["usage_usec"] - stat0["usage_usec"]) / 1e6 / held_s
        periods = stat1.get("nr_periods", 0) - stat0.get("nr_periods", 0)
        throttled = (stat1.get("nr_throttled", 0) - stat0.get("nr_throttled", 0)) / periods if periods else 0.0
        held_n = _delta(counts1, counts0, "held")
        hung1 = _delta(counts1, counts0, "hung")
        ups1 = _delta(counts1, counts0, "scale-up")
        kernel = f"cpu.stat over {held_s:.0f}s: {usage:.3f} cores, throttled in {throttled:.0%} of {periods} periods"
        check(most1 == 1 and len(seen1) == 1 and ups1 == 0,
              f"at its cpu.max the group did not keep its one worker: up to {most1} workers in the pool API, "
              f"(id, pid) seen {sorted(seen1, key=str)}, {ups1} scale-ups counted; {kernel}\n{story}")
        check(hung1 == 0 and not _decisions("hung", began_wall),
              f"{hung1} hung decision(s) counted in phase 1 (a CPU-bound handler is busy, not hung):\n{story}")
        check(long.code is not None, f"the {LONG_MS} ms request sent {LONG_AT:g}s into the load had no answer "
              f"after {held_s:.0f}s of load")
        long_answer = long.answer()
        check(long.code == 200 and long_answer.get("ms", 0) >= LONG_MS,
              f"the {LONG_MS} ms request answered {long.code} {long.body[:200]!r} in {long.seconds}s")
        check(held_n >= 1, f"no held decision counted in {held_s:.0f}s at the tenant's cpu.max ({kernel}); "
              f"counts {counts1} (before {counts0}); pool {_brief(at_held)}\n{story}")
        helds = _decisions("held", began_wall, raised_wall)
        check(helds, f"{held_n} held decision(s) counted but none in the pool API's journal:\n{story}")
        for d in helds:
            cpu = d["numbers"].get("limits", {}).get("cpu") or {}
            check(cpu.get("quota_cores") == QUOTA_CORES and 0.4 <= (cpu.get("usage_cores") or 0) <= 0.6
                  and ((cpu.get("usage_share") or 0) >= 0.9 or (cpu.get("throttled_share") or 0) > 0.5),
                  f"a held decision's numbers do not show usage at the {QUOTA_CORES}-core quota: {d['numbers']} "
                  f"({kernel})")
        held_now = at_held.get("held")
        check(held_now and held_now.get("resources") == ["cpu"],
              f"the pool API's held at the end of phase 1 is {held_now!r} (held in {held_polls} of {polls1} "
              f"polls, first at {first_held_poll}s); {kernel}\n{story}")
        check(at_held.get("cpu_wall") == QUOTA_CORES, f"cpu_wall is {at_held.get('cpu_wall')} under a "
              f"{QUOTA_CORES}-core cpu.max")
        check(bound1.get("cpu") == 1, f"elasticd_group_limit_bound of {TENANT}/{APP}/{GROUP}: {bound1}, not cpu 1 "
              f"while held")
        held_text = text.stdout
        shows_hold = text.returncode == 0 and "held" in held_text.lower()
        check(text.returncode == 0, f"elasticctl pool {TENANT}/{APP} exited {text.returncode}: "
              f"{text.stderr.strip()[-500:]}")

        # ---------------------------------------------------------------- phase 2: the limit raised
        raise_started = time.monotonic()
        raised = elasticctl("limit", TENANT, "--cpu", "200%", "--json")
        raised_at, raised_wall = time.monotonic(), time.time()
        cpu_max2 = read(tenant_cg / "cpu.max")
        check(raised.returncode == 0, f"elasticctl limit {TENANT} --cpu 200% exited {raised.returncode}: "
              f"{raised.stderr.strip()[-500:]}")
        check(cpu_max2 == "200000 100000", f"cpu.max is {cpu_max2!r} when `elasticctl limit {TENANT} --cpu 200%` "
              "returned")
        users.every, users.limit = RAISED_EVERY, RAISED_USERS
        grown: dict[str, Any] | None = None
        most2 = 1
        while time.monotonic() - raised_at < GROW_TIMEOUT:
            g = _pool()
            most2 = max(most2, len(g["workers"]))
            if len(_running(g)) >= 2:
                grown = g
                break
            time.sleep(0.5)
        grow_s = time.monotonic() - raised_at
        bound2, counts2 = _bound(), _counts()
        story = _story(began_wall)
        check(grown is not None, f"{GROW_TIMEOUT:.0f}s after the limit was raised the group has "
              f"{len(_running(_pool()))} routable worker(s) (up to {most2} in all): {_brief(_pool())}\n{story}")
        assert grown is not None
        new = [w for w in _running(grown) if w["id"] != first["id"]]
        say(f"    {new[0]['id']} (pid {new[0]['pid']}) routable {grow_s:.1f}s after the limit was raised")
        outside = [w["pid"] for w in _running(grown) if w["pid"] not in procs(leaf)]
        check(not outside, f"routable workers' pids {outside} are not in {leaf}")
        kept = [w for w in grown["workers"] if w["id"] == first["id"]]
        check(kept and kept[0]["pid"] == first["pid"], f"the first worker (pid {first['pid']}) is now {kept}")
        # The hold at 0.5 cores is over. Another may have begun already: the burst grows the group at once, and
        # three workers burning can reach 90 % of the raised quota too — then it names that quota (2 cores).
        again = grown.get("held")
        check(again is None or again["limits"]["cpu"]["quota_cores"] == 2.0,
              f"with cpu.max raised the pool API still shows the old hold: {again}")
        held_at_two = [h for h in (again, _pool().get("held")) if h and h["limits"]["cpu"]["quota_cores"] == 2.0]
        check(bound2.get("cpu") == 0 or held_at_two,
              f"elasticd_group_limit_bound once grown: {bound2}, with no hold at the raised quota ({again})")
        check(grown.get("cpu_wall") == 1.0, f"cpu_wall is {grown.get('cpu_wall')} under a 2-core cpu.max")
        check(len(grown["workers"]) <= MAX_WORKERS, f"{len(grown['workers'])} workers, over max_workers")
    finally:
        stop_long.set()
        users.halt()
        long.join(120)
    load_s = time.monotonic() - began
    counts3 = _counts()
    story = _story(began_wall)
    hung_logged, held_logged = _hung_lines(cursor)
    hung = _delta(counts3, counts0, "hung")
    check(hung == 0 and not _decisions("hung", began_wall) and not hung_logged,
          f"a worker was called hung: {hung} counted, journal {hung_logged[:5]}\n{story}")
    check(not users.refused, f"users who could not log in: {users.refused}")
    failed, total = users.failed(), users.total()
    check(not failed, f"requests under load that did not answer 200: {failed} of {total}")
    ups = _delta(counts3, counts0, "scale-up")
    first_up = next((d["at"] - raised_wall for d in _decisions("scale-up", raised_wall)), None)
    cpu1 = helds[0]["numbers"]["limits"]["cpu"]
    decided = f"scale-up decided {first_up:.1f}s and " if first_up is not None else ""
    held_arrivals = sum(1 for t in users.arrived if t <= held_s)
    figure = (f"cpu.max 50000 100000: {held_arrivals} users arriving in {held_s:.0f}s (at "
              f"{', '.join(f'{t:g}' for t in users.arrived[:held_arrivals])}s) burning /cpu?ms={BURN_MS} "
              f"and one /cpu?ms={LONG_MS} (200 in {long.seconds:.1f}s, {long_answer.get('cpu_ms')} ms CPU; "
              f"hung_after {HUNG_AFTER:g}s, not hung): held {held_n}x (first at "
              f"{helds[0]['at'] - began_wall:.1f}s: {cpu1['usage_cores']:.3f} of {cpu1['quota_cores']:g} cores, "
              f"throttled {cpu1['throttled_share']}), {kernel} ({usage / QUOTA_CORES:.0%} of the quota); "
              f"1 worker for {held_s:.0f}s (pid kept, 0 scale-ups, 0 hung); elasticctl pool "
              f"{'shows' if shows_hold else 'does not show'} the hold. `elasticctl limit {TENANT} --cpu 200%` "
              f"({raised_at - raise_started:.1f}s): {decided}a 2nd worker routable {grow_s:.1f}s after, held "
              f"cleared, gauge 0, {len(grown['workers'])} workers ({ups} scale-ups); {total} requests in "
              f"{load_s:.0f}s, all 200, {users.users() - held_arrivals} more users arrived after the raise, 0 hung")
    details = {"held_pool": {**_brief(at_held), "decision_counts": at_held.get("decision_counts")},
               "grown_pool": _brief(grown), "held_decisions": helds,
               "elasticctl_pool_text": held_text, "elasticctl_pool_shows_hold": shows_hold,
               "limit_reply": raised.stdout[-2000:], "cpu_stat": {"before": stat0, "after": stat1},
               "usage_cores": round(usage, 4), "throttled_share": round(throttled, 4),
               "held_polls": f"{held_polls} of {polls1}", "first_held_poll_s": first_held_poll,
               "bound": {"held": bound1, "grown": bound2}, "counts": {"before": counts0, "held": counts1,
                                                                     "grown": counts2, "end": counts3},
               "long": {"code": long.code, "seconds": long.seconds, "answer": long_answer},
               "journal_held_lines": held_logged[:10], "codes": {str(k): v for k, v in users.codes.items()},
               "arrived_s": dict(zip(users.names, users.arrived, strict=True)), "grow_s": grow_s, "story": story}
    return figure, details
