"""Live moves through the real daemon: `elasticctl drain` takes a worker out, every user on it moved off with its
in-process state (the demo's /counter goes on from the other worker), then retired; the journal says so."""

from __future__ import annotations

import json
import threading
import urllib.request

from harness import browse

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
            concurrency: 4
            pool: {{min_workers: 2, max_workers: 4}}
"""
SERVER = "  occupancy_interval: 200ms\n  move_timeout: 5s\n"


def test_drain_moves_every_user_with_its_state_then_retires_the_worker(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path), extra_server=SERVER)
    d.start()
    pool = d.announced(2)
    reception = next(w["id"] for w in pool["workers"] if w["reception"])
    cookies = []
    for _ in range(3):  # three users, born on the reception, each counting in its process
        status, body, cookie = browse(d, "/counter")
        assert status == 200 and json.loads(body)["worker"] == reception
        for _ in range(4):
            status, body, _ = browse(d, "/counter", cookie)
        assert json.loads(body)["count"] == 5
        cookies.append(cookie)
    drained = d.ctl("drain", reception)
    assert drained.returncode == 0, drained.stderr
    assert "3 users moved off; retired" in drained.stdout
    for cookie in cookies:
        status, body, _ = browse(d, "/counter", cookie)
        answer = json.loads(body)
        assert status == 200 and answer["count"] == 6 and answer["worker"] != reception
    after = d.pool()
    assert reception not in [w["id"] for w in after["workers"]]
    assert len([w for w in after["workers"] if w["state"] == "running"]) >= 2  # a replacement kept min_workers
    counts = after["decision_counts"]
    assert counts.get("move") == 3 and counts.get("retire") == 1 and not counts.get("move-aborted")
    move = next(x for x in after["decisions"] if x["decision"] == "move")
    assert move["numbers"]["package_bytes"] > 0 and move["numbers"]["ms"] < 5000
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'elasticd_moves_total{app="shop",outcome="moved",tenant="acme"} 3.0' in metrics


def test_drain_of_an_unknown_worker_is_refused(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path), extra_server=SERVER)
    d.start()
    result = d.ctl("drain", "acme.shop.green.99")
    assert result.returncode == 1 and "no worker acme.shop.green.99" in result.stderr


def test_users_waiting_their_turn_during_a_drain_keep_their_state(daemons, tmp_path):
    """While a drain moves users one at a time, the others go on being served, with their state, where they are:
    every user's counts go up by one each time, whichever worker answers (a user re-placed without its state would
    count from 1 again)."""
    d = daemons(TENANTS.format(root=tmp_path), extra_server=SERVER)
    d.start()
    pool = d.announced(2)
    reception = next(w["id"] for w in pool["workers"] if w["reception"])
    cookies = [browse(d, "/counter")[2] for _ in range(4)]
    counts: dict[str, list[int]] = {c: [1] for c in cookies}
    done = threading.Event()

    def browse_on(cookie: str) -> None:
        while not done.is_set():
            status, body, _ = browse(d, "/counter", cookie)
            assert status == 200, body
            counts[cookie].append(json.loads(body)["count"])

    threads = [threading.Thread(target=browse_on, args=(c,), daemon=True) for c in cookies]
    for t in threads:
        t.start()
    drained = d.ctl("drain", reception)
    done.set()
    for t in threads:
        t.join(30)
    assert drained.returncode == 0, drained.stderr
    for cookie, seen in counts.items():
        assert seen == list(range(1, len(seen) + 1)), (cookie, seen)
        assert len(seen) > 1
