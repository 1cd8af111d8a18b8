"""The enforcement scenarios (01-09): the .deb installs, and elasticd under systemd with Delegate=yes builds its
cgroup tree and holds each tenant to its CPU, memory, pids and I/O limits; reload, stop/start, the cgroup
modes, and the unit passes systemd-analyze verify.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    BASE,
    CGROOT,
    DEB_ROOTS,
    DEB_USERS,
    ELASTICD_CGROUP,
    KEEPER_SOCKET_UNIT,
    KEEPER_UNIT,
    SUITE_APPS,
    UNIT,
    WANTED,
    Failed,
    MiB,
    all_running,
    cgroups_under,
    check,
    disk_of,
    ensure_suite,
    front,
    http_get,
    is_active,
    journal_cursor,
    journal_since,
    keeper_pid,
    layout,
    leaf,
    main_pid,
    make_users,
    procs,
    read,
    read_kv,
    run,
    show,
    small_config,
    status,
    stop_units,
    subtree,
    suite_config,
    systemctl,
    tenant_user,
    timed,
    units_processes,
    wait_for,
    worker_pids,
    workers,
    workers_in_leaves,
    write_config,
)


def s_install(share: Path) -> tuple[str, dict[str, Any]]:
    debs = sorted(share.glob("elasticd_*.deb"))
    check(len(debs) == 1, f"expected one elasticd_*.deb in the share, found {[d.name for d in debs]}")
    # A copy readable by apt's unprivileged download user, so apt needs no "unsandboxed" fallback.
    deb = Path("/tmp") / debs[0].name
    shutil.copyfile(debs[0], deb)
    deb.chmod(0o644)
    # No network in the guest: the Depends are already installed from Debian in the image, and apt
    # resolves the package's relations against them (a missing or too old one fails here).
    result, seconds = timed(lambda: run(["apt-get", "install", "-y", "--no-install-recommends", str(deb)],
                                        timeout=600, env={"DEBIAN_FRONTEND": "noninteractive"}))
    check(result.returncode == 0, f"apt-get install failed ({result.returncode}):\n{result.stdout[-3000:]}"
          f"\n{result.stderr[-3000:]}")
    fields = run(["dpkg-query", "-W", "-f=${Version}\t${Status}\t${Depends}\t${Conffiles}", "elasticd"]).stdout
    version, state, depends, conffiles = fields.split("\t")
    check(state == "install ok installed", f"dpkg says elasticd is {state!r}")
    check("/etc/elastic.yaml" in conffiles, f"/etc/elastic.yaml is not a conffile: {conffiles!r}")
    for path in ("/usr/bin/elasticd", "/usr/bin/elasticctl", "/lib/systemd/system/elasticd.service",
                 f"/lib/systemd/system/{KEEPER_UNIT}", f"/lib/systemd/system/{KEEPER_SOCKET_UNIT}"):
        check(os.access(path, os.R_OK), f"{path} is missing")
    # The keeper's socket is enabled and listens; its service has no [Install] (the socket starts it).
    enabled = {unit: systemctl("is-enabled", unit).stdout.strip() for unit in (UNIT, KEEPER_SOCKET_UNIT, KEEPER_UNIT)}
    check(enabled == {UNIT: "enabled", KEEPER_SOCKET_UNIT: "enabled", KEEPER_UNIT: "static"},
          f"systemctl is-enabled says {enabled}")
    check(systemctl("is-active", "--quiet", KEEPER_SOCKET_UNIT).returncode == 0, f"{KEEPER_SOCKET_UNIT} is not active")
    deps = {}
    for name in re.findall(r"(python3-[a-z.-]+)", depends):
        deps[name] = run(["dpkg-query", "-W", "-f=${Version}", name]).stdout
    # The front the package runs is the compiled one (setup.py, built with Debian's mypyc), not the sources.
    front = run(["python3", "-c",
                 "import elasticd.front as f, elasticd.front.server as s; print(f.COMPILED, s.__file__)"])
    check(front.returncode == 0 and front.stdout.startswith("True "),
          f"the installed front is not the compiled one: {front.stdout.strip()} {front.stderr[-1000:]}")
    users = _shipped_config_runs_unprivileged()
    monitor = _monitor_answers()
    make_users()
    return (f"apt-get install {deb.name}: {seconds:.1f}s, elasticd {version}; Depends met by Debian's "
            + ", ".join(f"{k} {v}" for k, v in sorted(deps.items()))
            + f"; the front compiled ({front.stdout.split()[1]}); {', '.join(f'{k} {v}' for k, v in enabled.items())}"
            + f"; the shipped config runs: {users}; {monitor}",
            {"apt_output": result.stdout[-2000:], "depends": depends, "conffiles": conffiles.strip()})


def _monitor_answers() -> str:
    """The installed package serves the monitor page (its HTML is package data) and its state, the population
    asked of workers running as their tenants' users over the channel: every worker answers."""
    code, page = http_get(9464, "/monitor")
    check(code == 200 and b"elasticd monitor" in page, f"GET /monitor answered {code}: {page[:200]!r}")
    deadline = time.monotonic() + 30
    while True:
        code, body = http_get(9464, "/monitor/state?app=acme/shop")
        check(code == 200, f"GET /monitor/state answered {code}: {body[:300]!r}")
        state = json.loads(body)
        rows = state["population"]["rows"]
        workers = state["pool"]["groups"]["green"]["workers"]
        if all(w["announced"] for w in workers) and not any("error" in r for r in rows):
            break
        check(time.monotonic() < deadline, f"the population has error rows or silent workers: {rows} {workers}")
        time.sleep(0.5)
    return f"GET /monitor {len(page)} bytes, /monitor/state: {len(workers)} workers, every one answering"


def _shipped_config_runs_unprivileged() -> str:
    """The postinst made the example's system users, and the unit it started serves the shipped
    /etc/elastic.yaml with every worker running as its tenant's user."""
    for name in DEB_USERS:
        entry = run(["getent", "passwd", name]).stdout.strip().split(":")
        check(len(entry) == 7 and int(entry[2]) < 1000 and entry[6].endswith("nologin"),
              f"the postinst did not make system user {name}: getent says {entry}")
    for name, root in DEB_ROOTS:
        info = Path(root).stat()
        check(info.st_uid == pwd.getpwnam(name).pw_uid and stat.S_IMODE(info.st_mode) == 0o750,
              f"the postinst did not make {root} as {name}'s (0750): uid {info.st_uid}, mode "
              f"{stat.S_IMODE(info.st_mode):04o}")
    check(wait_for(is_active, 60, 0.5), f"{UNIT} is not active after the install")
    st, _ = all_running([("acme", "shop", "", 2), ("globex", "blog", "", 1)], timeout=90)
    seen = []
    for (tenant, app), pids in worker_pids(st).items():
        expected = tenant_user(tenant)
        shown = (st["tenants"][tenant].get("user") or {}).get("name")
        check(shown == expected, f"GET /v1/status shows tenant {tenant} as user {shown!r}, not {expected}")
        for pid in pids:
            uid = _uid_of(pid)
            check(uid == pwd.getpwnam(expected).pw_uid, f"worker {pid} of {tenant}/{app} runs as uid {uid}, "
                  f"not {expected}")
            cwd = os.readlink(f"/proc/{_command_of(pid)}/cwd")
            root = dict(DEB_ROOTS)[expected]
            check(cwd == root, f"worker {pid} of {tenant}/{app} runs in {cwd}, not its app root {root}")
            code, _ = front(f"{app}.localhost", "/")
            check(code == 200, f"{app}.localhost answered {code}")
        seen.append(f"{tenant}/{app} {len(pids)}x as {expected}")
    return ", ".join(seen)


def _uid_of(pid: int) -> int:
    """The uid the worker's command runs as: for an isolated tenant (every suite tenant), the command inside its
    sandbox, not bubblewrap's monitor (the pid elasticd started and shows, which stays root's, without capabilities)."""
    return int(next(ln for ln in read(Path(f"/proc/{_command_of(pid)}/status")).splitlines()
                    if ln.startswith("Uid:")).split()[1])


def _command_of(pid: int) -> int:
    from elasticd.supervisor.sandbox_host import command_pid  # (the .deb's: installed by scenario 00, after this loads)

    return command_pid(pid) or pid


def s_start() -> tuple[str, dict[str, Any]]:
    stop_units()
    write_config(suite_config())
    cursor = journal_cursor()
    result, seconds = timed(lambda: systemctl("start", UNIT))
    check(result.returncode == 0, f"systemctl start failed: {result.stderr.strip()}")
    props = show("ActiveState", "SubState", "MainPID", "StatusText", "Type")
    check(props["ActiveState"] == "active" and props["SubState"] == "running", f"unit is {props}")
    pid = int(props["MainPID"])
    check(pid in procs(ELASTICD_CGROUP), f"elasticd (pid {pid}) is not in its unit's cgroup {ELASTICD_CGROUP}: "
          f"it holds {procs(ELASTICD_CGROUP)}")
    # The keeper (the workers' parent): started by its socket for elasticd's connection, in <its unit>/keeper.
    keeper = keeper_pid()
    check(keeper and procs(BASE / "keeper") == [keeper], f"the keeper (pid {keeper}) is not alone in "
          f"{BASE / 'keeper'}: it holds {procs(BASE / 'keeper') if (BASE / 'keeper').exists() else 'nothing'}")
    # systemd marks a delegated cgroup with xattrs: trusted.delegate (what elasticd's delegation check reads)
    # and user.delegate (for a manager without CAP_SYS_ADMIN). 252 and 257 both set both.
    delegate = {}
    for name in ("trusted.delegate", "user.delegate"):
        try:
            delegate[name] = os.getxattr(BASE, name).decode()
        except OSError as exc:
            delegate[name] = f"absent ({exc.strerror})"
    check(set(delegate.values()) == {"1"}, f"the unit's cgroup is not marked delegated: {delegate}")
    st, late = all_running(SUITE_APPS)
    check(st["cgroups"]["enforced"], f"elasticd does not enforce: {st['cgroups']}")
    wanted = WANTED & set(read(CGROOT / "cgroup.controllers").split())
    inner = [BASE, BASE / "tenants"] + [BASE / "tenants" / t for t, *_ in SUITE_APPS]
    for node in inner:
        have = subtree(node)
        check(wanted <= have, f"{node}/cgroup.subtree_control is {sorted(have)}, expected {sorted(wanted)}")
        check(not procs(node), f"processes {procs(node)} sit in the inner node {node}")
    in_leaves = 0
    for tenant, app, _, n in SUITE_APPS:
        path = leaf(tenant, app)
        check(path.is_dir(), f"{path} does not exist")
        ws = workers(st, tenant, app)
        check(len(ws) == n and all(w["state"] == "running" for w in ws), f"{tenant}/{app} workers: {ws}")
        members = procs(path)
        uid = pwd.getpwnam(tenant_user(tenant)).pw_uid
        for w in ws:
            check(w["pid"] in members, f"worker {w['id']} (pid {w['pid']}) is not in {path} ({members})")
            check(_uid_of(w["pid"]) == uid, f"worker {w['id']} (pid {w['pid']}) runs as uid {_uid_of(w['pid'])}, "
                  f"not as {tenant_user(tenant)} ({uid})")
        in_leaves += len(ws)
    # Every process of the keeper's unit, wherever it is: only in keeper/, a leaf, or systemd's own .control.
    leaves = {leaf(t, a) for t, a, *_ in SUITE_APPS}
    for cg in cgroups_under(BASE):
        if procs(cg) and cg != BASE / "keeper" and cg not in leaves and not cg.name.startswith("."):
            raise Failed(f"processes {procs(cg)} in {cg}, which is neither keeper/ nor an app leaf")
    parents = {w["pid"]: _parent(w["pid"]) for t, a, *_ in SUITE_APPS for w in workers(st, t, a)}
    check(set(parents.values()) == {keeper}, f"the workers' parents are {parents}, not the keeper ({keeper})")
    # Each worker (the demo uses elasticd.worker) announces itself on the channel once, accepted at the first try.
    expected = sum(n for *_, n in SUITE_APPS)
    journal = wait_for(lambda: (text := journal_since(cursor)).count(" announced (pid ") >= expected and text, 20,
                       1.0) or journal_since(cursor)
    announced = journal.count(" announced (pid ")
    refused = [ln.strip() for ln in journal.splitlines() if "refused a peer" in ln]
    check(announced >= expected, f"{announced} of {expected} workers announced on the channel:\n{journal}")
    check(not refused, f"the channel refused workers at start ({len(refused)}): {refused[:3]}")
    waited = f" (+{late:.1f}s until all ran)" if late >= 1 else ""
    return (f"active {seconds:.1f}s after `systemctl start` (Type=notify, READY=1, status "
            f"\"{props['StatusText']}\"){waited}; elasticd pid {pid} in {UNIT}, its keeper pid {keeper} in "
            f"{KEEPER_UNIT}/keeper (socket-activated), the parent of every worker; {len(leaves)} leaves with "
            f"{in_leaves} workers, all in their leaf and each as its tenant's user; subtree_control "
            f"\"{' '.join(sorted(wanted))}\" at the base, tenants/ and each tenant, 0 processes in those "
            f"{len(inner)} inner nodes; "
            f"{', '.join(f'{k}={v}' for k, v in delegate.items())}; {announced} workers announced on the "
            "channel, 0 refused",
            {"layout": layout(), "status_text": props["StatusText"]})


def _parent(pid: int) -> int:
    return int(read(Path(f"/proc/{pid}/stat")).rsplit(")", 1)[1].split()[1])


def _usage(cgroup: Path) -> int:
    return read_kv(cgroup / "cpu.stat")["usage_usec"]


def s_cpu() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "cpu", leaf("cpu", "burn")
    check(read(tenant / "cpu.max") == "20000 100000", f"cpu.max is {read(tenant / 'cpu.max')!r}")
    stat0, leaf0 = read_kv(tenant / "cpu.stat"), read_kv(app / "cpu.stat")
    answer: dict[str, Any] = {}
    burn = threading.Thread(target=lambda: answer.update(r=front("burn.localhost", "/cpu?ms=5000", 120)))
    samples = [(time.monotonic(), _usage(app))]
    burn.start()
    while burn.is_alive():
        time.sleep(0.1)
        samples.append((time.monotonic(), _usage(app)))
    stat1, leaf1 = read_kv(tenant / "cpu.stat"), read_kv(app / "cpu.stat")
    code, body = answer["r"]
    check(code == 200, f"/cpu?ms=5000 answered {code}: {body[:300]!r}")
    # The burn's span: from the last idle sample before usage first rose to the last sample where it rose.
    rising = [i for i in range(1, len(samples)) if samples[i][1] > samples[i - 1][1]]
    check(rising, "the leaf's cpu.stat usage_usec never grew")
    begin, end = samples[rising[0] - 1][0], samples[rising[-1]][0]
    # The middle of it, 0.5 s in from each end: start-up and the response are not the steady state.
    inside = [s for s in samples if begin + 0.5 <= s[0] <= end - 0.5]
    check(len(inside) >= 2 and inside[-1][0] - inside[0][0] >= 2.0,
          f"burn too short to measure: {end - begin:.2f}s of rising usage")
    (t0, u0), (t1, u1) = inside[0], inside[-1]
    rate = (u1 - u0) / 1e6 / (t1 - t0)
    throttled = stat1["nr_throttled"] - stat0["nr_throttled"]
    leaf_throttled = leaf1.get("nr_throttled", 0) - leaf0.get("nr_throttled", 0)
    figure = (f"cpu {rate:.3f} s/s in the leaf over the middle {t1 - t0:.1f}s of a {end - begin:.1f}s burn "
              f"(limit 0.200 ±25%); nr_throttled +{throttled} in the tenant (where cpu.max is; leaf "
              f"+{leaf_throttled}), throttled_usec +{stat1['throttled_usec'] - stat0['throttled_usec']}")
    check(0.15 <= rate <= 0.25, f"usage grew by {rate:.3f} s/s, not 0.2 ±25%: {figure}")
    check(throttled > 0, f"nr_throttled did not grow: {figure}")
    return figure, {"rate": rate, "nr_throttled": throttled, "window_s": t1 - t0, "samples": len(samples),
                    "worker_answer": json.loads(body)}


def s_memory() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "mem", leaf("mem", "hog")
    check(read(tenant / "memory.max") == str(64 * MiB), f"memory.max is {read(tenant / 'memory.max')}")
    check(read(tenant / "memory.swap.max") == "0", f"memory.swap.max is {read(tenant / 'memory.swap.max')}")
    main = main_pid()
    (before,) = workers(status(), "mem", "hog")
    kills0 = read_kv(app / "memory.events")["oom_kill"]
    start = time.monotonic()
    code, body = front("hog.localhost", "/mem?mb=200", timeout=90)
    check(code != 200, f"the worker held 200 MB under a 64 MiB limit: {body[:300]!r}")
    kills = wait_for(lambda: read_kv(app / "memory.events")["oom_kill"] > kills0 and
                     read_kv(app / "memory.events")["oom_kill"], 10)
    check(kills, f"memory.events oom_kill stayed {kills0} in {app}")
    events = read_kv(tenant / "memory.events")

    def restarted() -> dict[str, Any] | None:
        (w,) = workers(status(), "mem", "hog")
        return w if w["state"] == "running" and w["pid"] not in (None, before["pid"]) else None

    after = wait_for(restarted, 60, 0.5)
    check(after, f"the worker was not restarted: {workers(status(), 'mem', 'hog')}")
    back = time.monotonic() - start
    check(after["pid"] in procs(app), f"the new worker (pid {after['pid']}) is not in {app}")
    check(is_active() and main_pid() == main, f"elasticd did not survive: active={is_active()}, "
          f"MainPID {main_pid()} (was {main})")
    kernel = [line for line in run(["dmesg"]).stdout.splitlines() if "oom-kill:" in line or
              "Memory cgroup out of memory" in line]
    peak = read(app / "memory.peak") if (app / "memory.peak").exists() else "n/a"
    # systemd sees the unit's oom_kill too; OOMPolicy= decides whether that stops elasticd (it must not).
    policy = show("OOMPolicy")["OOMPolicy"]
    return (f"oom_kill {kills0}→{kills} in the leaf (tenant: oom {events.get('oom', 0)}, oom_kill "
            f"{events.get('oom_kill', 0)}; memory.max 64 MiB, swap.max 0, leaf memory.peak "
            f"{int(peak) / MiB:.1f} MiB); the request got {code}; worker pid {before['pid']}→{after['pid']} "
            f"running again {back:.1f}s after the request (restarts {after['restarts']}); elasticd pid {main} "
            f"still active (OOMPolicy={policy})",
            {"kernel": kernel[-4:], "answer": body[:300].decode(errors="replace")})


def s_pids() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "pids", leaf("pids", "forker")
    check(read(tenant / "pids.max") == "32", f"pids.max is {read(tenant / 'pids.max')}")
    main = main_pid()
    # Where the kernel counts a refused fork differs by release, and the scenario pins both:
    # - 6.1 (bookworm) counts it in pids.events "max" of the forking task's own cgroup (the leaf), not of the
    #   ancestor whose pids.max refused it;
    # - from 6.11 (trixie's 6.12) "max" counts the times this cgroup's own limit was hit, propagated up (the
    #   tenant, where elasticd writes pids.max; the leaf below it shows 0), and pids.events.local is new.
    hierarchical = (tenant / "pids.events.local").exists()
    max0 = {cg: read_kv(cg / "pids.events").get("max", 0) for cg in (tenant, app)}
    code, body = front("forker.localhost", "/fork?n=100", timeout=180)
    check(code == 200, f"/fork?n=100 answered {code}: {body[:300]!r}")
    answer = json.loads(body)
    current = int(read(tenant / "pids.current"))
    leaf_hits, tenant_hits = (read_kv(cg / "pids.events").get("max", 0) - max0[cg] for cg in (app, tenant))
    hits = leaf_hits + tenant_hits
    figure = (f"{answer['started']} of 100 forks succeeded, {answer['failed']} failed "
              f"({answer['error']}); pids.current {current}/32, pids.events max +{leaf_hits} in the leaf "
              f"(+{tenant_hits} in the tenant; kernel {os.uname().release}: counted "
              f"{'where the limit is, pids.events.local present' if hierarchical else 'in the forking cgroup'})")
    check(answer["failed"] > 0 and answer["started"] < 32, f"the limit did not bite: {figure}")
    check(current <= 32 and hits > 0, f"pids accounting: {figure}")
    if hierarchical:
        check(tenant_hits > 0 and leaf_hits == 0, f"kernel ≥ 6.11 should count the refusals in the tenant: {figure}")
    else:
        check(leaf_hits > 0 and tenant_hits == 0, f"kernel 6.1 should count the refusals in the leaf: {figure}")
    check(is_active() and main_pid() == main, f"elasticd did not survive: {figure}")
    code_self, _ = front("forker.localhost", "/")
    code_other, _ = front("shop.localhost", "/")
    check(code_self == 200 and code_other == 200, f"the front stopped answering: forker {code_self}, "
          f"shop {code_other}")
    return figure + f"; elasticd pid {main} still active, the front still answers (200)", answer


def s_io() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant, app = BASE / "tenants" / "io", leaf("io", "writer")
    root = "/srv/io/writer"
    disk = disk_of(root)
    lines = [line for line in read(tenant / "io.max").splitlines() if line.split()[0] == disk]
    check(lines and "wbps=1048576" in lines[0].split() and "rbps=max" in lines[0].split(),
          f"io.max for {disk} is {lines}: {read(tenant / 'io.max')!r}")

    def written() -> int:
        for line in read(app / "io.stat").splitlines():
            if line.split()[0] == disk:
                return read_kv_line(line).get("wbytes", 0)
        return 0

    w0 = written()
    code, body = front("writer.localhost", f"/io?mb=8&path={root}", timeout=180)
    check(code == 200, f"/io?mb=8 answered {code}: {body[:300]!r}")
    answer = json.loads(body)
    grown = written() - w0
    figure = (f"io.max \"{lines[0]}\" on the disk under {root}; 8 MiB written (fsync per MiB) in "
              f"{answer['seconds']:.1f}s = {answer['mb_per_s']} MiB/s; the leaf's io.stat wbytes "
              f"+{grown / MiB:.1f} MiB")
    check(answer["seconds"] >= 6, f"the write was not held to 1 MiB/s: {figure}")
    check(grown >= 8 * MiB, f"the writes were not charged to the leaf: {figure}")
    return figure, answer


def read_kv_line(line: str) -> dict[str, int]:
    return {k: int(v) for k, _, v in (f.partition("=") for f in line.split()[1:]) if v.isdigit()}


def s_reload() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    acme = BASE / "tenants" / "acme"
    main = main_pid()
    pids0 = worker_pids(status())
    cpu0, mem0 = read(acme / "cpu.max"), read(acme / "memory.max")
    # New limits for acme; globex's group changes its environment (so its workers are replaced);
    # every other group is untouched.
    write_config(suite_config(acme_cpu="70%", acme_memory="320M", blog_greeting="hello again"))
    result, seconds = timed(lambda: systemctl("reload", UNIT))
    cpu1, mem1 = read(acme / "cpu.max"), read(acme / "memory.max")  # right when the reload returned
    check(result.returncode == 0, f"systemctl reload failed: {result.stderr.strip()}")
    check(cpu1 == "70000 100000" and mem1 == str(320 * MiB),
          f"when the reload returned: cpu.max {cpu1!r}, memory.max {mem1!r}")
    pids1 = worker_pids(status())
    kept = [k for k in pids0 if k != ("globex", "blog")]
    for key in kept:
        check(pids1[key] == pids0[key], f"{'/'.join(key)} workers {pids0[key]} became {pids1[key]}")
    check(set(pids1[("globex", "blog")]).isdisjoint(pids0[("globex", "blog")]),
          f"globex/blog's changed group was not replaced: {pids0[('globex', 'blog')]}")
    # A broken file: the reload fails, the unit stays active, nothing changes, the error is shown.
    cursor = journal_cursor()
    write_config(suite_config(acme_cpu="15O%", acme_memory="320M", blog_greeting="hello again"))
    bad, bad_seconds = timed(lambda: systemctl("reload", UNIT))
    error = '"15O%" is not a percentage'
    cpu2, mem2 = read(acme / "cpu.max"), read(acme / "memory.max")
    shown = systemctl("status", UNIT, "--no-pager", "-l", "-n", "40").stdout
    journal = journal_since(cursor)
    detail = {"status": shown, "journal": journal, "stderr": bad.stderr}
    check(bad.returncode != 0, f"systemctl reload of a broken file succeeded: {bad.stdout}")
    check(is_active() and main_pid() == main, "the unit did not stay active with the same elasticd")
    check(cpu2 == cpu1 and mem2 == mem1, f"a refused reload changed the files: cpu.max {cpu2}, memory.max {mem2}")
    check(worker_pids(status()) == pids1, "a refused reload changed workers")
    check(error in shown, f"`systemctl status elasticd` does not show {error}:\n{shown}")
    check(error in journal, f"the journal does not have {error}:\n{journal}")
    line = next(ln.strip() for ln in journal.splitlines() if error in ln)
    # Back to the suite's file, so the next scenario finds elasticd as ensure_suite() wants it.
    write_config(suite_config())
    restored = systemctl("reload", UNIT)
    check(restored.returncode == 0, f"reload back to the suite's file failed: {restored.stderr.strip()}")
    return (f"reload returned in {seconds:.1f}s with cpu.max {cpu0!r}→{cpu1!r}, memory.max {int(mem0) // MiB}M→"
            f"{int(mem1) // MiB}M already written; {len(kept)} untouched groups kept their "
            f"{sum(len(pids1[k]) for k in kept)} worker pids, globex/blog (env changed) was replaced; broken "
            f"file: reload exit {bad.returncode} after {bad_seconds:.1f}s, unit active, old values kept, "
            f"status and journal show \"{line}\"", detail)


def s_stop_start() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    before, workers_before = layout(), workers_in_leaves(status())
    main = main_pid()
    result, stop_s = timed(lambda: systemctl("stop", UNIT))
    check(result.returncode == 0, f"systemctl stop failed: {result.stderr.strip()}")
    check(not is_active(), "the unit is still active after stop")
    # The keeper ends on its own once elasticd stopped its workers (its socket stays, for the next start).
    keeper_gone = wait_for(lambda: keeper_pid() == 0, 30, 0.5)
    left = units_processes()
    check(keeper_gone and not left, f"processes left in the units' cgroups after stop: {left}")
    if BASE.exists():
        populated = read(BASE / "cgroup.events")
        check("populated 0" in populated, f"{BASE} still populated: {populated}")
        after_stop = "empty"
    else:
        after_stop = "removed by systemd"
    result, start_s = timed(lambda: systemctl("start", UNIT))
    check(result.returncode == 0, f"systemctl start failed: {result.stderr.strip()}")
    after, workers_after = layout(), workers_in_leaves(all_running(SUITE_APPS)[0])
    check(after == before, f"the cgroups differ after a restart:\nbefore {before}\nafter  {after}")
    check(workers_after == workers_before, f"workers per leaf before {workers_before}, after {workers_after}")
    new_main = main_pid()
    check(new_main != main and new_main in procs(ELASTICD_CGROUP), f"elasticd pid {new_main} not in {UNIT}")
    inner = [rel for rel, controls in after.items() if controls]
    return (f"stop in {stop_s:.1f}s left 0 processes (cgroup {after_stop}); start in {start_s:.1f}s rebuilt the "
            f"same layout: {len(after)} cgroups, the same subtree_control in its {len(inner)} inner nodes, "
            f"{sum(workers_after.values())} workers in their {len(workers_after)} leaves, elasticd pid "
            f"{main}→{new_main}, the keeper started anew by its socket (pid {keeper_pid()})",
            {"layout": after, "workers": workers_after})


DROPIN = Path(f"/run/systemd/system/{KEEPER_UNIT}.d/50-it-mode.conf")  # (the tenants' base is that unit's)


def _with_dropin(text: str | None) -> None:
    if text is None:
        DROPIN.unlink(missing_ok=True)
    else:
        DROPIN.parent.mkdir(parents=True, exist_ok=True)
        DROPIN.write_text(text)
    systemctl("daemon-reload")


def _refused_start(mode_config: str, dropin: str) -> tuple[str, float]:
    stop_units()
    _with_dropin(dropin)
    write_config(mode_config)
    cursor = journal_cursor()
    result, seconds = timed(lambda: systemctl("start", UNIT))
    journal = journal_since(cursor)
    # Restart=on-failure would try again every 2 s: stop that before looking further.
    stop_units()
    check(result.returncode != 0, f"elasticd started with mode required, {dropin.strip()!r}")
    refusals = [ln.strip() for ln in journal.splitlines() if "refusing to start" in ln]
    check(refusals, f"the journal does not say why it refused:\n{journal}")
    return refusals[0], seconds


def s_modes() -> tuple[str, dict[str, Any]]:
    # A read-only base: ProtectControlGroups=yes gives the keeper's unit a read-only /sys/fs/cgroup, so its own
    # (delegated, trusted.delegate=1) cgroup is not writable there, the real case of a hardened unit: the keeper
    # cannot put the workers in their leaves (elasticd's own unit could write, and is not the one that places them).
    readonly = "[Service]\nProtectControlGroups=yes\n"
    try:
        why_ro, ro_s = _refused_start(small_config("required"), readonly)
        check("not writable" in why_ro, f"the refusal does not say the base is not writable: {why_ro}")
        # auto on the same read-only base: one warning, then it serves (unenforced).
        write_config(small_config("auto"))
        cursor = journal_cursor()
        result = systemctl("start", UNIT)
        check(result.returncode == 0, f"mode auto did not start: {result.stderr.strip()}")
        code, body = front("web.localhost", "/")
        journal = journal_since(cursor)
        warnings = [ln.strip() for ln in journal.splitlines() if "NOT enforced" in ln]
        st = status()
        check(code == 200 and b"worker solo.web.main.1" in body, f"mode auto does not serve: {code} {body!r}")
        check(not st["cgroups"]["enforced"], f"elasticd claims to enforce on a read-only base: {st['cgroups']}")
        check(len(warnings) == 1, f"expected one warning, the journal has {len(warnings)}:\n{journal}")
        # Not delegated at all (a drop-in that turns Delegate= off): refused, naming that.
        why_nd, _ = _refused_start(small_config("required"), "[Service]\nDelegate=no\n")
        check("not delegated" in why_nd, f"the refusal does not say the cgroup is not delegated: {why_nd}")
        _with_dropin(None)
        why_bad, bad_s = _broken_file_start()
    finally:
        _with_dropin(None)
        stop_units()
    return (f"{KEEPER_UNIT} with ProtectControlGroups=yes (a read-only base), required: start failed after "
            f"{ro_s:.1f}s: \"{why_ro}\"; "
            f"auto there: 1 warning (\"{warnings[0][:90]}…\"), then served {code} unenforced; "
            f"{KEEPER_UNIT} with Delegate=no, required: \"{why_nd}\"; a broken file: start failed after {bad_s:.1f}s, "
            f"\"{why_bad}\", no keeper started", {"auto_journal": journal})


def _broken_file_start() -> tuple[str, float]:
    """A start on a broken file fails naming the key and its line (the unit has no ExecStartPre= check: elasticd
    checks its configuration before it does anything else), and the keeper is not started for it."""
    stop_units()
    write_config(small_config("auto").replace("{cpu: 50%}", "{cpu: lots}"))
    cursor = journal_cursor()
    result, seconds = timed(lambda: systemctl("start", UNIT))
    journal = journal_since(cursor)
    keeper = systemctl("is-active", KEEPER_UNIT).stdout.strip()
    stop_units()  # (Restart=on-failure tries again every 2 s)
    check(result.returncode != 0, "elasticd started on a broken file")
    said = [ln.strip() for ln in journal.splitlines() if "resources.cpu (line" in ln]
    check("invalid configuration" in journal and said, f"the journal does not name the broken key:\n{journal[-2000:]}")
    check(keeper != "active", f"{KEEPER_UNIT} was started for a broken file ({keeper})")
    return said[0][-120:], seconds


def s_verify() -> tuple[str, dict[str, Any]]:
    paths = [systemctl("show", unit, "--property=FragmentPath", "--value").stdout.strip()
             for unit in (UNIT, KEEPER_UNIT, KEEPER_SOCKET_UNIT)]
    result = run(["systemd-analyze", "verify", *paths])
    output = (result.stdout + result.stderr).strip()
    check(result.returncode == 0 and not output,
          f"systemd-analyze verify {' '.join(paths)}: exit {result.returncode}:\n{output}")
    version = run(["systemctl", "--version"]).stdout.splitlines()[0]
    return f"systemd-analyze verify {' '.join(paths)}: exit 0, no output ({version})", {}

