"""The population and the monitor through the real daemon and real demo workers: consumption grows by the
requests each user made; a worker stopped with SIGSTOP is an error row while the others answer; the page and
its JSON answer with the right workers and users; basic auth from server.monitor, reloadable."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from harness import PYTHON, browse

from elasticd.supervisor.spawn import socket_path

TENANTS = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 2
            pool: {{min_workers: 2, max_workers: 2}}
"""
SERVER = "  occupancy_interval: 200ms\n"


def _get(d, path: str, auth: tuple[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{d.metrics_port}{path}")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def _announced(d, count: int) -> list[dict]:
    return [w for w in d.announced(count)["workers"] if w["state"] == "running" and w["announced"]]


def _population(d) -> dict:
    result = d.ctl("population", "acme/shop", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_population_fuses_consumption_with_each_workers_register(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path), extra_server=SERVER)
    d.start()
    workers = _announced(d, 2)
    reception = next(w for w in workers if w["reception"])
    other = next(w for w in workers if not w["reception"])
    made = {}
    for n in (1, 3, 5):  # three users: 1, 3 and 5 requests each, the first one included (before its cookie)
        status, _, cookie = browse(d, "/counter")
        assert status == 200 and cookie
        for _ in range(n - 1):
            browse(d, "/counter", cookie)
        made[cookie[:8]] = n
    browse(d, "/pages?n=3", cookie)  # the last user says it has 3 pages open
    made[cookie[:8]] += 1
    population = _population(d)
    users = {r["user"]: r for r in population["rows"] if "error" not in r}
    assert population["errors"] == 0 and set(users) >= set(made)
    for user, n in made.items():
        row = users[user]
        assert row["requests"] == n and row["recent_requests"] == n and row["seconds"] > 0, row
        assert row["worker"] == reception["id"] and row["group"] == "green" and row["in_register"], row
        assert row["connections"] == 0 and row["idle"] < 30
    assert users[cookie[:8]]["pages"] == 3
    assert all(users[u]["pages"] is None for u in made if u != cookie[:8])  # not reported: None, not 0
    # Two counts, two names: the population (every user, the one that never came back with its cookie included)
    # and the sticky users among them, which are what status counts per group; "users" alone is neither.
    once = next(user for user, n in made.items() if n == 1)
    assert not users[once]["on_surface"] and all(users[u]["on_surface"] for u in made if u != once)
    sticky = sum(1 for row in users.values() if row["on_surface"])
    assert (population["population"], population["sticky_users"], population["register_only_users"]) == \
        (len(users), sticky, len(users) - sticky)
    status = json.loads(d.ctl("status", "--json").stdout)
    green = status["tenants"]["acme"]["apps"]["shop"]["groups"]["green"]
    assert green["sticky_users"] == sticky and "users" not in green and "users" not in population
    table = d.ctl("population", "acme/shop")
    assert table.returncode == 0 and cookie[:8] in table.stdout
    assert table.stdout.startswith(f"acme/shop: population {len(users)} ({sticky} sticky, routed by their cookie; "
                                   f"{len(users) - sticky} only in a worker's register")

    # One worker stopped: an error row, in the monitor's time; the other answers as before.
    os.kill(other["pid"], signal.SIGSTOP)
    try:
        started = time.monotonic()
        population = _population(d)
        took = time.monotonic() - started
    finally:
        os.kill(other["pid"], signal.SIGCONT)
    errors = [r for r in population["rows"] if "error" in r]
    assert errors == [{"worker": other["id"], "group": "green", "error": "unreachable"}]
    # (``once``, in the reception's register alone, may be gone from it by now: a register forgets a user idle for
    # ten occupancy windows, 2 s here, which a loaded machine passes between the two reads; it failed so once)
    assert {r["user"] for r in population["rows"] if "error" not in r} >= set(made) - {once}
    assert took < 5.0  # the monitor's own one-second timeout, not the worker's silence


def test_a_websocket_is_an_open_connection_and_the_executor_queue_is_measured(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path), extra_server=SERVER)
    d.start()
    _announced(d, 2)
    _, _, cookie = browse(d, "/")
    browse(d, "/", cookie)  # on the surface now

    async def scenario() -> tuple[dict, dict]:
        headers = {"Host": "shop.localhost", "Cookie": f"elastic_uid={cookie}"}
        async with aiohttp.ClientSession() as session, session.ws_connect(f"http://127.0.0.1:{d.port}/ws",
                                                                          headers=headers) as ws:
            await ws.send_str("hello")
            assert "hello" in (await ws.receive()).data
            open_row = await asyncio.to_thread(_population, d)
        # Three blocking calls on a worker of concurrency 2: one waits for a thread. Sent to the reception's own
        # socket: through the front, the third would wait in the group's queue instead (front/queueing.py), and the
        # worker's executor would never have one to measure.
        reception = next(w for w in d.pool()["workers"] if w["reception"])
        direct = aiohttp.UnixConnector(path=socket_path(str(d.runtime), reception["id"]))
        async with aiohttp.ClientSession(connector=direct) as session:
            calls = [asyncio.create_task(session.get("http://worker/blocking?ms=1500")) for _ in range(3)]
            await asyncio.sleep(0.2)
            queued = await asyncio.to_thread(_queued, d)
            for call in calls:
                (await call).release()
        return open_row, queued

    open_row, queued = asyncio.run(scenario())
    row = next(r for r in open_row["rows"] if r.get("user") == cookie[:8])
    assert row["connections"] == 1, row
    assert queued["queue_depth"] >= 1, queued


def _queued(d, timeout: float = 5.0) -> dict:
    """The reception's latest reported executor, once its queue shows in a report (every 200 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        pool = d.pool()
        reception = next(w for w in pool["workers"] if w["reception"])
        executor = (reception["last_report"] or {}).get("executor") or {}
        if executor.get("queue_depth"):
            return executor
        assert time.monotonic() < deadline, f"no queue_depth in the reception's reports: {reception['last_report']}"
        time.sleep(0.05)


def test_the_monitor_page_and_its_json(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path), extra_server=SERVER)
    d.start()
    workers = _announced(d, 2)
    _, _, cookie = browse(d, "/")
    browse(d, "/", cookie)
    status, html, headers = _get(d, "/monitor")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "<script" in html and "http://" not in html.replace('"http://www.w3.org/2000/svg"', "")  # no asset
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    status, body, _ = _get(d, "/monitor/state")
    state = json.loads(body)
    assert status == 200 and state["apps"] == ["acme/shop"] and state["app"] == "acme/shop"
    assert {w["id"] for w in state["pool"]["groups"]["green"]["workers"]} == {w["id"] for w in workers}
    assert [r["user"] for r in state["population"]["rows"] if "error" not in r] == [cookie[:8]]
    assert _get(d, "/monitor/state?app=acme/nope")[0] == 404
    assert _get(d, "/monitor/state?app=nope")[0] == 400
    # Without auth, a Host that is a name is refused (what a DNS-rebinding page sends); localhost is fine.
    for host, code in (("evil.example:9464", 403), ("localhost:9464", 200), ("[::1]:9464", 200)):
        request = urllib.request.Request(f"http://127.0.0.1:{d.metrics_port}/monitor/state", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                got = response.status
        except urllib.error.HTTPError as exc:
            got = exc.code
        assert got == code, host


def test_basic_auth_guards_the_monitor_and_a_new_password_comes_with_a_reload(daemons, tmp_path):
    password = tmp_path / "monitor.pw"
    password.write_text("s3cret\n")
    password.chmod(0o600)
    d = daemons(TENANTS.format(root=tmp_path),
                extra_server=SERVER + f"  monitor: {{user: ops, password_file: {password}}}\n")
    d.start()
    status, _, headers = _get(d, "/monitor")
    assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="elasticd monitor"')
    assert _get(d, "/monitor/state", ("ops", "wrong"))[0] == 401
    assert _get(d, "/monitor/state", ("ops", "s3cret"))[0] == 200
    assert _get(d, "/metrics")[0] == 200  # the scraper's page stays open
    password.write_text("n3w\n")
    result = d.ctl("reload")
    assert result.returncode == 0, result.stderr
    assert _get(d, "/monitor", ("ops", "n3w"))[0] == 200 and _get(d, "/monitor", ("ops", "s3cret"))[0] == 401
    password.unlink()
    refused = d.ctl("reload")
    assert refused.returncode == 1 and "server.monitor.password_file: cannot read" in refused.stderr
    assert _get(d, "/monitor", ("ops", "n3w"))[0] == 200  # the running credentials stay


@pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux here (apt install tmux)")
def test_pool_watch_redraws_in_a_terminal_until_ctrl_c(daemons, tmp_path):
    """`elasticctl pool --watch` in a real terminal (tmux, on a server of this test's own): bars drawn and
    redrawn, then Ctrl-C ends it with exit 0."""
    d = daemons(TENANTS.format(root=tmp_path), extra_server=SERVER)
    d.start()
    _announced(d, 2)
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    done = tmp_path / "exit-code"
    command = (f"{shlex.quote(PYTHON)} -m elasticd.ctl --socket {shlex.quote(str(d.admin))} pool acme/shop --watch "
               f"--interval 300ms; echo $? > {shlex.quote(str(done))}")
    env = {**os.environ, "TERM": "xterm-256color", "LANG": "C.UTF-8"}
    subprocess.run([*tmux, "new-session", "-d", "-x", "200", "-y", "40", command], check=True, env=env)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout

        deadline = time.monotonic() + 20
        while "acme.shop.green.2" not in screen():
            assert time.monotonic() < deadline, screen()
            time.sleep(0.1)
        first = screen()
        stamp = first.splitlines()[0]
        while screen().splitlines()[0] == stamp:  # redrawn: a new stamp, the same place
            assert time.monotonic() < deadline + 5, screen()
            time.sleep(0.1)
        assert first.splitlines()[0].startswith("acme/shop   ") and "Ctrl-C quits" in first
        assert "OCCUPANCY" in first and "·" * 20 in first and "reception" in first
        assert first.count("acme/shop   ") == 1  # the screen is cleared before each redraw
        subprocess.run([*tmux, "send-keys", "C-c"], check=True)
        while not done.exists():
            assert time.monotonic() < deadline + 10, screen()
            time.sleep(0.1)
        assert done.read_text().strip() == "0"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    # Piped into a reader that stops reading (| head): it ends quietly, exit 0, no traceback.
    piped = subprocess.Popen([PYTHON, "-m", "elasticd.ctl", "--socket", str(d.admin), "pool", "acme/shop", "--watch",
                              "--interval", "100ms"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert piped.stdout is not None and piped.stderr is not None
    piped.stdout.readline()
    piped.stdout.close()
    assert piped.wait(20) == 0
    assert piped.stderr.read() == b""
