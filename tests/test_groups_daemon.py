"""Groups as runtime versions through the real daemon and real demo workers: a 10 % canary, a blue/green switch
on reload that keeps every placed user where it is, and a group at min_workers 0 that starts on its first request
and goes back to zero when idle."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from harness import browse

SERVER = "  occupancy_interval: 200ms\n  hung_after: 3s\n"


def _worker_of(body: str) -> str:
    return body.split()[1]  # the demo's "/": "worker acme.shop.blue.1 pid 123"


def _wait_status(d, predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        groups = d.status()["tenants"]["acme"]["apps"]["shop"]["groups"]
        if predicate(groups):
            return groups
        assert time.monotonic() < deadline, f"{what}: {json.dumps(groups)[:2000]}"
        time.sleep(0.1)


def _running(groups: dict, group: str) -> int:
    return sum(1 for w in groups[group]["workers"] if w["state"] == "running")


CANARY = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        default_group: green
        canary: {{group: blue, share: 10%}}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 1, max_workers: 1}}
          blue:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 1, max_workers: 1}}
"""


def test_a_ten_percent_canary_gets_about_a_tenth_of_new_users_and_each_stays(daemons, tmp_path):
    d = daemons(CANARY.format(root=tmp_path), extra_server=SERVER)
    d.start()
    _wait_status(d, lambda g: _running(g, "green") == 1 and _running(g, "blue") == 1, "both groups running")
    placed: dict[str, str] = {}
    for _ in range(200):
        status, body, cookie = browse(d, "/")
        assert status == 200 and cookie
        placed[cookie] = _worker_of(body)
    on_canary = sum(1 for worker in placed.values() if worker == "acme.shop.blue.1")
    assert 6 <= on_canary <= 36, on_canary  # Binomial(200, 0.1): 20 ± 3.3 sigma
    for cookie, worker in placed.items():  # sticky: every user comes back to its group's worker, twice
        for _ in range(2):
            status, body, _ = browse(d, "/", cookie)
            assert status == 200 and _worker_of(body) == worker
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    # the first request of each user (its cookie not yet back) is routed by the same rule: one count per user
    assert f'elasticd_group_routing_total{{app="shop",group="blue",reason="canary",tenant="acme"}} {on_canary}.0' \
        in metrics
    assert (f'elasticd_group_routing_total{{app="shop",group="green",reason="default",tenant="acme"}} '
            f'{200 - on_canary}.0') in metrics
    groups = d.status()["tenants"]["acme"]["apps"]["shop"]["groups"]
    assert groups["blue"]["sticky_users"] == on_canary and groups["green"]["sticky_users"] == 200 - on_canary


SWITCH = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        default_group: {default}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 1, max_workers: 2}}
          blue:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{DEMO_GREETING: blue}}
            pool: {{min_workers: 1, max_workers: 2}}
"""


def test_a_blue_green_switch_keeps_placed_users_and_the_old_group_empties_out(daemons, tmp_path):
    d = daemons(SWITCH.format(root=tmp_path, default="green"), extra_server=SERVER)
    d.start()
    groups = _wait_status(d, lambda g: _running(g, "green") == 1, "green running")
    assert groups["blue"]["workers"] == []  # neither default nor canary: it starts no worker
    users = []
    for n in range(5):
        _, body, cookie = browse(d, f"/login?name=user{n}")
        assert "logged in on acme.shop.green.1" in body
        users.append(cookie)
    _, guest_body, guest = browse(d, "/")
    assert _worker_of(guest_body) == "acme.shop.green.1"

    d.write_config(SWITCH.format(root=tmp_path, default="blue"))
    assert d.ctl("reload").returncode == 0
    _wait_status(d, lambda g: _running(g, "blue") == 1, "blue running after the switch")
    _, body, newcomer = browse(d, "/")
    assert body.startswith("blue\n"), body  # new users go to the new default
    assert browse(d, "/", newcomer)[1].startswith("blue\n")  # (back with its cookie: on the surface)
    for cookie in [*users, guest]:  # every placed user stays where it is
        _, body, _ = browse(d, "/", cookie)
        assert _worker_of(body) == "acme.shop.green.1", body
    groups = d.status()["tenants"]["acme"]["apps"]["shop"]["groups"]
    assert groups["green"]["sticky_users"] == 6 and groups["blue"]["sticky_users"] == 1
    assert not groups["green"]["active"]
    for cookie in users:  # they log out: chosen again at their next request, they go to blue
        browse(d, "/logout", cookie)
        _, body, _ = browse(d, "/", cookie)
        assert body.startswith("blue\n"), body
    # The guest is still on green: green keeps its worker for it.
    groups = d.status()["tenants"]["acme"]["apps"]["shop"]["groups"]
    assert groups["green"]["sticky_users"] == 1 and _running(groups, "green") == 1
    _, body, _ = browse(d, "/logout", guest)
    browse(d, "/", guest)
    groups = _wait_status(d, lambda g: not g["green"]["workers"], "green back to zero once its last user left")
    assert groups["blue"]["sticky_users"] == 7


LAZY = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          lazy:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 0, max_workers: 2, idle_timeout: 1s}}
"""


def test_a_group_at_zero_starts_on_its_first_request_and_goes_back_to_zero_when_idle(daemons, tmp_path):
    d = daemons(LAZY.format(root=tmp_path), extra_server=SERVER + "  user_ttl: 2s\n")
    d.start()
    groups = d.status()["tenants"]["acme"]["apps"]["shop"]["groups"]
    assert groups["lazy"]["workers"] == []  # at zero from the start
    started = time.monotonic()
    status, body, cookie = browse(d, "/")
    cold = time.monotonic() - started
    assert status == 200 and _worker_of(body) == "acme.shop.lazy.1", body
    print(f"cold start answered in {cold:.2f}s")
    assert browse(d, "/", cookie)[0] == 200
    pool = d.pool("acme/shop", "lazy")
    assert pool["cold_starts"]["count"] == 1 and 0 < pool["cold_starts"]["last_seconds"] < cold + 0.5
    # Idle: its user expires (user_ttl 2s), then idle_timeout (1s) later the worker goes.
    _wait_status(d, lambda g: not g["lazy"]["workers"], "back to zero when idle", timeout=20)
    retire = [x for x in d.pool("acme/shop", "lazy")["decisions"] if x["decision"] == "retire"]
    assert retire and "idle_timeout 1s" in retire[-1]["reason"]
    status, body, _ = browse(d, "/")
    assert status == 200 and _worker_of(body) == "acme.shop.lazy.2"  # a second cold start
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'elasticd_cold_starts_total{app="shop",group="lazy",tenant="acme"} 2.0' in metrics
    assert 'elasticd_cold_start_seconds_count{app="shop",group="lazy",tenant="acme"} 2.0' in metrics


BROKEN = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          lazy:
            command: ["/bin/false"]
            pool: {{min_workers: 0}}
"""


def test_a_cold_start_that_fails_answers_503_with_retry_after(daemons, tmp_path):
    d = daemons(BROKEN.format(root=tmp_path), extra_server=SERVER + "  request_timeout: 5s\n")
    d.start()
    started = time.monotonic()
    status, body, headers = d.get("shop.localhost", "/")
    took = time.monotonic() - started
    assert status == 503 and "group lazy" in body and took < 5.0, (status, body, took)
    assert headers.get("Retry-After") == "5"


SILENT = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          lazy:
            command: ["sleep", "60"]
            pool: {{min_workers: 0, max_workers: 1}}
"""


def test_a_cold_start_that_never_comes_up_is_answered_503_at_the_request_timeout(daemons, tmp_path):
    """A worker that runs but never listens: the waiting request gets its 503 + Retry-After at request_timeout,
    not a connection closed without an answer."""
    d = daemons(SILENT.format(root=tmp_path), extra_server=SERVER.replace("hung_after: 3s", "hung_after: 30s")
                + "  request_timeout: 2s\n")
    d.start()
    started = time.monotonic()
    status, body, headers = d.get("shop.localhost", "/")
    took = time.monotonic() - started
    assert status == 503 and "no worker came up within 2s" in body, (status, body)
    assert headers.get("Retry-After") == "5" and 1.5 < took < 6.0, took


def test_new_users_during_a_blue_green_switch_wait_for_the_new_group_rather_than_fail(daemons, tmp_path):
    """The new default starts from zero at the switch (it was neither default nor canary): requests of new users
    meanwhile wait for it (or are served by green before the switch), never a 503; one worker, not two."""
    config = SWITCH.replace("pool: {{min_workers: 1, max_workers: 2}}\n          blue",
                            "pool: {{min_workers: 1, max_workers: 2}}\n          blue") \
        .replace("env: {{DEMO_GREETING: blue}}\n            pool: {{min_workers: 1, max_workers: 2}}",
                 "env: {{DEMO_GREETING: blue}}\n            pool: {{min_workers: 1, max_workers: 1}}")
    d = daemons(config.format(root=tmp_path, default="green"), extra_server=SERVER)
    d.start()
    _wait_status(d, lambda g: _running(g, "green") == 1, "green running")
    d.write_config(config.format(root=tmp_path, default="blue"))
    reload = threading.Thread(target=d.ctl, args=("reload",))
    answers = []
    reload.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, body, _ = browse(d, "/")
        answers.append((status, body.split("\n")[0]))
        if body.startswith("blue\n") and not reload.is_alive():
            break
    reload.join(30)
    assert all(status == 200 for status, _ in answers), answers
    assert answers[-1][1] == "blue"
    groups = _wait_status(d, lambda g: _running(g, "blue") == 1, "blue running")
    assert len(groups["blue"]["workers"]) == 1  # the switch's own start and a cold start did not both happen
