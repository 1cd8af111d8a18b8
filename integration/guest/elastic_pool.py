"""Scenario 12, the elastic pool (issue #7): under real CPU pressure, in a tenant whose cgroup has a CPU limit, the
pool grows; when the pressure stops it compacts back, with every user still served.

The tenant has ``cpu: 200%`` (the guest has 2 CPUs) and one app group with ``pool: {min_workers: 1,
max_workers: 3}``; ``server.occupancy_interval: 1s`` keeps it quick under TCG. Placement happens once, at a
user's login, so the load spreads onto new workers only through users who arrive while it runs: two logged-in
users (the front's ``elastic_uid`` cookie, ``/login?name=uN``) start burning CPU with ``/cpu?ms=80``, and one
more logs in and burns 1.5 s after the previous one got in, up to 8. ``elasticctl pool elastic/web --json`` is
asked at the two moments that matter (grown, compacted); in between the same JSON is polled from the admin
socket (GET /v1/apps/elastic/web/pool), which costs no Python start-up and so does not itself compete for the
two CPUs being measured."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import (
    BASE,
    Crowd,
    PoolWatch,
    browse,
    check,
    elasticctl_json,
    pool_at_rest,
    pool_decision_counts,
    procs,
    read,
    running,
    say,
    start_with,
    tenant_user,
    wait_for,
)

TENANT, APP, GROUP, HOST = "elastic", "web", "main", "pool.localhost"
ROOT = Path("/srv", TENANT, APP)
FIRST_USERS = 2  # logged in when the load starts
ARRIVE_EVERY = 1.5  # seconds between two new users' logins, while the load runs
USERS = 8  # in all
BURN_MS = 80
GROW_TIMEOUT = 60.0  # seconds of load to reach max_workers (≥ 2 is the assertion; 3 is the goal)
HOLD_AT_MAX = 3.0  # seconds the load continues once the group is at max_workers and every user arrived
# Short of max_workers: once every user arrived and the group grew, the load stops after this long without a new
# worker (placement happens once, so no new user means no new spread of the load).
SETTLED = 25.0
COMPACT_TIMEOUT = 120.0
MAX_WORKERS = 3

CONFIG = f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
  occupancy_interval: 1s
tenants:
  {TENANT}:
    user: {tenant_user(TENANT)}
    resources: {{cpu: 200%}}
    apps:
      {APP}:
        domains: [{HOST}]
        root: {ROOT}
        groups:
          {GROUP}:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 1, max_workers: {MAX_WORKERS}, reception_threshold: 0.5,
                    admission_threshold: 0.8, compaction_margin: 1.5}}
"""


_pool = PoolWatch(TENANT, APP, GROUP)  # every decision seen is kept in _pool.journal
_running = running


def _decision_counts() -> dict[str, int]:
    """elasticd_pool_decisions_total{tenant,app,group,decision} of this group, from /metrics: counts that the
    bounded journal (the last 50 decisions) cannot lose."""
    return pool_decision_counts(TENANT, APP, GROUP)


def _users_by_worker(group: dict[str, Any]) -> dict[str, list[str]]:
    return {w["id"]: sorted(u["login"] or u["user"] for u in w["sticky_users"]) for w in group["workers"]}


def _story(began_wall: float) -> str:
    """The group's scale-ups, compactions and retires so far, with the numbers behind each (for a failure)."""
    lines = []
    for d in _pool.decisions():
        if d["decision"] in ("scale-up", "held", "compaction", "retire", "hung"):
            numbers = {k: v for k, v in d["numbers"].items() if k in ("occupancies", "C", "O", "H", "trigger",
                                                                       "drained_occupancy", "users", "limits")}
            lines.append(f"  +{d['at'] - began_wall:.1f}s {d['decision']} {d['worker']}: {d['reason']} {numbers}")
    return "\n".join(lines)


def s_pool() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    _pool.journal.clear()
    start_with(CONFIG)

    def one_running() -> dict[str, Any] | None:
        g = _pool()
        return g if len(g["workers"]) == 1 and len(_running(g)) == 1 else None

    group = wait_for(one_running, 60, 0.5)
    check(group, f"the group did not come up with its one worker: {_pool()['workers']}")
    group = pool_at_rest(_pool)
    leaf, tenant_cg = BASE / "tenants" / TENANT / APP, BASE / "tenants" / TENANT
    check(read(tenant_cg / "cpu.max") == "200000 100000", f"cpu.max is {read(tenant_cg / 'cpu.max')!r}")
    (first,) = group["workers"]
    counts0 = _decision_counts()

    users = Crowd(HOST, f"/cpu?ms={BURN_MS}", first=FIRST_USERS, every=ARRIVE_EVERY, limit=USERS)
    began, began_wall = time.monotonic(), time.time()
    users.begin()
    first_new: float | None = None
    at_max: float | None = None
    last_change = 0.0  # seconds after the load started when the last user arrived or a new worker became routable
    most = 1
    # Each worker when first seen routable: (seconds after the load started, pid, whether the pid was in the
    # app's leaf at that moment).
    routable: dict[str, tuple[float, int, bool]] = {first["id"]: (0.0, first["pid"], first["pid"] in procs(leaf))}
    gone: dict[str, float] = {}  # worker → seconds after the load started when it left the group
    try:
        deadline = began + GROW_TIMEOUT
        while time.monotonic() < deadline:
            group = _pool()
            now = time.monotonic() - began
            running = _running(group)
            most = max(most, len(group["workers"]))
            for w in running:
                if w["id"] not in routable:
                    routable[w["id"]] = (now, w["pid"], w["pid"] in procs(leaf))
                    last_change = now
                    say(f"    {w['id']} (pid {w['pid']}) routable {now:.1f}s after the load started")
            ids = {w["id"] for w in group["workers"]}
            for wid in routable:
                if wid not in ids and wid not in gone:
                    gone[wid] = now
                    say(f"    {wid} left the group {now:.1f}s after the load started, under load")
            if first_new is None and len(routable) > 1:
                first_new = now
            if len(running) >= MAX_WORKERS and at_max is None:
                at_max = now
            if users.users() < USERS:
                last_change = now
            else:
                done_at_max = at_max is not None and now >= at_max + HOLD_AT_MAX
                if done_at_max or (len(routable) >= 2 and now >= last_change + SETTLED):
                    break
            time.sleep(0.5)
        # The operator's view at the peak.
        grown = elasticctl_json("pool", f"{TENANT}/{APP}")["groups"][GROUP]
    finally:
        users.halt()
    arrived = users.users()
    spread = _users_by_worker(grown)
    stopped = time.monotonic()
    load_s = stopped - began
    counts1 = _decision_counts()
    scale_ups = counts1.get("scale-up", 0) - counts0.get("scale-up", 0)
    under_load = counts1.get("compaction", 0) - counts0.get("compaction", 0)
    story = _story(began_wall)
    check(first_new is not None, f"the group never grew in {GROW_TIMEOUT:.0f}s of load:\n{story}")
    check(most >= 2 and len(routable) >= 2, f"the group grew to {most} workers:\n{story}")
    outside = [(wid, pid) for wid, (_, pid, inside) in routable.items() if not inside]
    check(not outside, f"workers {outside} were not in {leaf} when they became routable")
    check(most <= MAX_WORKERS, f"the group had {most} workers, over max_workers {MAX_WORKERS}")
    hung = counts1.get("hung", 0) - counts0.get("hung", 0)  # a replaced hung worker is a new one too
    check(scale_ups + hung >= len(routable) - 1, f"{scale_ups} scale-ups and {hung} hung replacements for "
          f"{len(routable)} workers:\n{story}")
    new_pids = sorted(pid for wid, (_, pid, _) in routable.items() if wid != first["id"])

    # The load has stopped: the group compacts back to min_workers, one worker at a time.
    def compacted() -> dict[str, Any] | None:
        g = _pool()
        return g if len(g["workers"]) == 1 and len(_running(g)) == 1 else None

    shrunk = wait_for(compacted, COMPACT_TIMEOUT, 0.5)
    compact_s = time.monotonic() - stopped
    story = _story(began_wall)
    check(shrunk, f"the group did not compact back to 1 worker within {COMPACT_TIMEOUT:.0f}s: "
          f"{[(w['id'], w['state'], w['occupancy']) for w in _pool()['workers']]}\n{story}")
    final = elasticctl_json("pool", f"{TENANT}/{APP}")["groups"][GROUP]
    counts2 = _decision_counts()
    compactions = counts2.get("compaction", 0) - counts0.get("compaction", 0)
    retires = counts2.get("retire", 0) - counts0.get("retire", 0)
    check(len(final["workers"]) == 1, f"elasticctl pool shows {len(final['workers'])} workers after compaction")
    hung = counts2.get("hung", 0) - counts0.get("hung", 0)
    check(compactions + hung >= len(routable) - 1 and retires + hung >= len(routable) - 1,
          f"{compactions} compactions and {retires} retires for {len(routable)} → 1 workers:\n{story}")
    survivor = final["workers"][0]
    members = procs(leaf)
    check(survivor["pid"] in members, f"the survivor (pid {survivor['pid']}) is not in {leaf}")
    lingering = [pid for wid, (_, pid, _) in routable.items() if wid != survivor["id"] and pid in members]
    check(not lingering, f"retired workers' pids {lingering} are still in {leaf}")
    answers = [browse(HOST, "/", cookie) for cookie in users.cookies]
    bad = [(i, code, body[:120]) for i, (code, body, _) in enumerate(answers)
           if code != 200 or f"worker {TENANT}.{APP}.{GROUP}.".encode() not in body]
    check(not bad, f"users not served after the compaction: {bad}")
    failed, total = users.failed(), users.total()
    check(not users.refused, f"users who could not log in under load: {users.refused}")
    check(not failed, f"requests under load that did not answer 200: {failed} of {total}")
    check(arrived == USERS, f"only {arrived} of {USERS} users arrived in {load_s:.0f}s of load (at {users.arrived}s)")
    first_decision = next((d["at"] - began_wall for d in _pool.decisions()
                           if d["decision"] == "scale-up"), None)
    decided = f"decided {first_decision:.1f}s, " if first_decision is not None else ""
    churn = ""
    if under_load:
        # The ledger's numbers of each compaction decided before the load stopped.
        early = [f"{d['worker']} {gone[d['worker']] - routable[d['worker']][0]:.1f}s after it became routable, "
                 f"H {d['numbers']['H']:.2f} over {d['numbers']['trigger']:.2f}"
                 for d in _pool.decisions()
                 if d["decision"] == "compaction" and d["worker"] in gone and d["worker"] in routable]
        churn = f"; {under_load} compaction(s) while the load still ran ({'; '.join(early) or 'see details'})"
    if hung:
        churn += f"; {hung} worker(s) replaced as hung"
    on = ", ".join(f"{len(names)} on {wid.rsplit('.', 1)[-1]}" for wid, names in spread.items())
    peak = f" at {at_max:.1f}s" if at_max is not None else f" (none more in {SETTLED:.0f}s)"
    figure = (f"tenant cpu.max 200000 100000 (2 CPUs), {USERS} logged-in users arriving (at "
              f"{', '.join(f'{t:g}' for t in users.arrived)}s), burning /cpu?ms={BURN_MS}: first "
              f"scale-up {decided}its worker routable {first_new:.1f}s after the load started; grew to {most} "
              f"workers{peak} (max_workers "
              f"{MAX_WORKERS} held, {scale_ups} scale-ups; users at the peak: {on}); new pids {new_pids} in "
              f"{leaf.relative_to(BASE)} when "
              f"they became routable{churn}; load stopped after {load_s:.0f}s ({total} requests, all 200): back to "
              f"1 worker {compact_s:.1f}s later ({compactions} compactions, {retires} retires in all); all {USERS} "
              f"users answered 200 afterwards")
    details = {"grown": grown, "final": final, "codes": {str(k): v for k, v in users.codes.items()},
               "arrived_s": dict(zip(users.names, users.arrived, strict=True)), "users_at_peak": spread,
               "routable": routable, "gone": gone, "first_new_s": first_new, "at_max_s": at_max,
               "compact_s": compact_s, "story": story, "counts": counts2}
    return figure, details
