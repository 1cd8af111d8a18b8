"""Scenario 22, issue #32 (upgrades no tenant notices), under systemd on real cgroups:

1. **dpkg -i of a newer build under load**: the installed .deb, rebuilt with a higher version and a marked
   ``__version__`` (so the new image is seen to be the new code), installed with ``dpkg -i`` while two clients send
   requests flat out (one a connection per request, one a kept-alive connection) and a WebSocket echoes every
   100 ms. The postinst runs ``elasticctl upgrade``: elasticd's MainPID is the same, systemd counted no restart, no
   worker's pid changed, no request failed, each logged-in user's in-process counter continues, the WebSocket still
   echoes, and the report names the new version, the workers kept and the accept gap.
2. **A request awaiting its answer** (40 s: longer than the preflight under TCG, and past the grace of 10 s after it)
   while ``elasticctl upgrade`` runs: carried over
   with both its connections and answered 200 by the new image, not cut; every listening socket, the tenant's
   channel too, taken as it was (the journal says none "listens elsewhere").
3. **systemctl restart**: a real stop and start, every worker restarted; clients connecting meanwhile wait in the
   listening socket's backlog (systemd's file-descriptor store holds it): none is refused.

At the end the original .deb is installed again (a downgrade: the same path, the other way).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    UNIT,
    admin,
    browse,
    check,
    journal_cursor,
    journal_since,
    keeper_pid,
    run,
    say,
    show,
    start_with,
    status,
    suite_config,
    systemctl,
    tenant_user,
    wait_for,
    workers,
    write_config,
)

TENANT, APP, GROUP, HOST = "steady", "web", "main", "steady.localhost"
ROOT = Path("/srv", TENANT, APP)
MARK = "+upgraded"

CONFIG = f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 10s
  occupancy_interval: 1s
  sample_interval: 1s
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
    """Two clients until stopped: a connection per request, and one kept-alive connection. Every answer but a 200 and
    every connection error is a failure; ``refused`` counts the connections refused."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []
        self.refused = 0
        self.threads = [threading.Thread(target=self._fresh, daemon=True),
                        threading.Thread(target=self._kept, daemon=True)]

    def begin(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)

    def _fresh(self) -> None:
        while not self.stop.is_set():
            code, body, _ = browse(HOST, "/", timeout=120)
            self._count(code, body, "fresh")
            time.sleep(0.05)

    def _kept(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", 8080, timeout=120)
        while not self.stop.is_set():
            try:
                conn.request("GET", "/", headers={"Host": HOST})
                response = conn.getresponse()
                response.read()
                self._count(response.status, b"", "kept-alive")
            except (OSError, http.client.HTTPException) as exc:
                self._count(None, f"{type(exc).__name__}: {exc}".encode(), "kept-alive")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", 8080, timeout=120)
            time.sleep(0.05)
        conn.close()

    def _count(self, code: int | None, body: bytes, what: str) -> None:
        self.answered += 1
        if code != 200:
            self.failures.append(f"{what}: {code} {body[:120]!r}")
            if b"ConnectionRefused" in body:
                self.refused += 1


class Echoes:
    def __init__(self, cookie: str) -> None:
        self.cookie = cookie
        self.seen: list[str] = []
        self.error: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        import aiohttp  # (the guest's python3-aiohttp, a Depends of the .deb)
        try:
            async with aiohttp.ClientSession() as session, session.ws_connect(
                    "http://127.0.0.1:8080/ws", headers={"Host": HOST, "Cookie": f"elastic_uid={self.cookie}"},
                    autoping=True) as ws:
                i = 0
                while not self.stop.is_set():
                    await ws.send_str(f"m{i}")
                    self.seen.append((await ws.receive(timeout=60)).data)
                    i += 1
                    await asyncio.sleep(0.1)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def begin(self) -> Echoes:
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(120)


def _pids() -> dict[str, int]:
    return {w["id"]: w["pid"] for w in workers(status(), TENANT, APP) if w["state"] == "running"}


def _counter(cookie: str) -> dict[str, Any]:
    code, body, _ = browse(HOST, "/counter", cookie)
    check(code == 200, f"/counter answered {code}: {body[:200]!r}")
    return json.loads(body)


def _newer_deb() -> tuple[Path, Path, str]:
    """(the installed .deb, a newer build of it, its version): the same files, a higher version, a marked
    __version__."""
    debs = sorted(Path("/tmp").glob("elasticd_*.deb"))
    check(debs, "the .deb 00-install copied to /tmp is not there")
    original = debs[0]
    work = Path("/tmp/elasticd-newer")
    shutil.rmtree(work, ignore_errors=True)
    run(["dpkg-deb", "-R", str(original), str(work)], timeout=300)
    control = work / "DEBIAN" / "control"
    text = control.read_text()
    version = re.search(r"^Version: (\S+)$", text, re.M).group(1)  # type: ignore[union-attr]
    newer = version + "+1"
    control.write_text(text.replace(f"Version: {version}", f"Version: {newer}"))
    inits = list(work.glob("usr/lib/python3*/dist-packages/elasticd/__init__.py"))
    check(len(inits) == 1, f"elasticd/__init__.py not found once in the .deb: {inits}")
    source = inits[0].read_text()
    code_version = re.search(r'^__version__ = "(.*)"$', source, re.M).group(1)  # type: ignore[union-attr]
    inits[0].write_text(source.replace(f'__version__ = "{code_version}"', f'__version__ = "{code_version}{MARK}"'))
    target = Path(f"/tmp/elasticd-newer_{newer}.deb")
    # Uncompressed (-Znone): xz, dpkg-deb's default, took tens of seconds to pack and to unpack in a TCG guest.
    built = run(["dpkg-deb", "-Znone", "-b", str(work), str(target)], timeout=300)
    check(built.returncode == 0, f"dpkg-deb -b failed: {built.stderr[-1000:]}")
    return original, target, code_version + MARK


def _connect_refusals(seconds: float, stop: threading.Event, counts: dict[str, int]) -> None:
    """Connect (and send a request) every 20 ms; count what was refused."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", 8080), timeout=120) as sock:
                sock.sendall(f"GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
                head = sock.recv(64)
                counts["answered" if head.startswith(b"HTTP/1.1 ") else "empty"] += 1
        except ConnectionRefusedError:
            counts["refused"] += 1
        except OSError:
            counts["other"] += 1
        time.sleep(0.02)


def s_upgrade() -> tuple[str, dict[str, Any]]:
    passed = False
    try:
        result = _scenario()
        passed = True
        return result
    finally:
        systemctl("stop", UNIT)
        # Passed: the newer build stays (the suite's own files, a higher version and a marked __version__: what the
        # next scenarios run is the same code). Failed: back to the .deb the suite installed (a downgrade, by the same
        # path), elasticd stopped first so that the postinst does not re-execute it (tens of seconds under TCG).
        debs = sorted(Path("/tmp").glob("elasticd_*.deb"))
        if not passed and debs and run(["dpkg-query", "-W", "-f=${Version}", "elasticd"]).stdout.endswith("+1"):
            run(["dpkg", "-i", str(debs[0])], timeout=600, env={"DEBIAN_FRONTEND": "noninteractive"})
        write_config(suite_config())


def _scenario() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    start_with(CONFIG)
    wait_for(lambda: len(_pids()) == 2, 120, 0.5)
    before = _pids()
    check(len(before) == 2, f"two workers never ran: {status()['tenants'][TENANT]}")
    main_before = show("MainPID", "NRestarts")
    keeper_before = keeper_pid()
    users = {}
    for name in ("alice", "bob", "carol"):
        _, _, cookie = browse(HOST, "/")
        check(cookie is not None, "no cookie from the front")
        check(browse(HOST, f"/login?name={name}", cookie)[0] == 200, f"{name} could not log in")
        for _ in range(3):
            seen = _counter(cookie)
        users[name] = (cookie, seen["count"], seen["worker"])
    _, newer, new_version = _newer_deb()
    load = Load().begin()
    echoes = Echoes(users["alice"][0]).begin()
    time.sleep(3)
    say(f"dpkg -i {newer.name} under load")
    began = time.monotonic()
    installed = run(["dpkg", "-i", str(newer)], timeout=600, env={"DEBIAN_FRONTEND": "noninteractive"})
    dpkg_seconds = time.monotonic() - began
    time.sleep(3)
    load.halt()
    echoes.halt()
    check(installed.returncode == 0, f"dpkg -i failed: {installed.stdout[-2000:]}\n{installed.stderr[-2000:]}")
    check("restarting elasticd instead" not in installed.stderr,
          f"the postinst fell back to a restart:\n{installed.stdout[-2000:]}\n{installed.stderr[-2000:]}")
    main_after = show("MainPID", "NRestarts")
    after = _pids()
    code, state = admin("GET", "/v1/upgrade")
    check(code == 200 and state.get("report"), f"GET /v1/upgrade: {code} {state}")
    report = state["report"]
    check(report["outcome"] == "done", f"the upgrade's report: {report}")
    check(report["version_after"] == new_version and state["version"] == new_version,
          f"the new image is not the new code: {report['version_after']} / {state['version']}, want {new_version}")
    check(main_after["MainPID"] == main_before["MainPID"], f"MainPID changed: {main_before} → {main_after}")
    check(main_after["NRestarts"] == main_before["NRestarts"], f"systemd restarted it: {main_before} → {main_after}")
    check(after == before, f"workers restarted: {before} → {after}")
    check(keeper_pid() == keeper_before, f"the keeper was restarted by the upgrade: {keeper_before} → {keeper_pid()}")
    check(load.failures == [], f"{len(load.failures)} of {load.answered} requests failed: {load.failures[:8]}")
    check(echoes.error is None and len(echoes.seen) > 10, f"the WebSocket: {echoes.error}, {echoes.seen[-3:]}")
    check(all(m.endswith(f": m{i}") for i, m in enumerate(echoes.seen)), f"echoes out of order: {echoes.seen[:5]}")
    for name, (cookie, count, worker) in users.items():
        now = _counter(cookie)
        check(now["count"] == count + 1 and now["worker"] == worker,
              f"{name}'s state: was {count} on {worker}, now {now}")
    gap = report["accept_gap"]
    say(f"upgrade in place: dpkg -i {dpkg_seconds:.1f}s, accept gap {gap:.2f}s, {load.answered} requests, "
        f"0 failed, {len(echoes.seen)} echoes, tunnels carried {report['tunnels']}")
    awaited = _awaiting_carried()


    # systemctl restart: every worker restarts, and no connection is refused meanwhile.
    counts, restart_seconds = _restart_under_probe()
    check(counts["refused"] == 0, f"connections refused during systemctl restart: {counts}")
    check(counts["answered"] > 0, f"nothing answered around the restart: {counts}")
    say(f"systemctl restart ({restart_seconds:.1f}s): {counts}")
    # The control: the same restart without the store (a drop-in FileDescriptorStoreMax=0) refuses connections, so
    # the figure above is the store's doing.
    dropin = Path("/run/systemd/system/elasticd.service.d/it-no-store.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("[Service]\nFileDescriptorStoreMax=0\n")
    try:
        systemctl("daemon-reload")
        systemctl("stop", UNIT)  # (the store is let go once the unit is stopped with no job queued)
        systemctl("start", UNIT)
        wait_for(lambda: len(_pids()) == 2, 120, 0.5)
        without, _ = _restart_under_probe()
    finally:
        dropin.unlink()
        systemctl("daemon-reload")
    check(without["refused"] > 0, f"the control: a restart without the store refused nothing: {without}")
    say(f"the same restart without the store: {without}")
    return (f"dpkg -i under load: {load.answered} requests, 0 failed, 0 workers restarted, MainPID and the "
            f"keeper's pid kept, accept gap "
            f"{gap:.2f}s; {awaited}; systemctl restart: {counts['refused']} refused of {sum(counts.values())} connects "
            f"(without the store: {without['refused']} of {sum(without.values())})",
            {"accept_gap": gap, "dpkg_seconds": round(dpkg_seconds, 1), "requests": load.answered,
             "echoes": len(echoes.seen), "report": report, "restart": counts,
             "restart_seconds": round(restart_seconds, 1), "restart_without_store": without})


def _awaiting_carried() -> str:
    """``elasticctl upgrade`` while a 40 s request awaits its answer: carried, answered 200. (Under TCG the preflight
    alone takes 10-20 s: a shorter request could end before the hand-over; 40 s still outlasts the 10 s grace.)"""
    cursor = journal_cursor()
    answer: list[int | None] = []
    thread = threading.Thread(target=lambda: answer.append(browse(HOST, "/sleep?ms=40000", timeout=90)[0]))
    thread.start()
    time.sleep(1.0)
    began = time.monotonic()
    upgraded = run(["elasticctl", "upgrade", "--json"], timeout=120)
    seconds = time.monotonic() - began
    thread.join(90)
    check(upgraded.returncode == 0, f"elasticctl upgrade: {upgraded.stdout[-1000:]} {upgraded.stderr[-1000:]}")
    report = json.loads(upgraded.stdout)["report"]
    check(report["requests"] >= 1 and report["cut"] == 0, f"the request awaiting its answer: {report}")
    check(answer == [200], f"the request awaiting its answer got {answer}")
    journal = journal_since(cursor)
    check("listens elsewhere" not in journal, "a socket was not taken over:\n" + journal[-2000:])
    return (f"a 40 s request carried over `elasticctl upgrade` ({seconds:.1f}s, waited {report['waited']:.2f}s) and "
            f"answered 200")


def _restart_under_probe() -> tuple[dict[str, int], float]:
    counts = {"answered": 0, "refused": 0, "empty": 0, "other": 0}
    stop = threading.Event()
    prober = threading.Thread(target=_connect_refusals, args=(240.0, stop, counts), daemon=True)
    prober.start()
    time.sleep(2)
    restarted, seconds = _timed(lambda: systemctl("restart", UNIT))
    check(restarted.returncode == 0, f"systemctl restart failed: {restarted.stderr}")
    wait_for(lambda: len(_pids()) == 2, 120, 0.5)
    time.sleep(3)
    stop.set()
    prober.join(300)
    return counts, seconds


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.monotonic()
    value = fn()
    return value, time.monotonic() - start
