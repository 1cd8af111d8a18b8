"""Scenario 14, issue #11 (tenants as Unix users): a hostile tenant's worker tries to break out and the kernel
says no to every try, while elasticd and the other tenant go on as before.

This proves the users alone: both tenants say ``isolation: {enabled: false}``, so the worker sees the host as
elasticd does and each refusal is the kernel's permission check. The view of its own that a tenant gets by default
(issue #28) is scenario 20's (view.py).

Two throw-away system users, ``eltevil`` and ``eltgood`` (``useradd --system --user-group --no-create-home``;
reused when they exist, removed at the end). Two tenants, each with its ``user:``:

- ``evil`` (``resources: {cpu: 50%}``), app ``app`` on evil.localhost, root /srv/evil/app (root's, 0755), whose
  one worker is hostile_app.py (copied beside this module into the root): ``GET /attempts`` makes each attempt
  at that moment and answers how each ended, with its own /proc/self/status, parent, cgroup, cwd, environment;
- ``good``, app ``app`` on good.localhost, root /srv/good/app (eltgood's, 0755, holding a file), the demo app.

The attempts, every one of which must fail with the kernel's EACCES or EPERM: write ``max 100000`` into its own
tenant's cpu.max; put its pid into ``<base>/keeper/cgroup.procs``; read /etc/shadow; create a file in /etc;
SIGTERM its parent (elasticd's keeper) and elasticd; create a file in the good tenant's root; connect to the good
tenant's worker socket; setuid(0); SIGTERM the good tenant's worker; read that worker's /proc/<pid>/environ (its
channel token).

Then, measured from outside: the worker runs as eltevil with no supplementary groups, no capability (CapEff,
CapPrm, CapBnd, CapAmb 0), NoNewPrivs 1, in /srv/evil/app, as a child of elasticd's keeper (the main process of
elasticd-keeper.service, started by its socket), in its leaf, with a clean environment; elasticd is active with the
same MainPID, the keeper with the same pid; the tenant's cpu.max is unchanged; no new file in /etc or
/srv/good/app; the good worker still answers 200 with the same pid; its socket directory is 0700 and eltgood's;
``elasticctl status`` shows each tenant's user; elasticd's journal has no "runs as root" warning and no refused
channel peer (the good demo announces itself as eltgood).

The end: elasticd is stopped (the users' workers must be gone before userdel), the suite's file written back
(the next scenario starts elasticd on its own config), and the two users removed, best effort.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from common import (
    BASE,
    KEEPER_UNIT,
    UNIT,
    Failed,
    check,
    elasticctl,
    ensure_user,
    front,
    is_active,
    journal_cursor,
    journal_since,
    keeper_pid,
    main_pid,
    procs,
    read,
    remove_users,
    say,
    start_with,
    status,
    suite_config,
    systemctl,
    wait_for,
    workers,
    write_config,
)

HERE = Path(__file__).resolve().parent
USERS = {"evil": "eltevil", "good": "eltgood"}
APP, GROUP = "app", "main"
EVIL_ROOT, GOOD_ROOT = Path("/srv/evil/app"), Path("/srv/good/app")
HOSTILE = EVIL_ROOT / "hostile.py"
RUNTIME_DIR = Path("/run/elasticd")
GOOD_SOCKET = RUNTIME_DIR / "workers" / "good" / f"{APP}.{GROUP}.1.sock"
MARK = "elt-hostile"  # hostile_app.MARK: the prefix of the files it tries to create
EVIL_CPU_MAX = "50000 100000"  # cpu: 50%
DENIED = {"EACCES", "EPERM"}
WORKER_ENV = {"PATH", "LANG", "HOME", "USER", "LOGNAME"}  # what a worker keeps of elasticd's environment
# Not elasticd's: systemd-cat (systemd 257, not 252) tells the command it runs that its stdout/stderr are that journal
# stream (device:inode of the worker's own stream), as systemd does for a service.
STREAM_ENV = {"JOURNAL_STREAM"}

CONFIG = f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
tenants:
  evil:
    user: {USERS['evil']}
    resources: {{cpu: 50%}}
    apps:
      {APP}:
        domains: [evil.localhost]
        root: {EVIL_ROOT}
        groups:
          {GROUP}:
            command: ["/usr/bin/python3", "{HOSTILE}"]
            env:
              HOSTILE_GOOD_ROOT: "{GOOD_ROOT}"
              HOSTILE_GOOD_SOCKET: "{GOOD_SOCKET}"
              HOSTILE_GOOD_USER: "{USERS['good']}"
            pool: {{min_workers: 1, max_workers: 1}}
    isolation: {{enabled: false}}
  good:
    user: {USERS['good']}
    isolation: {{enabled: false}}
    apps:
      {APP}:
        domains: [good.localhost]
        root: {GOOD_ROOT}
        groups:
          {GROUP}:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{DEMO_GREETING: "hello from good"}}
            pool: {{min_workers: 1, max_workers: 1}}
"""


def _prepare() -> dict[str, Any]:
    users = {tenant: ensure_user(name) for tenant, name in USERS.items()}
    for top in (EVIL_ROOT.parent, GOOD_ROOT.parent):
        top.mkdir(exist_ok=True)
        os.chown(top, 0, 0)
        top.chmod(0o755)
    for root in (EVIL_ROOT, GOOD_ROOT):
        root.mkdir(exist_ok=True)
        for leftover in root.glob(f"{MARK}*"):
            leftover.unlink()
    os.chown(EVIL_ROOT, 0, 0)
    EVIL_ROOT.chmod(0o755)
    shutil.copyfile(HERE / "hostile_app.py", HOSTILE)
    os.chown(HOSTILE, 0, 0)
    HOSTILE.chmod(0o644)
    good = users["good"][0]
    (GOOD_ROOT / "index.html").write_text("the good tenant's own file\n")
    os.chown(GOOD_ROOT / "index.html", good.pw_uid, good.pw_gid)
    os.chown(GOOD_ROOT, good.pw_uid, good.pw_gid)
    GOOD_ROOT.chmod(0o755)
    for leftover in Path("/etc").glob(f"{MARK}*"):
        leftover.unlink()
    return {tenant: {"name": e.pw_name, "uid": e.pw_uid, "gid": e.pw_gid, "created": created}
            for tenant, (e, created) in users.items()}


def _both_running() -> dict[str, Any] | None:
    st = status()
    ok = all(len(ws := workers(st, t, APP)) == 1 and ws[0]["state"] == "running" for t in USERS)
    return st if ok else None


def _names(directory: Path) -> set[str]:
    return set(os.listdir(directory))


def _fields(line: str) -> list[str]:
    return line.split()


def s_isolation() -> tuple[str, dict[str, Any]]:
    began = time.monotonic()
    users: dict[str, Any] = {}
    try:
        return _scenario(users, began)
    finally:
        # The users' processes must be gone before userdel: stop elasticd (its workers go with it), leave the
        # suite's file for whoever starts it next, then remove the users.
        systemctl("stop", UNIT)
        write_config(suite_config())
        removed = remove_users(list(USERS.values()))
        say(f"    users: {removed}")


def _scenario(users: dict[str, Any], began: float) -> tuple[str, dict[str, Any]]:
    cursor = journal_cursor()
    users.update(_prepare())
    evil_uid, evil_gid = users["evil"]["uid"], users["evil"]["gid"]
    start_s = start_with(CONFIG)
    st = wait_for(_both_running, 60, 0.5)
    check(st, "the two tenants' workers did not both come up within 60s: "
          f"{ {t: workers(status(), t, APP) for t in USERS} }\n" + journal_since(cursor)[-3000:])
    assert st is not None
    (evil_w,), (good_w,) = workers(st, "evil", APP), workers(st, "good", APP)
    main = main_pid()
    tenant_cg, evil_leaf, good_leaf = BASE / "tenants" / "evil", BASE / "tenants" / "evil" / APP, \
        BASE / "tenants" / "good" / APP
    cpu_max0 = read(tenant_cg / "cpu.max")
    check(cpu_max0 == EVIL_CPU_MAX, f"the evil tenant's cpu.max is {cpu_max0!r}, not {EVIL_CPU_MAX!r} (cpu: 50%)")
    check(evil_w["pid"] in procs(evil_leaf), f"the evil worker (pid {evil_w['pid']}) is not in {evil_leaf}: "
          f"{procs(evil_leaf)}")
    check(good_w["pid"] in procs(good_leaf), f"the good worker (pid {good_w['pid']}) is not in {good_leaf}")
    etc0, good0 = _names(Path("/etc")), _names(GOOD_ROOT)
    code, body = front("good.localhost", "/")
    check(code == 200, f"before the attempts the good tenant answered {code}: {body[:300]!r}")

    # ---------------------------------------------------------------- the attempts, through the front
    code, body = front("evil.localhost", "/attempts")
    check(code == 200, f"GET /attempts (Host evil.localhost) answered {code}: {body[:500]!r}")
    try:
        rep = json.loads(body)
    except ValueError as exc:
        raise Failed(f"GET /attempts is not JSON ({exc}): {body[:500]!r}") from None
    attempts = rep["attempts"]
    succeeded = {k: a for k, a in attempts.items() if a["ok"]}
    check(not succeeded, f"attempts of the hostile worker that SUCCEEDED: {json.dumps(succeeded)}")
    odd = {k: a for k, a in attempts.items() if a.get("errno") not in DENIED
           or not re.search(r"Permission denied|Operation not permitted", a["error"])}
    check(not odd, f"attempts that failed, but not with the kernel's EACCES/EPERM: {json.dumps(odd)}")

    # ---------------------------------------------------------------- who the worker was
    ps = rep["status"]
    uids, gids = _fields(ps["Uid"]), _fields(ps["Gid"])
    check(uids == [str(evil_uid)] * 4, f"the worker's Uid (real, effective, saved, fs) is {uids}, not eltevil's "
          f"{evil_uid}")
    check(gids == [str(evil_gid)] * 4, f"the worker's Gid is {gids}, not eltevil's group {evil_gid}")
    check(ps["Groups"] == "" and rep["groups"] == [], f"the worker has supplementary groups: {ps['Groups']!r}")
    zero = "0" * 16
    caps = {k: ps[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    check(all(v == zero for v in caps.values()), f"the worker has capabilities: {caps}")
    check(ps["NoNewPrivs"] == "1", f"the worker's NoNewPrivs is {ps['NoNewPrivs']!r}")
    check(rep["pid"] == evil_w["pid"], f"/attempts was answered by pid {rep['pid']}, the status shows the evil "
          f"worker as {evil_w['pid']}")
    keeper = rep["ppid"]  # elasticd's keeper (elasticd/keeper: the parent of every worker), its unit's MainPID
    keeper_line = read(Path(f"/proc/{keeper}/cmdline")).replace("\0", " ")
    check(keeper == keeper_pid() and "elasticd.keeper" in keeper_line,
          f"the worker's parent is pid {keeper} ({rep['parent_comm']}: {keeper_line!r}): not elasticd's keeper, "
          f"{KEEPER_UNIT}'s MainPID {keeper_pid()}")
    check(rep["cwd"] == str(EVIL_ROOT), f"the worker's cwd is {rep['cwd']!r}, not its app root {EVIL_ROOT}")
    check(rep["cgroup"] == str(evil_leaf), f"the worker's cgroup is {rep['cgroup']}, not {evil_leaf}")
    env = rep["env"]
    # PWD is not elasticd's: /bin/sh (the trampoline) exports it, as its cwd, the app root the worker is in anyway.
    extra_env = [n for n in rep["env_names"] if n not in WORKER_ENV | STREAM_ENV
                 and not n.startswith(("ELASTIC_", "HOSTILE_"))
                 and not (n == "PWD" and env.get("PWD") == str(EVIL_ROOT))]
    check(not extra_env, f"the worker's environment holds more than PATH, LANG, HOME/USER/LOGNAME, the group's "
          f"env, ELASTIC_* (and PWD, the app root, from /bin/sh): {extra_env} (PWD {env.get('PWD')!r})")
    check(env["USER"] == env["LOGNAME"] == USERS["evil"], f"the worker's USER/LOGNAME: {env}")
    check(env["ELASTIC_LISTEN"] == f"unix:{RUNTIME_DIR}/workers/evil/{APP}.{GROUP}.1.sock",
          f"the worker's ELASTIC_LISTEN is {env['ELASTIC_LISTEN']!r}")

    # ---------------------------------------------------------------- what did not change
    time.sleep(1.0)  # a SIGTERM that got through would show by now
    check(is_active(), "elasticd is no longer active after the attempts:\n"
          + systemctl("status", UNIT, "--no-pager", "-l", "-n", "30").stdout)
    main_after = main_pid()
    check(main_after == main, f"elasticd's MainPID changed: {main} → {main_after}")
    cpu_max1 = read(tenant_cg / "cpu.max")
    check(cpu_max1 == cpu_max0, f"the evil tenant's cpu.max changed: {cpu_max0!r} → {cpu_max1!r}")
    evil_members, keeper_members = procs(evil_leaf), procs(BASE / "keeper")
    check(evil_w["pid"] in evil_members and evil_w["pid"] not in keeper_members,
          f"the evil worker (pid {evil_w['pid']}) left its leaf: leaf {evil_members}, keeper/ {keeper_members}")
    check(keeper_pid() == keeper, f"the keeper's pid changed: {keeper} → {keeper_pid()}")
    etc1, good1 = _names(Path("/etc")), _names(GOOD_ROOT)
    check(etc1 == etc0, f"/etc changed: new {sorted(etc1 - etc0)}, gone {sorted(etc0 - etc1)}")
    check(good1 == good0, f"{GOOD_ROOT} changed: new {sorted(good1 - good0)}, gone {sorted(good0 - good1)}")
    code, body = front("good.localhost", "/")
    check(code == 200, f"after the attempts the good tenant answered {code}: {body[:300]!r}")
    st2 = status()
    (good_w2,), (evil_w2,) = workers(st2, "good", APP), workers(st2, "evil", APP)
    check(good_w2["pid"] == good_w["pid"] and good_w2["state"] == "running" and good_w2["restarts"] == 0,
          f"the good worker was {good_w}, is now {good_w2}")
    check(evil_w2["pid"] == evil_w["pid"] and evil_w2["state"] == "running",
          f"the evil worker was {evil_w}, is now {evil_w2}")
    sock_dirs = {}
    for tenant, name in USERS.items():
        d = RUNTIME_DIR / "workers" / tenant
        s = os.stat(d)
        sock_dirs[tenant] = f"{stat.S_IMODE(s.st_mode):04o} {pwd.getpwuid(s.st_uid).pw_name}"
        check(sock_dirs[tenant] == f"0700 {name}", f"{d} is {sock_dirs[tenant]}, not 0700 {name}")

    # ---------------------------------------------------------------- the operator's view, the journal
    text = elasticctl("status")
    check(text.returncode == 0, f"elasticctl status exited {text.returncode}: {text.stderr.strip()[-500:]}")
    rows: dict[str, str] = {}
    views: dict[str, str] = {}
    for line in text.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 2 and cols[0] in USERS:
            # The workers' table first (TENANT USER ...), then the views' (TENANT ISOLATION): off for both here.
            if cols[0] in rows:
                views[cols[0]] = cols[1]
            else:
                rows[cols[0]] = cols[1]
    check(all(views.get(t) == "none:" for t in USERS), f"elasticctl status shows the tenants' isolation as {views}, "
          "not none (isolation: {enabled: false})")
    for tenant, name in USERS.items():
        check(rows.get(tenant) == f"{name}:{name}", f"elasticctl status shows tenant {tenant}'s USER as "
              f"{rows.get(tenant)!r}, not {name}:{name}:\n{text.stdout}")
    journal = journal_since(cursor)
    as_root = [ln for ln in journal.splitlines() if "runs as root" in ln]
    check(not as_root, f"elasticd warned of a tenant running as root: {as_root}")
    refused = [ln for ln in journal.splitlines() if "refused a peer" in ln]
    check(not refused, f"the channel refused a peer: {refused[:3]}")
    announced = wait_for(lambda: "worker good.app.main.1 announced" in journal_since(cursor), 20, 1.0)
    check(announced, "the good worker (user eltgood) never announced itself on the channel")
    seconds = time.monotonic() - began

    errnos = ", ".join(f"{k} {a['errno']}" for k, a in attempts.items())
    figure = (f"{len(attempts)} attempts of the evil worker (pid {rep['pid']}, uid {uids[0]} = eltevil, Groups "
              f"empty, CapEff {ps['CapEff']}, CapBnd {ps['CapBnd']}, NoNewPrivs {ps['NoNewPrivs']}, Umask "
              f"{ps.get('Umask', '?')}) all denied: {errnos}; elasticd pid {main} still active, cpu.max "
              f"{cpu_max1}, worker still in its leaf, /etc and {GOOD_ROOT} unchanged, good answers 200 (same pid); "
              f"elasticctl status USER eltevil:eltevil, eltgood:eltgood; no 'runs as root' warning "
              f"(start {start_s:.1f}s, {seconds:.0f}s in all)")
    details = {"users": users, "report": rep, "cpu_max": cpu_max1, "main_pid": main, "socket_dirs": sock_dirs,
               "good_announced": announced, "elasticctl_status": text.stdout, "journal": journal[-4000:]}
    return figure, details
