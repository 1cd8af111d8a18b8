"""elasticd's own crash, through the real daemon, its keeper as a unit of its own would run it (a process of the
test's, not elasticd's child) and a notify socket that keeps systemd's store: SIGKILL of elasticd under load, then a
start as systemd's restart does it (LISTEN_FDS: the front's socket and the state's memfd). Every worker's pid is
unchanged, a logged-in user's counter goes on, no connection is refused (they wait in the front socket's backlog,
kept in the store); only what was in flight inside the dead process fails. A torn state adopts nothing: the old
workers are stopped and new ones start."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from harness import PYTHON, browse

REPO = Path(__file__).resolve().parent.parent
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
"""


@pytest.fixture
def keeper(tmp_path):
    """A keeper of the test's own, as elasticd-keeper.service runs one: not elasticd's child, so it outlives it."""
    path = tmp_path / "keeper" / "keeper.sock"
    process = subprocess.Popen([PYTHON, "-m", "elasticd.keeper", "--socket", str(path), "--orphan-bound", "60"],
                               env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    yield path
    if process.poll() is None:
        process.terminate()  # (it stops what is left of its children)
    process.wait(20)


def _pids(d) -> dict[str, int]:
    return {w["id"]: w["pid"] for w in d.workers("acme", "shop", "green") if w["state"] == "running"}


def _counter(d, cookie: str) -> int:
    code, body, _ = browse(d, "/counter", cookie)
    assert code == 200, body
    return json.loads(body)["count"]


def _running_with_a_user(daemons, keeper, tmp_path):
    """elasticd on the test's keeper with its two workers running and a user logged in: (the daemon, the workers'
    pids, the user's cookie)."""
    d = daemons(GROUP.format(root=tmp_path), args=("--keeper", str(keeper)))
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: len([w for w in ws if w["state"] == "running"]) == 2)
    _, _, cookie = browse(d, "/")
    assert browse(d, "/login?name=ada", cookie)[0] == 200
    return d, _pids(d), cookie


class Clients:
    """Requests in a loop until stopped, each on a new connection; every outcome counted by kind."""

    def __init__(self, d) -> None:
        self.d = d
        self.stop = threading.Event()
        self.outcomes: dict[str, int] = {}
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                code, _, _ = browse(self.d, "/")
                kind = str(code)
            except ConnectionRefusedError:
                kind = "refused"
            except (OSError, http.client.HTTPException) as error:
                kind = type(error).__name__
            self.outcomes[kind] = self.outcomes.get(kind, 0) + 1
            time.sleep(0.01)

    def __enter__(self) -> Clients:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def test_workers_and_users_outlive_a_crash_of_elasticd(daemons, keeper, tmp_path):
    d, before, cookie = _running_with_a_user(daemons, keeper, tmp_path)
    counts = [_counter(d, cookie) for _ in range(3)]
    assert counts == [1, 2, 3]
    time.sleep(1.5)  # (the state is written at most once a second: the login and the counter's worker are in it)
    with Clients(d) as clients:
        time.sleep(0.5)
        old_pid = d.process.pid
        d.crash()  # SIGKILL, then a start with what the store kept
        time.sleep(1.0)
    assert d.process.pid != old_pid
    assert _pids(d) == before  # not one worker restarted
    assert _counter(d, cookie) == 4  # the user's in-process state, where it was
    outcomes = clients.outcomes
    assert outcomes.get("refused", 0) == 0, outcomes  # the front's socket waited in the store: backlog, not refusal
    assert sum(n for kind, n in outcomes.items() if kind != "200") <= 1, outcomes  # at most the one in flight
    began = d.status()["began"]
    assert began["how"] == "crash" and began["adopted"] == 2 and began["not_adopted"] == [], began
    assert "elasticd began after a crash: 2 workers adopted, 0 not" in d.log_text()
    status = d.ctl("status")
    assert "began: after a crash at" in status.stdout and "2 workers adopted, 0 not" in status.stdout
    # A worker killed now is read and restarted as any other: the keeper is its parent still.
    victim = next(iter(before.values()))
    psutil.Process(victim).kill()
    d.wait_workers("acme", "shop", "green", lambda ws: victim not in [w["pid"] for w in ws]
                   and len([w for w in ws if w["state"] == "running"]) == 2)
    # A clean stop stops the workers, and takes the state out of the store: the next start is a start.
    assert d.stop() == 0
    assert "state" not in d.notify.store


def test_a_torn_state_adopts_nothing_and_the_old_workers_are_stopped(daemons, keeper, tmp_path):
    d = daemons(GROUP.format(root=tmp_path), args=("--keeper", str(keeper)))
    d.start()
    d.wait_workers("acme", "shop", "green", lambda ws: len([w for w in ws if w["state"] == "running"]) == 2)
    before = _pids(d)
    time.sleep(1.5)
    d.process.send_signal(signal.SIGKILL)
    d.process.wait(30)
    d.log.close()
    d.notify.drain()
    (memfd,) = d.notify.store["state"]
    size = os.fstat(memfd).st_size
    os.pwrite(memfd, b"\xff" * 64, max(0, size - 64))  # the newest record's body, torn
    os.pwrite(memfd, b"\xff" * 8, 60)  # and the older's (slot A: its body begins after its 64-byte header)
    d.start(stored=True)
    d.wait_workers("acme", "shop", "green", lambda ws: len([w for w in ws if w["state"] == "running"]) == 2
                   and not set(w["pid"] for w in ws) & set(before.values()))
    for pid in before.values():
        deadline = time.monotonic() + 15
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"the old worker {pid} still runs"
            time.sleep(0.1)
    assert "the running state in systemd's store is torn" in d.log_text()
    assert "workers of an elasticd before this one, and no state to adopt them by: stopped" in d.log_text()
    assert d.status()["began"]["how"] == "start"


def test_a_crash_in_the_middle_of_an_upgrades_hand_over_adopts_from_the_store(daemons, keeper, tmp_path):
    """SIGUSR2, and SIGKILL once the old image has handed over and exec'd (the new image still starting): the start
    after it reads what the old image last kept in the store, and adopts every worker with its users."""
    d, before, cookie = _running_with_a_user(daemons, keeper, tmp_path)
    assert [_counter(d, cookie) for _ in range(2)] == [1, 2]
    time.sleep(1.5)  # (the state is written at most once a second)
    assert d.process is not None
    d.process.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while "handed over; exec" not in d.log_text():
        assert time.monotonic() < deadline, d.log_text()[-3000:]
        time.sleep(0.005)
    d.crash()
    assert _pids(d) == before
    assert _counter(d, cookie) == 3
    began = d.status()["began"]
    assert began["how"] == "crash" and began["adopted"] == 2 and began["users_dropped"] == 0, began
    assert d.stop() == 0
