"""The sampler on a fake cgroup tree: persistent descriptors, removal, recreation, ENODEV, retries."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path

import pytest

from elasticd import loop_slices
from elasticd.accounting import files as files_module
from elasticd.accounting.fake import FakeCgroup, write_fake_cgroup
from elasticd.accounting.files import CgroupFiles
from elasticd.accounting.parse import Pressure
from elasticd.accounting.sample import FILES, Sample
from elasticd.accounting.sampler import Sampler, read_once, stacked_devices


def _state(usage: int = 1000, memory: int = 4096, **kw) -> FakeCgroup:
    return FakeCgroup(usage_usec=usage, user_usec=usage // 2, system_usec=usage // 2, memory_current=memory,
                      pids_current=3, io={"8:0": (100, 200, 1, 2), "259:0": (10, 20, 3, 4)},
                      pressure={"io": (0.25, 700, 0.1, 300)}, **kw)


@pytest.fixture
def tree(tmp_path) -> dict[tuple[str, ...], Path]:
    targets = {("tenant", "acme"): tmp_path / "tenants" / "acme",
               ("app", "acme", "shop"): tmp_path / "tenants" / "acme" / "shop"}
    for path in targets.values():
        write_fake_cgroup(path, _state())
    return targets


@pytest.fixture
def sampler(tree):
    s = Sampler(sys_root="/nonexistent")
    s.set_targets(tree)
    yield s
    s.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_samples_every_file_and_follows_changes(tree, sampler):
    sampler.sample_once(10.0)
    shop = sampler.latest[("app", "acme", "shop")]
    assert shop == Sample(
        ts=10.0, cpu_usage_usec=1000, cpu_user_usec=500, cpu_system_usec=500, cpu_periods=0,
        cpu_throttled_periods=0, cpu_throttled_usec=0, memory_bytes=4096, swap_bytes=0,
        memory_events={"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0}, pids=3,
        io_read_bytes=110, io_write_bytes=220, io_read_ops=4, io_write_ops=6,
        cpu_pressure=Pressure(0, 0.0, 0, 0.0), memory_pressure=Pressure(0, 0.0, 0, 0.0),
        io_pressure=Pressure(700, 0.25, 300, 0.1))
    write_fake_cgroup(tree[("app", "acme", "shop")], _state(usage=5000, memory=8192, memory_events={"oom": 2}))
    sampler.sample_once(15.0)
    shop = sampler.latest[("app", "acme", "shop")]
    assert (shop.ts, shop.cpu_usage_usec, shop.memory_bytes, shop.memory_events["oom"]) == (15.0, 5000, 8192, 2)


def test_one_descriptor_per_file_kept_open(tree, sampler):
    before = _open_fds()
    sampler.sample_once(1.0)
    opened = _open_fds() - before
    assert opened == 2 * (len(FILES) + 1)  # nine files and the directory, per cgroup
    sampler.sample_once(2.0)
    assert _open_fds() - before == opened  # re-read, not reopened
    sampler.set_targets({("tenant", "acme"): tree[("tenant", "acme")]})
    assert _open_fds() - before == len(FILES) + 1  # the removed target's descriptors are closed
    assert list(sampler.latest) == [("tenant", "acme")]
    sampler.close()
    assert _open_fds() == before


def test_missing_files_are_missing_values(tmp_path):
    leaf = tmp_path / "bare"
    write_fake_cgroup(leaf, _state(), only=("cpu.stat",))  # a fake tree with one file, like no controllers
    sampler = Sampler(sys_root="/nonexistent")
    sampler.set_targets({("app", "t", "bare"): leaf, ("app", "t", "none"): tmp_path / "absent"})
    sampler.sample_once(1.0)
    assert sampler.latest[("app", "t", "bare")] == Sample(
        ts=1.0, cpu_usage_usec=1000, cpu_user_usec=500, cpu_system_usec=500, cpu_periods=0,
        cpu_throttled_periods=0, cpu_throttled_usec=0)
    assert sampler.latest[("app", "t", "none")] == Sample(ts=1.0)
    sampler.close()


def test_removed_cgroup_is_missing_then_picked_up_when_made_again(tree, sampler):
    shop = tree[("app", "acme", "shop")]
    sampler.sample_once(1.0)
    shutil.rmtree(shop)
    sampler.sample_once(2.0)
    assert sampler.latest[("app", "acme", "shop")] == Sample(ts=2.0)
    assert sampler.latest[("tenant", "acme")].cpu_usage_usec == 1000
    write_fake_cgroup(shop, _state(usage=42))
    sampler.sample_once(3.0)
    assert sampler.latest[("app", "acme", "shop")].cpu_usage_usec == 42
    assert sampler.latest[("app", "acme", "shop")].io_pressure == Pressure(700, 0.25, 300, 0.1)


def test_enodev_closes_everything_and_reopens_on_a_later_tick(tree, sampler, monkeypatch):
    """On cgroupfs a removed group's open files fail with ENODEV: all its descriptors go, values are
    missing, and the directory is opened afresh on the next tick."""
    sampler.sample_once(1.0)
    before = _open_fds()
    real_pread = files_module._pread
    shop_fds = set(sampler._files[("app", "acme", "shop")]._fds)

    def pread(fd, size, offset):
        if fd in shop_fds:
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, size, offset)

    monkeypatch.setattr(files_module, "_pread", pread)
    sampler.sample_once(2.0)
    assert sampler.latest[("app", "acme", "shop")] == Sample(ts=2.0)
    assert sampler.latest[("tenant", "acme")].memory_bytes == 4096
    assert _open_fds() == before - (len(FILES) + 1)
    monkeypatch.setattr(files_module, "_pread", real_pread)
    sampler.sample_once(3.0)
    assert sampler.latest[("app", "acme", "shop")].memory_bytes == 4096
    assert _open_fds() == before


def test_other_read_errors_drop_that_file_only(tree, sampler, monkeypatch):
    sampler.sample_once(1.0)
    files = sampler._files[("app", "acme", "shop")]
    pids_fd = files._fds[FILES.index("pids.current")]
    real_pread = files_module._pread

    def pread(fd, size, offset):
        if fd == pids_fd:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real_pread(fd, size, offset)

    monkeypatch.setattr(files_module, "_pread", pread)
    sampler.sample_once(2.0)
    shop = sampler.latest[("app", "acme", "shop")]
    assert shop.pids is None and shop.memory_bytes == 4096
    monkeypatch.setattr(files_module, "_pread", real_pread)
    sampler.sample_once(3.0)
    assert sampler.latest[("app", "acme", "shop")].pids == 3


def test_absent_files_are_retried_with_back_off_and_at_once_after_set_targets(tmp_path, monkeypatch):
    leaf = tmp_path / "leaf"
    write_fake_cgroup(leaf, _state(), only=("cpu.stat",))
    tries: list[int] = []
    real_open = files_module._open

    def counting_open(path, flags, mode=0o777, *, dir_fd=None):
        if path == "pids.current":
            tries.append(tick)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(files_module, "_open", counting_open)
    files = CgroupFiles(leaf)
    for tick in range(1, 40):
        files.read(tick)
    # After 1, 2, 4, then every 8 ticks: never more than once a tick.
    assert tries == [1, 2, 4, 8, 16, 24, 32]
    files.reset_retries()  # what set_targets does after an activation
    tick = 40
    write_fake_cgroup(leaf, _state(), only=("pids.current",))
    assert files.read(tick)[FILES.index("pids.current")] == b"3\n"
    files.close()


def test_read_now_leaves_latest_alone_and_reads_unknown_paths(tree, sampler, tmp_path):
    sampler.sample_once(1.0)
    latest = sampler.latest
    other = tmp_path / "other"
    write_fake_cgroup(other, _state(usage=77))
    write_fake_cgroup(tree[("tenant", "acme")], _state(usage=99))
    now = sampler.read_now({("tenant", "acme"): tree[("tenant", "acme")], ("tenant", "other"): other}, 5.0)
    assert now[("tenant", "acme")].cpu_usage_usec == 99 and now[("tenant", "other")].cpu_usage_usec == 77
    assert sampler.latest is latest and latest[("tenant", "acme")].cpu_usage_usec == 1000
    assert read_once(other, 6.0).cpu_usage_usec == 77


async def test_run_samples_every_interval_until_cancelled(tree, sampler):
    task = asyncio.get_running_loop().create_task(sampler.run(0.01))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if sampler.latest:
            break
    first = sampler.latest[("tenant", "acme")].ts
    write_fake_cgroup(tree[("tenant", "acme")], _state(usage=31337))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if sampler.latest[("tenant", "acme")].cpu_usage_usec == 31337:
            break
    assert sampler.latest[("tenant", "acme")].ts > first
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_stacked_devices_from_sysfs(tmp_path):
    """A disk counts as "lower" when it or one of its partitions is held by another device (LVM, dm-crypt)."""
    sys_root = tmp_path / "sys"
    devices = sys_root / "devices"

    def block(path: str, dev: str, holders: tuple[str, ...] = (), partition: bool = False) -> None:
        directory = devices / path
        (directory / "holders").mkdir(parents=True)
        for holder in holders:
            (directory / "holders" / holder).mkdir()
        (directory / "dev").write_text(dev + "\n")
        if partition:
            (directory / "partition").write_text("1\n")
        link = sys_root / "dev" / "block" / dev
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(directory)

    block("sda", "8:0")
    block("sda/sda1", "8:1", partition=True)
    block("sda/sda2", "8:2", holders=("dm-0",), partition=True)  # an LVM physical volume
    block("nvme0n1", "259:0", holders=("dm-1",))  # dm-crypt straight on the disk
    block("dm-0", "253:0")
    block("sdb", "8:16")
    assert stacked_devices(str(sys_root)) == {"8:0", "259:0"}
    assert stacked_devices(str(tmp_path / "nothing")) == frozenset()


def _tenants(tmp_path: Path, count: int) -> dict[tuple[str, ...], Path]:
    targets: dict[tuple[str, ...], Path] = {}
    for n in range(count):
        tenant = f"t{n:02d}"
        targets[("tenant", tenant)] = tmp_path / "tenants" / tenant
        targets[("app", tenant, "shop")] = tmp_path / "tenants" / tenant / "shop"
    for path in targets.values():
        write_fake_cgroup(path, _state())
    return targets


def test_a_pass_in_slices_reads_what_a_whole_pass_reads_and_shows_it_at_its_end(tmp_path):
    targets = _tenants(tmp_path, 5)
    whole, sliced = Sampler(sys_root="/nonexistent"), Sampler(sys_root="/nonexistent")
    whole.set_targets(targets)
    sliced.set_targets(targets)
    whole.sample_once(1.0)
    turns = 0
    for _ in sliced.sample_in_slices(1.0):  # a step after every tenant
        turns += 1
        assert sliced.latest == {}  # (never half a pass)
    assert turns == 5
    assert sliced.latest == whole.latest and len(sliced.latest) == 10
    assert sliced.last_reads == whole.last_reads == 10
    whole.close()
    sliced.close()


def test_a_pass_whose_targets_change_between_slices_stops_there(tmp_path):
    targets = _tenants(tmp_path, 4)
    sampler = Sampler(sys_root="/nonexistent")
    sampler.set_targets(targets)
    sampler.sample_once(1.0)
    passing = sampler.sample_in_slices(2.0)
    next(passing)  # one tenant read
    kept = {key: path for key, path in targets.items() if key[1] != "t03"}  # a reload removed a tenant meanwhile
    sampler.set_targets(kept)
    assert list(passing) == []  # the pass stops: what it holds was made for the targets before
    assert set(sampler.latest) == set(kept)
    assert {sample.ts for sample in sampler.latest.values()} == {1.0}  # the next pass reads them all
    sampler.sample_once(3.0)
    assert {sample.ts for sample in sampler.latest.values()} == {3.0}
    sampler.close()


async def test_run_lets_the_loop_go_between_slices(tmp_path, monkeypatch):
    targets = _tenants(tmp_path, 6)
    sampler = Sampler(sys_root="/nonexistent")
    sampler.set_targets(targets)
    turns: list[int] = []
    monkeypatch.setattr(loop_slices, "LOOP_SLICE", 0.0)  # a slice a tenant long

    async def other() -> None:  # the front's work, meanwhile
        while True:
            turns.append(len(sampler.latest))
            await asyncio.sleep(0)

    other_task = asyncio.get_running_loop().create_task(other())
    task = asyncio.get_running_loop().create_task(sampler.run(10.0))
    for _ in range(100):
        await asyncio.sleep(0)
        if sampler.latest:
            break
    task.cancel()
    other_task.cancel()
    assert len(sampler.latest) == 12
    assert turns.count(0) >= 6  # the other task ran between the pass's slices, before its end
    sampler.close()
