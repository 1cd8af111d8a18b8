"""Sticky users through the front with demo workers: each user stays on its worker, a dead worker's users
are re-placed, idle users are forgotten, and every forward is accounted to its user and worker."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_demo import DemoWorker
from test_front import client, front, no_errors_logged, run

from elasticd.front import Upstream

__all__ = ["no_errors_logged"]


@pytest.fixture
def two_workers(tmp_path: Path):
    started = [DemoWorker(w, f"unix:{tmp_path}/{w}.sock") for w in ("w1", "w2")]
    try:
        yield started
    finally:
        for worker in started:
            worker.stop()


async def visit(request: Callable[..., Any], user: str | None) -> tuple[str, str | None]:
    """One request of a user (None: a new one): the worker that answered, and the cookie it was given."""
    headers = {"Cookie": f"other=1; elastic_uid={user}"} if user else {}
    async with request("/", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        given = resp.cookies["elastic_uid"].value if "elastic_uid" in resp.cookies else None
        return (await resp.text()).split()[1], given


def test_each_user_stays_on_one_worker(two_workers: list[DemoWorker]) -> None:
    """2 workers, 20 users: users born while w1 was the reception stay on w1, those born after it became w2
    stay on w2, whatever the order of the workers when they come back."""
    w1, w2 = (Upstream(w.worker_id, w.socket_path) for w in two_workers)
    order = [w1, w2]

    async def scenario() -> dict[str, set[str]]:
        seen: dict[str, set[str]] = {}
        async with front(lambda: order) as f, client(f) as request:
            for i in range(20):
                if i == 10:
                    order[:] = [w2, w1]  # the reception changes: w2 is now first
                worker, user = await visit(request, None)
                assert user is not None
                seen[user] = {worker}
                worker, again = await visit(request, user)  # back with its cookie: enters the surface
                assert again is None  # no new cookie for a known user
                seen[user].add(worker)
            assert len(f.surface) == 20
            for round_ in range(5):
                order[:] = [w1, w2] if round_ % 2 else [w2, w1]
                for user in seen:
                    seen[user].add((await visit(request, user))[0])
            counters = {w: (c.requests, c.errors) for w, c in f.forwards.workers.items()}
            assert counters == {"w1": (70, 0), "w2": (70, 0)}
            # Every request counted, the first one too (made before the cookie, taken over when it came back)
            assert all(f.surface.users[user].requests == 7 for user in seen)
            assert len(f.surface.newcomers) == 0
        return seen

    seen = run(scenario())
    assert len(seen) == 20
    assert all(len(workers) == 1 for workers in seen.values())
    assert sorted(next(iter(w)) for w in seen.values()) == ["w1"] * 10 + ["w2"] * 10


def test_the_worker_gets_the_user_id(two_workers: list[DemoWorker]) -> None:
    ups = [Upstream(w.worker_id, w.socket_path) for w in two_workers]

    async def scenario() -> tuple[str, str, str]:
        async with front(ups) as f, client(f) as request:
            async with request("/echo", headers={"X-Elastic-User-Id": "forged"}) as resp:
                first = (await resp.json())["headers"]["X-Elastic-User-Id"]
                user = resp.cookies["elastic_uid"].value
            async with request("/echo", headers={"Cookie": f"elastic_uid={user}"}) as resp:
                second = (await resp.json())["headers"]["X-Elastic-User-Id"]
            return user, first, second

    user, first, second = run(scenario())
    assert first == second == user


def test_a_dead_workers_users_are_replaced(two_workers: list[DemoWorker]) -> None:
    """The reception is killed: the first request that meets it fails (502), the supervisor then drops it
    (close_upstream), and every user is re-placed on w2 — and stays there when w1 comes back."""
    w1, w2 = two_workers
    up1, up2 = (Upstream(w.worker_id, w.socket_path) for w in two_workers)
    routable = [up1, up2]  # what the supervisor says

    async def scenario() -> list[Any]:
        steps: list[Any] = []
        async with front(lambda: routable) as f, client(f) as request:
            users = []
            for _ in range(5):
                _, user = await visit(request, None)
                users.append(user)
                await visit(request, user)
            steps.append({f.surface.users[u].worker for u in users})
            w1.proc.send_signal(signal.SIGKILL)
            w1.proc.wait()
            async with request("/", headers={"Cookie": f"elastic_uid={users[0]}"}) as resp:
                steps.append((resp.status, "acme/shop" in await resp.text()))
            steps.append(set(f.health.unroutable))
            routable.remove(up1)  # the supervisor saw it exit
            f.close_upstream("w1")
            steps.append([(await visit(request, user))[0] for user in users])
            steps.append({f.surface.users[u].worker for u in users})
            two_workers[0] = DemoWorker("w1", w1.listen)  # restarted, and routable again
            routable.insert(0, up1)
            steps.append({(await visit(request, user))[0] for user in users})
            steps.append((await visit(request, None))[0])  # a new user: the reception, w1 again
        return steps

    placed, failed, unroutable, replaced, surface, stayed, new = run(scenario())
    assert placed == {"w1"}
    assert failed == (502, True) and unroutable == {"w1"}
    assert replaced == ["w2"] * 5 and surface == {"w2"}
    assert (stayed, new) == ({"w2"}, "w1")
    assert w2.proc.poll() is None


def test_idle_users_are_forgotten_with_their_consumption(two_workers: list[DemoWorker]) -> None:
    ups = [Upstream(w.worker_id, w.socket_path) for w in two_workers]
    now = [1000.0]

    async def scenario() -> tuple[int, int, int]:
        async with front(ups, timeout=0.4, user_ttl=60.0, clock=lambda: now[0]) as f, client(f) as request:
            _, user = await visit(request, None)
            await visit(request, user)
            _, other = await visit(request, None)
            await visit(request, other)
            counted = f.surface.users[user].requests
            now[0] += 30.0
            await visit(request, other)  # seen again: stays
            now[0] += 45.0  # user idle 75 s > ttl, other 45 s
            for _ in range(60):  # the front's tick expires them (every 0.1 s here)
                if user not in f.surface:
                    break
                await asyncio.sleep(0.05)
            return counted, len(f.surface), f.surface.users[other].requests

    assert run(scenario()) == (2, 1, 3)  # each user's first request (before its cookie) counted too
