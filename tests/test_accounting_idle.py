"""The sampler on a host of idle cgroups: what the kernel says is empty is read seldom, descriptors stay within
the sampler's share, and no open of its takes the reserve the admin socket and the front accept with."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elasticd.accounting import files as files_module
from elasticd.accounting.cadence import SETTLE_SECONDS
from elasticd.accounting.fake import FakeCgroup, write_fake_cgroup
from elasticd.accounting.sample import FILES
from elasticd.accounting.sampler import Sampler

INTERVAL = 5.0
SETTLE = int(SETTLE_SECONDS // INTERVAL)


def _cg(usage: int, populated: bool | None) -> FakeCgroup:
    return FakeCgroup(usage_usec=usage, memory_current=4096, pids_current=1, populated=populated)


def _host(root: Path, tenants: int, apps: int, populated: bool | None = False) -> dict[tuple[str, ...], Path]:
    targets: dict[tuple[str, ...], Path] = {}
    for t in range(tenants):
        tenant = root / f"t{t}"
        targets[("tenant", f"t{t}")] = tenant
        write_fake_cgroup(tenant, _cg(0, populated))
        for a in range(apps):
            targets[("app", f"t{t}", f"a{a}")] = tenant / f"a{a}"
            write_fake_cgroup(tenant / f"a{a}", _cg(0, populated))
    return targets


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def sampler():
    s = Sampler(sys_root="/nonexistent", interval=INTERVAL)
    yield s
    s.close()


def test_an_unpopulated_cgroup_is_read_when_it_goes_idle_then_seldom(tmp_path, sampler):
    targets = _host(tmp_path, 2, 3)
    sampler.set_targets(targets)
    sampler.sample_once(1.0)
    assert sampler.last_reads == 8  # every cgroup's final values, the tick each is first seen idle
    shop = ("app", "t0", "a0")
    for usage in (10, 20, 30):  # counters that move in the fake tree (the kernel's would not)
        write_fake_cgroup(targets[shop], _cg(usage, False))
        sampler.sample_once(2.0)
        assert sampler.last_reads <= 1  # the spread idle reads, no more
    assert shop in sampler.latest  # its last sample stays: the tenant's and app's series go on


def test_a_populated_app_and_an_app_holding_a_worker_are_read_every_tick(tmp_path, sampler):
    targets = _host(tmp_path, 2, 3)
    busy: set[tuple[str, str]] = set()
    sampler.set_busy(lambda: busy)
    sampler.set_targets(targets)
    sampler.sample_once(1.0)
    write_fake_cgroup(targets[("tenant", "t0")], _cg(0, True))
    write_fake_cgroup(targets[("app", "t0", "a1")], _cg(0, True))
    busy.add(("t1", "a2"))  # a worker just started: its pid may not be in the leaf yet
    for tick, usage in enumerate((100, 200, 300), start=2):
        for key in (("app", "t0", "a1"), ("app", "t1", "a2")):
            write_fake_cgroup(targets[key], _cg(usage, key[1] == "t0"))
        sampler.sample_once(float(tick))
        assert sampler.latest[("app", "t0", "a1")].cpu_usage_usec == usage
        assert sampler.latest[("app", "t1", "a2")].cpu_usage_usec == usage
    # the populated tenant t0 and the busy one t1 are active too; t0's other apps stay idle
    assert 4 <= sampler.last_reads <= 5


def test_without_cgroup_events_every_cgroup_is_read_every_tick(tmp_path, sampler):
    targets = _host(tmp_path, 2, 2, populated=None)  # a fake tree as elasticd makes it: the kernel says nothing
    sampler.set_targets(targets)
    for tick in range(1, 4):
        sampler.sample_once(float(tick))
        assert sampler.last_reads == 6


def test_an_idle_cgroup_gives_its_descriptors_back(tmp_path, sampler):
    targets = _host(tmp_path, 1, 1, populated=True)
    sampler.set_targets(targets)
    before = _open_fds()
    sampler.sample_once(1.0)
    assert _open_fds() - before == 2 * (len(FILES) + 1) == sampler.open_descriptors
    for key in targets:
        write_fake_cgroup(targets[key], _cg(5, False))
    sampler.sample_once(2.0)
    assert _open_fds() == before and sampler.open_descriptors == 0
    assert sampler.latest[("app", "t0", "a0")].cpu_usage_usec == 5  # read once more as it went idle


def test_descriptors_stay_within_the_share_however_many_cgroups_are_active(tmp_path, sampler):
    targets = _host(tmp_path, 10, 9, populated=True)  # 100 active cgroups: 1,000 descriptors if all kept
    sampler.set_targets(targets)
    sampler.fd_budget = 10 * (len(FILES) + 1)  # room for ten
    before = _open_fds()
    for tick in range(1, 4):
        write_fake_cgroup(targets[("app", "t9", "a8")], _cg(tick, True))
        sampler.sample_once(float(tick))
        assert _open_fds() - before <= sampler.fd_budget
        assert sampler.last_reads == 100  # the rest are read with descriptors opened and closed
        assert sampler.latest[("app", "t9", "a8")].cpu_usage_usec == tick


def test_no_open_takes_the_reserve(tmp_path, sampler, monkeypatch):
    targets = _host(tmp_path, 1, 2, populated=True)
    sampler.set_targets(targets)
    refused = files_module.descriptors_refused
    monkeypatch.setattr(files_module, "_ceiling", 0)  # every descriptor number is in the reserve
    before = _open_fds()
    sampler.sample_once(1.0)
    assert _open_fds() == before  # each one closed at once
    assert files_module.descriptors_refused > refused
    assert sampler.latest[("app", "t0", "a0")].cpu_usage_usec is None  # missing, not made up
    monkeypatch.setattr(files_module, "_ceiling", 1 << 30)
    sampler.sample_once(2.0)
    assert sampler.latest[("app", "t0", "a0")].cpu_usage_usec == 0


def test_read_now_of_an_idle_cgroup_is_its_last_sample_at_the_new_time(tmp_path, sampler):
    targets = _host(tmp_path, 1, 1)
    sampler.set_targets(targets)
    sampler.sample_once(1.0)
    key = ("app", "t0", "a0")
    write_fake_cgroup(targets[key], _cg(999, False))
    now = sampler.read_now({key: targets[key]}, 7.0)
    assert (now[key].ts, now[key].cpu_usage_usec) == (7.0, 0)  # no read: its counters cannot have moved
    assert sampler.latest[key].ts == 1.0


def test_settle_read_catches_writeback_after_the_last_exit(tmp_path, sampler):
    targets = _host(tmp_path, 1, 1)
    sampler.set_targets(targets)
    sampler.sample_once(1.0)
    key = ("app", "t0", "a0")
    write_fake_cgroup(targets[key], _cg(0, False).__class__(memory_current=1, populated=False))
    for tick in range(2, 2 * SETTLE + 2):  # (the settle's read falls within the next settle)
        sampler.sample_once(float(tick))
    assert sampler.latest[key].memory_bytes == 1


def test_activity_shows_an_app_while_active_and_for_the_window_after():
    from elasticd.accounting.activity import Activity
    activity = Activity(window=900.0)
    assert not activity.shown("t", "a", 0.0)  # never active: hidden
    activity.note("t", "a", 100.0)
    assert activity.shown("t", "a", 100.0) and activity.shown("t", "a", 1000.0)
    assert not activity.shown("t", "a", 1000.1) and activity.active_count(1000.1) == 0
    activity.configure(900.0, show_all=True)
    assert activity.shown("x", "y", 0.0)
    activity.configure(900.0, show_all=False)
    activity.forget(lambda tenant, app: False)
    assert not activity.shown("t", "a", 100.0)


def test_metrics_show_tenants_always_and_only_the_apps_that_ran(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from elasticd.accounting.activity import Activity
    from elasticd.accounting.tenant_metrics import AccountingCollector
    activity = Activity(window=900.0)
    sampler = Sampler(sys_root="/nonexistent", interval=INTERVAL, activity=activity)
    targets = _host(tmp_path, 2, 3)
    busy = {("t1", "a2")}
    sampler.set_busy(lambda: busy)
    sampler.set_targets(targets)
    sampler.sample_once(1.0)
    registry = CollectorRegistry()
    registry.register(AccountingCollector(sampler, dict, lambda t, a: activity.shown(t, a, 1.0)))
    text = generate_latest(registry).decode()
    apps = {line.split("{")[1].split("}")[0] for line in text.splitlines() if line.startswith("elasticd_app_pids")}
    assert apps == {'app="a2",tenant="t1"'} or apps == {'tenant="t1",app="a2"'}
    assert text.count("elasticd_tenant_pids{") == 2  # every tenant, always
    assert "elasticd_apps_shown 1.0" in text
    sampler.close()
