"""The re-exec in place, through the real daemon and real demo workers on a fake cgroup tree: under steady load with
logged-in users and an open WebSocket, ``elasticctl upgrade`` keeps the daemon's pid, every worker's pid, every
request answered, each user's in-process counter and the WebSocket echoing; then the same with a configuration
changed in between; a refused preflight stops nothing; a state the new image cannot read starts fresh."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import aiohttp
import psutil
from harness import PYTHON, browse

import elasticd

GROUP = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 2, max_workers: 2}}
{more}"""
BLOG = """\
      blog:
        domains: [blog.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 1, max_workers: 1}}
"""
FAST = "  occupancy_interval: 200ms\n  sample_interval: 200ms\n"
KEY = "acme.shop.green"


def _pids(d) -> dict[str, int]:
    return {w["id"]: w["pid"] for w in d.workers("acme", "shop", "green") if w["state"] == "running"}


class Load:
    """Requests flat out from two clients until stopped: one opens a connection per request, one keeps its
    connection alive (a client that sends its next request on a connection the front is handing over). Every
    answer that is not a 200, and every connection error, is a failure."""

    def __init__(self, d) -> None:
        self.d = d
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._fresh), threading.Thread(target=self._kept)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _fresh(self) -> None:
        while not self.stop.is_set():
            try:
                code, _, _ = browse(self.d, "/")
                self._count(code, "a fresh connection")
            except OSError as error:
                self.failures.append(f"a fresh connection: {error!r}")
            time.sleep(0.01)

    def _kept(self) -> None:
        conn = http.client.HTTPConnection(self.d.host, self.d.port, timeout=30)
        while not self.stop.is_set():
            try:
                conn.request("GET", "/", headers={"Host": "shop.localhost"})
                response = conn.getresponse()
                response.read()
                self._count(response.status, "a kept-alive connection")
            except (OSError, http.client.HTTPException) as error:
                self.failures.append(f"a kept-alive connection: {error!r}")
                conn.close()
                conn = http.client.HTTPConnection(self.d.host, self.d.port, timeout=30)
            time.sleep(0.01)
        conn.close()

    def _count(self, code: int, what: str) -> None:
        self.answered += 1
        if code != 200:
            self.failures.append(f"{what}: {code}")


class Echoes:
    """A WebSocket through the front, sending a message every 100 ms and reading its echo, in a thread."""

    def __init__(self, d, cookie: str) -> None:
        self.d = d
        self.cookie = cookie
        self.seen: list[str] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()))

    async def _run(self) -> None:
        try:
            async with aiohttp.ClientSession() as session, session.ws_connect(
                    f"http://{self.d.host}:{self.d.port}/ws",
                    headers={"Host": "shop.localhost", "Cookie": f"elastic_uid={self.cookie}"}) as ws:
                i = 0
                while not self.stop.is_set():
                    await ws.send_str(f"m{i}")
                    self.seen.append((await ws.receive(timeout=10)).data)
                    i += 1
                    await asyncio.sleep(0.1)
        except BaseException as error:
            self.error = error

    def __enter__(self) -> Echoes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def _counter(d, cookie: str) -> dict:
    code, body, _ = browse(d, "/counter", cookie)
    assert code == 200, body
    return json.loads(body)


def _upgrade(d) -> dict:
    result = d.ctl("upgrade", "--json")
    assert result.returncode == 0, (result.stdout, result.stderr, d.log_text()[-3000:])
    return json.loads(result.stdout)


def _users(d, names: list[str]) -> dict[str, tuple[str, int]]:
    """Each user logged in and its counter counted up: name → (cookie, count)."""
    users = {}
    for name in names:
        _, _, cookie = browse(d, "/")
        assert browse(d, f"/login?name={name}", cookie)[0] == 200
        for _ in range(3):
            count = _counter(d, cookie)["count"]
        users[name] = (cookie, count)
    return users


def test_an_upgrade_under_load_keeps_pids_users_requests_and_a_websocket(daemons, tmp_path):
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    d.announced(2)
    before = _pids(d)
    users = _users(d, ["alice", "bob", "carol"])
    where = {name: _counter(d, cookie)["worker"] for name, (cookie, _) in users.items()}
    users = {name: (cookie, count + 1) for name, (cookie, count) in users.items()}
    daemon_pid = d.process.pid
    with Load(d) as load, Echoes(d, users["alice"][0]) as echoes:
        time.sleep(1.0)
        first = _upgrade(d)
        time.sleep(1.0)
        # the second image upgrades again (a re-exec of a re-exec), the configuration changed in between: a new app
        d.write_config(GROUP.format(root=tmp_path, more=BLOG.format(root=tmp_path)))
        second = _upgrade(d)
        time.sleep(1.0)
    assert echoes.error is None, (echoes.error, echoes.seen[-5:], first, load.failures[:5], d.log_text()[-5000:])
    assert load.failures == [], (load.failures[:10], d.log_text()[-4000:])
    assert load.answered > 50
    report = first["report"]
    assert report["outcome"] == "done", report
    assert sorted(report["kept"]) == sorted(before), report
    assert report["not_kept"] == [] and report["users_kept"] >= 3, report
    assert report["tunnels"] == 1, report  # the WebSocket, carried
    assert report["accept_gap"] is not None and report["accept_gap"] < 10, report
    assert second["report"]["outcome"] == "done" and second["report"]["generation"] == 2, second
    assert second["report"]["tunnels"] == 1, second  # carried twice
    assert second["pid"] == first["pid"] == daemon_pid and psutil.pid_exists(daemon_pid)
    assert d.process.poll() is None
    assert _pids(d) == before  # no worker restarted
    d.announced(2)  # their libraries reconnected to the channel (its socket was kept) and announced again
    assert "listens elsewhere" not in d.log_text()  # every socket taken as it was, the tenant's channel too
    for name, (cookie, count) in users.items():
        now = _counter(d, cookie)
        assert now["count"] == count + 1 and now["worker"] == where[name], (name, now, count)
    messages = echoes.seen
    assert len(messages) > 20 and messages == [f"{KEY}.{messages[0].split(':')[0].rsplit('.', 1)[1]}: m{i}"
                                               for i in range(len(messages))], messages
    code, body, _ = d.get("blog.localhost", "/")
    assert code == 200 and "acme.blog.green.1" in body, body  # the new app, started by the second image


def test_a_request_awaiting_its_answer_is_carried_and_answered_by_the_new_image(daemons, tmp_path):
    """A newcomer's slow request (8 s, past the grace of 3 s) on a kept-alive connection, in flight when the upgrade
    is asked: it holds nobody's upgrade (neither phase waits for it: the whole step is as quick as without it), and
    it is not cut at the grace either: the new image relays its
    answer — with the sticky cookie a newcomer's first answer sets —, and the connection serves on; the cookie then
    leads to the worker that answered."""
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    before = _pids(d)
    outcome: dict = {}

    def slow() -> None:
        conn = http.client.HTTPConnection(d.host, d.port, timeout=30)
        conn.request("GET", "/sleep?ms=8000", headers={"Host": "shop.localhost"})
        response = conn.getresponse()
        set_cookie = response.getheader("Set-Cookie") or ""
        outcome["first"] = (response.status, response.read().decode(), set_cookie)
        cookie = set_cookie.split("elastic_uid=")[1].split(";")[0] if "elastic_uid=" in set_cookie else ""
        conn.request("GET", "/counter", headers={"Host": "shop.localhost",  # the same connection, carried on
                                                 "Cookie": f"elastic_uid={cookie}"})
        response = conn.getresponse()
        outcome["second"] = (response.status, response.read().decode())
        conn.close()

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)  # sent whole, and waiting
    report = _upgrade(d)["report"]
    thread.join(30)
    assert report["outcome"] == "done" and report["requests"] == 1 and report["cut"] == 0, report
    assert report["waited"] < 2.5, report  # not the 7.5 s left of the request: neither phase waited for it
    status, body, set_cookie = outcome["first"]
    assert status == 200 and json.loads(body) == {"slept_ms": 8000}, (status, body, d.log_text()[-3000:])
    assert "elastic_uid=" in set_cookie, set_cookie  # the newcomer's cookie, set by the new image's relay
    assert outcome["second"][0] == 200, outcome
    second = json.loads(outcome["second"][1])
    cookie = set_cookie.split("elastic_uid=")[1].split(";")[0]
    assert _counter(d, cookie) == {**second, "count": second["count"] + 1}  # on its worker, its state there
    assert _pids(d) == before


ONE = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 1
            pool: {{min_workers: 1, max_workers: 1}}
            queue: {{timeout: 30s}}
"""


def test_a_request_waiting_for_its_saturated_worker_is_carried_and_sent_once_by_the_new_image(daemons, tmp_path):
    """A tenant whose one worker (concurrency 1) is busy with an 8 s request: a second one (the user's in-process
    counter) waits in its group's queue when the upgrade is asked. Neither holds the upgrade (it waits for neither),
    neither is cut: the first is carried awaiting its answer, the second goes over as its client sent it, and the new
    image sends it, once: the worker counts it once."""
    d = daemons(ONE.format(root=tmp_path), extra_server=FAST)
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 1)
    before = d.workers("acme", "shop", "green")[0]["pid"]
    _, _, cookie = browse(d, "/")
    outcome: dict[str, tuple[int, str]] = {}

    def ask(name: str, method: str, path: str, body: bytes | None = None) -> None:
        conn = http.client.HTTPConnection(d.host, d.port, timeout=30)
        conn.request(method, path, body=body, headers={"Host": "shop.localhost", "Cookie": f"elastic_uid={cookie}"})
        response = conn.getresponse()
        outcome[name] = (response.status, response.read().decode())
        conn.close()

    slow = threading.Thread(target=ask, args=("slow", "GET", "/sleep?ms=8000"))
    slow.start()
    time.sleep(0.5)
    queued = threading.Thread(target=ask, args=("queued", "GET", "/counter"))
    queued.start()
    time.sleep(0.5)  # waiting in the group's queue behind the slow one
    report = _upgrade(d)["report"]
    slow.join(30)
    queued.join(30)
    assert report["outcome"] == "done" and report["requests"] == 2 and report["cut"] == 0, report
    assert report["waited"] < 2.5, report
    assert outcome["slow"][0] == 200 and json.loads(outcome["slow"][1]) == {"slept_ms": 8000}, outcome
    assert outcome["queued"][0] == 200, outcome
    first = json.loads(outcome["queued"][1])
    assert _counter(d, cookie)["count"] == first["count"] + 1  # sent once: counted once
    assert d.workers("acme", "shop", "green")[0]["pid"] == before


def test_a_head_trickled_by_a_client_holds_the_upgrade_for_a_moment_only(daemons, tmp_path):
    """Slowloris clients (a request head begun, never finished; a body announced and trickled) while the front stops
    accepting: the upgrade waits for what they owe a moment (a client sends a whole request in milliseconds), not the
    grace (10 s here), then cuts them: the accept gap stays short."""
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST, stop_timeout="10s")
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    import socket as socket_module
    with socket_module.create_connection((d.host, d.port), timeout=30) as trickler, \
            socket_module.create_connection((d.host, d.port), timeout=30) as uploader:
        trickler.sendall(b"GET / HTTP/1.1\r\nHost: shop.loc")
        uploader.sendall(b"POST /echo HTTP/1.1\r\nHost: shop.localhost\r\nContent-Length: 100\r\n\r\n0123456789")
        report = _upgrade(d)["report"]
        assert report["outcome"] == "done" and report["cut"] == 2, report
        # The upload, in flight when the upgrade was asked, had its grace while everyone was served (phase 1); once
        # the front stopped accepting, neither held anybody's new connection more than a moment.
        assert report["accept_gap"] < 6.0, report  # (not the grace: 10 s)
        assert trickler.recv(100) == b""  # cut: closed without an answer
        echoed = b""
        while chunk := uploader.recv(65536):  # (whatever of the echo came) then the end, no whole answer: cut
            echoed += chunk
        assert not echoed.endswith(b"0\r\n\r\n"), echoed
    assert d.get("shop.localhost", "/")[0] == 200


def test_a_request_to_a_worker_of_a_changed_group_is_carried_and_its_worker_retired_after_it(daemons, tmp_path):
    """The group's definition changed between the two images: its worker is adopted only to be drained and stopped.
    A request awaiting its answer from it is carried, and its drain waits for that request: answered 200 by it, then
    it is stopped, and the new definition's workers serve."""
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    before = _pids(d)
    outcome: list[tuple[int, str]] = []

    def slow() -> None:
        conn = http.client.HTTPConnection(d.host, d.port, timeout=30)
        conn.request("GET", "/sleep?ms=8000", headers={"Host": "shop.localhost"})
        response = conn.getresponse()
        outcome.append((response.status, response.read().decode()))
        conn.close()

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)
    d.write_config(GROUP.format(root=tmp_path, more="").replace("concurrency: 4", "concurrency: 4\n            "
                                                                               "env: {GREETING: hi}"))
    report = _upgrade(d)["report"]
    thread.join(30)
    assert report["outcome"] == "done" and report["requests"] == 1 and report["cut"] == 0, report
    assert {n["verdict"] for n in report["not_kept"]} == {"changed"}, report
    assert outcome and outcome[0][0] == 200 and json.loads(outcome[0][1]) == {"slept_ms": 8000}, (
        outcome, d.log_text()[-3000:])
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
              for pid in before.values()):
        assert time.monotonic() < deadline, "the changed group's old workers were never stopped"
        time.sleep(0.1)


def test_a_hand_over_the_kernel_refuses_descriptors_for_is_undone_and_the_old_image_serves_on(daemons, tmp_path):
    """Clients hold many idle connections and elasticd has no descriptor left to duplicate them for the next image
    (its open-files limit lowered to just above what it has open): the hand-over fails before the exec, and is undone
    — every connection resumed, the front accepting again, every worker kept — and the report says why."""
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    before = _pids(d)
    clients = [http.client.HTTPConnection(d.host, d.port, timeout=30) for _ in range(40)]
    for conn in clients:  # each kept alive after one answer: idle, to be duplicated for the next image
        conn.request("GET", "/", headers={"Host": "shop.localhost"})
        assert conn.getresponse().read()
    daemon = psutil.Process(d.process.pid)
    room = daemon.num_fds() + 20  # (the preflight's pipes fit; forty duplicates do not)
    soft, hard = daemon.rlimit(psutil.RLIMIT_NOFILE)
    daemon.rlimit(psutil.RLIMIT_NOFILE, (room, hard))
    result = d.ctl("upgrade", "--json")
    assert result.returncode == 1, (result.stdout, result.stderr)
    code, state = _get_state(d)
    assert code == 200 and state["report"]["outcome"] == "failed", (state, result.stderr)
    assert "the hand-over failed" in state["report"]["error"] and "Too many open files" in state["report"]["error"]
    daemon.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
    for conn in clients:  # resumed: each goes on serving on its connection
        conn.request("GET", "/", headers={"Host": "shop.localhost"})
        assert conn.getresponse().status == 200
        conn.close()
    assert d.get("shop.localhost", "/")[0] == 200  # accepting again
    assert _pids(d) == before and daemon.is_running()


def test_a_refused_preflight_stops_nothing(daemons, tmp_path):
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    before = _pids(d)
    d.config_path.write_text(d.config_path.read_text() + "  nonsense: [\n")
    result = d.ctl("upgrade")
    assert result.returncode == 1
    assert "upgrade refused" in result.stderr and "--check" in result.stderr, result.stderr
    assert _pids(d) == before
    assert d.get("shop.localhost", "/")[0] == 200
    code, state = _get_state(d)
    assert code == 200 and state["report"]["outcome"] == "refused" and not state["under_way"], state


def test_sigusr2_upgrades_and_a_changed_group_is_replaced(daemons, tmp_path):
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    before = _pids(d)
    # The group's definition changes (its environment): its workers are not adopted but replaced, as a reload would.
    d.write_config(GROUP.format(root=tmp_path, more="").replace("concurrency: 4", "concurrency: 4\n            "
                                                                               "env: {GREETING: hi}"))
    mark = len(d.notify.messages)
    d.signal(signal.SIGUSR2)
    d.notify.wait_for("RELOADING", "1", after=mark)
    d.notify.wait_for("READY", "1", after=mark, timeout=60)
    deadline = time.monotonic() + 30
    while True:
        code, text = _get_state(d)
        if code == 200 and text["report"] is not None and not text["under_way"]:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    report = text["report"]
    assert report["outcome"] == "done" and report["kept"] == [], report
    assert sorted(n["worker"] for n in report["not_kept"]) == sorted(before), report
    assert {n["verdict"] for n in report["not_kept"]} == {"changed"}, report
    after = d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    assert not set(w["pid"] for w in after) & set(before.values())
    assert d.get("shop.localhost", "/")[0] == 200
    deadline = time.monotonic() + 30
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
              for pid in before.values()):
        assert time.monotonic() < deadline, "the changed group's old workers were never stopped"
        time.sleep(0.1)


def _get_state(d) -> tuple[int, dict]:
    import socket as socket_module
    with socket_module.socket(socket_module.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(d.admin))
        sock.sendall(b"GET /v1/upgrade HTTP/1.0\r\nHost: elasticd\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_state_that_cannot_be_read_starts_fresh(daemons, tmp_path):
    """A state document of another format (an older or a newer elasticd's): the new image starts as a fresh start
    does, and says so in its log and its report."""
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    memfd = os.memfd_create("state", 0)
    os.write(memfd, b'{"format": 999, "workers": []}')
    env = {**os.environ, "NOTIFY_SOCKET": str(d.notify.path), "ELASTICD_UPGRADE_STATE": str(memfd)}
    d.log = open(d.log_path, "ab")  # noqa: SIM115 - closed by d.stop()
    d.process = subprocess.Popen([PYTHON, "-m", "elasticd.daemon", "--config", str(d.config_path)], env=env,
                                 stdout=d.log, stderr=subprocess.STDOUT, pass_fds=[memfd])
    os.close(memfd)
    d.notify.wait_for("READY", "1")
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    code, state = _get_state(d)
    assert code == 200 and state["report"]["outcome"] == "fresh", state
    assert "format 999: this elasticd reads formats 1, 2" in state["report"]["error"], state
    assert "cannot be taken" in d.log_text()
    assert d.get("shop.localhost", "/")[0] == 200


def test_a_broken_install_is_refused_by_the_preflight_and_the_old_image_serves_on(daemons, tmp_path):
    """The installed package broken (a module that no longer imports): the preflight, which runs the installed code,
    refuses; the running elasticd, which loaded its code before, serves on with every worker."""
    installed = tmp_path / "site"
    shutil.copytree(Path(elasticd.__file__).parent, installed / "elasticd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    d = daemons(GROUP.format(root=tmp_path, more=""), extra_server=FAST)
    # Started from the copy (`-m` imports from the working directory first), as the installed package would be.
    env = {**os.environ, "NOTIFY_SOCKET": str(d.notify.path)}
    d.log = open(d.log_path, "ab")  # noqa: SIM115 - closed by d.stop()
    d.process = subprocess.Popen([PYTHON, "-m", "elasticd.daemon", "--config", str(d.config_path)], env=env,
                                 cwd=installed, stdout=d.log, stderr=subprocess.STDOUT)
    d.notify.wait_for("READY", "1")
    d.wait_workers("acme", "shop", "green", lambda ws: sum(w["state"] == "running" for w in ws) == 2)
    before = _pids(d)
    (installed / "elasticd" / "daemon.py").write_text("raise ImportError('a half-written upgrade')\n")
    result = d.ctl("upgrade")
    assert result.returncode == 1 and "a half-written upgrade" in result.stderr, result.stderr
    assert _pids(d) == before and d.get("shop.localhost", "/")[0] == 200
