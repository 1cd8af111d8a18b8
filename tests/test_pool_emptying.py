"""Emptying a worker with live moves, in the pool's shell with stand-ins (the manager's fakes and a fake mover):
compaction moves users idle first and retires the worker once empty; a failed move stops the drain and keeps
the worker; an operator's drain starts a replacement under min_workers; the plan for an operator's drain."""

from __future__ import annotations

import asyncio

import pytest
from test_pool_manager import User, idle, manager

from elasticd.config.model import PoolSettings
from elasticd.pool.emptying import evacuate
from elasticd.pool.ledger import plan_evacuation
from elasticd.pool.move_machine import Move, MoveStats, MoveSummary, Outcome
from elasticd.pool.policy import WorkerView

W1, W2, W3 = "acme.shop.green.1", "acme.shop.green.2", "acme.shop.green.3"


class FakeMover:
    """Moves by re-pointing the fake surface; ``fail`` names users whose move aborts (target refused)."""

    def __init__(self, surface, fail: set[str] | None = None) -> None:
        self.surface, self.fail, self.calls = surface, fail or set(), []

    async def move(self, user: str, source: str, target: str, timeout: float) -> Move | str:
        self.calls.append((user, source, target))
        move = Move(len(self.calls), user, source, target, 0.0, timeout, stateful=True)
        move.quiesced(0.1)
        move.snapshot(b"state", 0.2)
        if user in self.fail:
            move.refused("no room", 0.3)
        else:
            move.sent()
            move.installed(0.3)
            self.surface.assign(user, target, 0.3)
        return move


async def _settle(check, timeout: float = 2.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never settled")


async def test_compaction_moves_the_users_then_retires_the_worker():
    m, supervisor = manager(2)
    m._surface.users = {"alice": User(W2, "alice"), "bob": User(W2, "bob")}
    mover = m.mover = FakeMover(m._surface)
    for t in range(6):
        for w in supervisor.workers:
            m.on_report(w.id, idle(), float(t))
    await _settle(lambda: supervisor.retired == [W2])
    assert sorted(c[0] for c in mover.calls) == ["alice", "bob"] and all(c[1:] == (W2, W1) for c in mover.calls)
    assert m._surface.users["alice"].worker == W1 and m.draining == set()


async def test_a_failed_move_stops_the_drain_and_keeps_the_worker():
    m, supervisor = manager(2)
    m._surface.users = {"alice": User(W2, "alice"), "bob": User(W2, "bob")}
    mover = m.mover = FakeMover(m._surface, fail={"alice", "bob"})
    for t in range(6):
        for w in supervisor.workers:
            m.on_report(w.id, idle(), float(t))
    await _settle(lambda: len(mover.calls) == 1 and not m.draining)
    assert supervisor.retired == [] and len(mover.calls) == 1  # the first failure stopped it
    assert m._surface.users["alice"].worker == W2 and m._surface.users["bob"].worker == W2


async def test_an_operators_drain_starts_a_replacement_under_min_workers_then_empties_and_retires():
    m, supervisor = manager(2, pool=PoolSettings(min_workers=2, max_workers=4))
    m._surface.users = {"alice": User(W1, "alice"), "guest": User(W1, None)}
    m.mover = FakeMover(m._surface)

    async def replacement_comes_up() -> None:
        await _settle(lambda: len(supervisor.workers) == 3)
        supervisor.workers[-1].routable = True

    up = asyncio.create_task(replacement_comes_up())
    result = await m.drain(W1)  # the reception itself
    await up
    assert result.empty and sorted(result.moved) == ["alice", "guest"]
    assert supervisor.retired == [W1] and [w.id for w in supervisor.workers] == [W2, W3]
    assert {m._surface.users[u].worker for u in ("alice", "guest")} <= {W2, W3}
    decisions = m.describe("acme", "shop", lambda w: [])["groups"]["green"]["decisions"]
    assert any(d["decision"] == "scale-up" and "drained by an operator" in d["reason"] for d in decisions)


async def test_an_operators_drain_while_elasticd_stops_keeps_the_worker_and_its_users():
    """Under min_workers a drain first needs a replacement; while elasticd stops none can start (add_worker says
    None): the drain is refused, naming why, and nothing moved or retired."""
    m, supervisor = manager(2, pool=PoolSettings(min_workers=2, max_workers=4))
    m._surface.users = {"alice": User(W1, "alice")}
    m.mover = FakeMover(m._surface)
    supervisor.add_worker = lambda key: None  # the supervisor is stopping
    with pytest.raises(ValueError, match=f"no replacement for {W1} can start now .* it is kept, with its users"):
        await m.drain(W1)
    assert supervisor.retired == [] and m._surface.users["alice"].worker == W1 and not m.draining
    assert m.mover.calls == []


async def test_an_operators_drain_of_an_unknown_worker_is_refused():
    m, _ = manager(2)
    with pytest.raises(KeyError):
        await m.drain("acme.shop.green.9")
    with pytest.raises(KeyError):
        await m.drain("not-a-worker-id")


async def test_evacuate_waits_for_a_users_tunnel_then_moves_it():
    m, _ = manager(2)
    m._surface.users = {"alice": User(W2, "alice")}
    tunnels = {"alice": 1}
    mover = FakeMover(m._surface)
    moving = asyncio.create_task(evacuate(mover, W2, [("alice", W1)], move_timeout=1.0,
                                          tunnels_of=lambda u: tunnels.get(u, 0), drain_timeout=5.0))
    await asyncio.sleep(0.3)
    assert mover.calls == []  # not moved while its tunnel is open
    tunnels.clear()
    result = await moving
    assert result.moved == ["alice"] and result.empty


@pytest.mark.parametrize(("survivors", "loads", "users", "plan"), [
    # idle users first, each to the least-occupied outer survivor as projected
    ([(W1, 0.1), (W3, 0.2)], {"a": 0.3, "b": 0.0}, ["a", "b"], [("b", W3), ("a", W3)]),
    ([(W1, 0.1), (W3, 0.5), ("acme.shop.green.4", 0.1)], {"a": 0.3, "b": 0.2}, ["a", "b"],
     [("b", "acme.shop.green.4"), ("a", "acme.shop.green.4")]),
    ([(W1, 0.1), (W3, 0.2), ("acme.shop.green.4", 0.25)], {"a": 0.3, "b": 0.2}, ["a", "b"],
     [("b", W3), ("a", "acme.shop.green.4")]),
    # only the reception is left: it takes them
    ([(W1, 0.4)], {"a": 0.3}, ["a"], [("a", W1)]),
    ([], {}, ["a"], []),  # nowhere to go
])
def test_the_plan_of_an_operators_drain(survivors, loads, users, plan):
    views = [WorkerView(w, o) for w, o in survivors]
    assert plan_evacuation(W2, views, loads, users) == plan


def test_move_stats_count_outcomes_and_bucket_durations():
    stats = MoveStats()
    stats.add("acme", "shop", MoveSummary("u", W1, W2, Outcome.MOVED, 0.003, 10, ""))
    stats.add("acme", "shop", MoveSummary("v", W1, W2, Outcome.TARGET_TIMEOUT, 10.0, 10, "silent"))
    assert stats.outcomes == {("acme", "shop", "moved"): 1, ("acme", "shop", "target-timeout"): 1}
    assert stats.buckets[0] == 1 and stats.buckets[10] == 1 and stats.count == 2


def test_a_move_that_ended_is_journaled_in_its_group():
    m, _ = manager(2)
    moved = Move(1, "alice", W2, W1, 0.0, 10.0, stateful=True)
    moved.quiesced(0.01)
    moved.snapshot(b"x" * 100, 0.02)
    moved.sent()
    moved.installed(0.03)
    m.record_move(moved, moved.summary())
    aborted = Move(2, "bob", W2, W1, 0.0, 10.0, stateful=True)
    aborted.tick(10.0)
    m.record_move(aborted, aborted.summary())
    decisions = m.describe("acme", "shop", lambda w: [])["groups"]["green"]["decisions"]
    move, failed = decisions[-2], decisions[-1]
    assert (move["decision"], move["worker"], move["reason"]) == ("move", W2, f"alice moved to {W1}")
    assert move["numbers"] == {"user": "alice", "to": W1, "ms": 30.0, "package_bytes": 100, "outcome": "moved"}
    assert failed["decision"] == "move-aborted" and failed["reason"] == (
        f"bob stays on {W2}: quiesce-timeout: bob still had a request open after 10s")
