"""The keeper under a real daemon: every worker is the keeper's child (its exit status the keeper's to read), and a
keeper of elasticd's own ends with it — a SIGKILL of elasticd leaves no worker behind, as before the keeper."""

from __future__ import annotations

import signal
import time

import psutil

APP = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 2, max_workers: 2}}
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_workers_are_the_keepers_children_and_end_with_elasticds_own_keeper(daemons, tmp_path):
    d = daemons(APP.format(root=tmp_path))
    d.start()
    workers = d.wait_workers("acme", "shop", "green", lambda ws: len(ws) == 2 and all(w["pid"] for w in ws))
    pids = [w["pid"] for w in workers]
    keepers = {psutil.Process(pid).ppid() for pid in pids}
    assert len(keepers) == 1
    keeper = keepers.pop()
    assert psutil.Process(keeper).ppid() == d.process.pid  # elasticd's own keeper: its child
    assert f"elasticd's own keeper (pid {keeper}) started" in d.log_text()

    # A worker killed: the keeper reads its status, elasticd restarts it through the keeper.
    psutil.Process(pids[0]).kill()
    d.wait_workers("acme", "shop", "green", lambda ws: all(w["pid"] and w["pid"] not in pids for w in ws[:1])
                   and len([w for w in ws if w["pid"]]) == 2)
    assert "exited with signal SIGKILL; restarting" in d.log_text()

    # elasticd dies at once: its keeper hears its parent's death and stops the workers.
    pids = [w["pid"] for w in d.workers("acme", "shop", "green")]
    d.process.send_signal(signal.SIGKILL)
    d.process.wait(10)
    deadline = time.monotonic() + 15
    while not all(_gone(pid) for pid in [*pids, keeper]):
        assert time.monotonic() < deadline, [pid for pid in [*pids, keeper] if not _gone(pid)]
        time.sleep(0.1)


def test_a_lost_keeper_takes_its_workers_and_they_restart_through_the_next(daemons, tmp_path):
    d = daemons(APP.format(root=tmp_path))
    d.start()
    workers = d.wait_workers("acme", "shop", "green", lambda ws: len(ws) == 2 and all(w["pid"] for w in ws))
    pids = [w["pid"] for w in workers]
    keeper = psutil.Process(pids[0]).ppid()
    psutil.Process(keeper).kill()  # the keeper dies (a bug, the OOM killer): its children with it
    workers = d.wait_workers("acme", "shop", "green", lambda ws: len(ws) == 2 and all(
        w["pid"] and w["pid"] not in pids and w["state"] == "running" for w in ws))
    second = {psutil.Process(w["pid"]).ppid() for w in workers}
    assert len(second) == 1 and keeper not in second
    assert psutil.Process(second.pop()).ppid() == d.process.pid  # elasticd's own, started anew
    log = d.log_text()
    assert "the keeper's connection ended: its workers are gone with it" in log
    assert "a keeper (pid" in log and "is reached again" in log
    for pid in [*pids, keeper]:
        assert _gone(pid)
