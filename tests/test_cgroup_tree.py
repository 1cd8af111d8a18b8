from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from elasticd.cgroup import tree as tree_module
from elasticd.cgroup.tree import CgroupError, CgroupTree, write_file
from elasticd.config.model import Resources

G = 1024**3
M = 1024**2
ALL = "+cpu +memory +pids +io"


def _fake_base(path: Path, controllers: str = "cpu memory pids io") -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.procs").write_text("")
    return path


def _read(path: Path) -> str:
    return path.read_text()


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return _fake_base(tmp_path / "cg")


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every write the tree makes, as (path relative to nothing, value), while still writing."""
    seen: list[tuple[str, str]] = []

    def recording(path: Path, value: str) -> None:
        seen.append((str(path), value))
        write_file(path, value)

    monkeypatch.setattr(tree_module, "write_file", recording)
    return seen


@pytest.fixture
def on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every root is on 8:0 or 259:0 (tmp dirs are often on tmpfs/overlay, which have no disk)."""

    def disks_for_roots(roots: list[str], sys_root: str) -> tuple[list[str], list[str]]:
        found = {"8:0" if "/srv/" in r else "259:0" for r in roots if not r.startswith("/tmpfs")}
        ordered = [d for d in ("8:0", "259:0") if d in found]  # numeric order, as the real one sorts
        return ordered, [r for r in roots if r.startswith("/tmpfs")]

    monkeypatch.setattr(tree_module, "disks_for_roots", disks_for_roots)


def test_full_layout_and_limits(base: Path, on_disk: None, writes: list[tuple[str, str]]) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    leaf = cg.ensure_app("acme", "shop")
    problems = cg.apply_limits(
        "acme",
        Resources(cpu=150.0, memory=G, pids=512, io_weight=200, io_read=50 * M, io_write=20 * M),
        ["/srv/acme/shop", "/data/acme/blog"],
    )
    assert problems == []
    assert leaf == base / "tenants" / "acme" / "shop" and leaf.is_dir()
    assert not (base / "server").exists()  # only when <base> is our own cgroup
    assert _read(base / "cgroup.subtree_control") == ALL
    assert _read(base / "tenants" / "cgroup.subtree_control") == ALL
    tenant = base / "tenants" / "acme"
    assert _read(tenant / "cgroup.subtree_control") == ALL
    assert not (leaf / "cgroup.subtree_control").exists()  # leaves hold processes
    assert _read(tenant / "cpu.max") == "150000 100000"
    assert _read(tenant / "memory.max") == str(G)
    assert _read(tenant / "memory.swap.max") == "0"
    assert _read(tenant / "pids.max") == "512"
    assert _read(tenant / "io.weight") == "default 200"
    # One write per device: the kernel parses one per write(2).
    assert [v for p, v in writes if p.endswith("/io.max")] == [
        f"8:0 rbps={50 * M} wbps={20 * M}",
        f"259:0 rbps={50 * M} wbps={20 * M}",
    ]
    assert cg.controllers_of("acme") == frozenset({"cpu", "memory", "pids", "io"})
    assert cg.missing == []
    assert cg.inner_tenants() == ["acme"]
    assert cg.inner_apps("acme") == ["shop"]


def test_own_base_moves_elasticd_into_server_first(base: Path, writes: list[tuple[str, str]]) -> None:
    (base / "server").mkdir()  # left by a previous run: fine
    (base / ".control").mkdir()  # systemd's: never touched
    CgroupTree(base, base_is_own=True).setup()
    assert _read(base / "server" / "cgroup.procs") == str(os.getpid())
    assert writes[0] == (str(base / "server" / "cgroup.procs"), str(os.getpid()))
    assert writes[1] == (str(base / "cgroup.subtree_control"), ALL)
    assert list((base / ".control").iterdir()) == []


def test_setup_fails_when_it_cannot_leave_base(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path, value: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tree_module, "write_file", refuse)
    with pytest.raises(CgroupError, match="cannot move elasticd into"):
        CgroupTree(base, base_is_own=True).setup()


def test_missing_controllers_are_reported_once_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = _fake_base(tmp_path / "cg", "cpu pids")
    cg = CgroupTree(base, base_is_own=False)
    with caplog.at_level(logging.WARNING, logger="elasticd.cgroup"):
        cg.setup()
        for _ in range(2):
            cg.ensure_app("acme", "shop")
            cg.ensure_app("beta", "blog")
            assert cg.apply_limits("acme", Resources(memory=G, cpu=50.0, io_read=M), ["/srv/x"]) == []
    assert cg.missing == ["memory", "io"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("controller memory" in m for m in messages) == 1
    assert sum("controller io" in m for m in messages) == 1
    assert str(base) in next(m for m in messages if "controller memory" in m)
    tenant = base / "tenants" / "acme"
    assert _read(base / "cgroup.subtree_control") == "+cpu +pids"
    assert _read(tenant / "cgroup.subtree_control") == "+cpu +pids"
    assert _read(tenant / "cpu.max") == "50000 100000"
    assert _read(tenant / "pids.max") == "max"
    assert not (tenant / "memory.max").exists()
    assert not (tenant / "io.weight").exists()
    assert cg.controllers_of("acme") == frozenset({"cpu", "pids"})


def test_reapply_lifts_removed_limits(base: Path, on_disk: None) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    cg.ensure_app("acme", "shop")
    cg.apply_limits("acme", Resources(cpu=25.0, memory=G, pids=10, io_read=M), ["/srv/acme"])
    tenant = base / "tenants" / "acme"
    assert _read(tenant / "io.max") == f"8:0 rbps={M} wbps=max"
    cg.apply_limits("acme", Resources(pids=10), ["/srv/acme"])
    assert _read(tenant / "cpu.max") == "max 100000"
    assert _read(tenant / "memory.max") == "max"
    assert _read(tenant / "pids.max") == "10"
    assert _read(tenant / "io.max") == "8:0 rbps=max wbps=max"


def test_disks_no_longer_holding_a_root_are_lifted(
    base: Path, on_disk: None, writes: list[tuple[str, str]]
) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    tenant = cg.ensure_tenant("acme")
    # As the kernel lists it after an earlier run limited the app's old disk.
    (tenant / "io.max").write_text("259:0 rbps=1048576 wbps=max riops=max wiops=max\n")
    cg.apply_limits("acme", Resources(io_write=M), ["/srv/acme"])
    assert [v for p, v in writes if p.endswith("/io.max")] == [
        f"8:0 rbps=max wbps={M}",
        "259:0 rbps=max wbps=max",
    ]


def test_roots_on_no_block_device_are_reported_once_when_io_is_limited(
    base: Path, on_disk: None, caplog: pytest.LogCaptureFixture
) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    with caplog.at_level(logging.WARNING, logger="elasticd.cgroup"):
        assert cg.apply_limits("acme", Resources(), ["/tmpfs/app"]) == []
        first = cg.apply_limits("acme", Resources(io_read=M), ["/tmpfs/app"])
        second = cg.apply_limits("acme", Resources(io_read=M), ["/tmpfs/app"])
    assert len(first) == 1 and "/tmpfs/app" in first[0] and "no block device" in first[0]
    assert second == first
    assert sum("/tmpfs/app" in r.getMessage() for r in caplog.records) == 1


def test_a_failed_write_does_not_stop_the_others(base: Path, caplog: pytest.LogCaptureFixture) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    tenant = cg.ensure_tenant("acme")
    (tenant / "memory.max").mkdir()  # opening it for writing fails (EISDIR)
    with caplog.at_level(logging.WARNING, logger="elasticd.cgroup"):
        problems = cg.apply_limits("acme", Resources(cpu=10.0, memory=G, pids=3), [])
    assert len(problems) == 1
    assert "memory.max" in problems[0] and str(G) in problems[0]
    assert any("memory.max" in r.getMessage() for r in caplog.records)
    assert _read(tenant / "cpu.max") == "10000 100000"
    assert _read(tenant / "memory.swap.max") == "0"
    assert _read(tenant / "pids.max") == "3"


def test_subtree_control_falls_back_to_one_write_per_controller(
    base: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[str] = []

    def picky(path: Path, value: str) -> None:
        # Like the kernel: all-or-nothing per write, and io cannot be enabled here.
        if path.name == "cgroup.subtree_control":
            attempts.append(value)
            if " " in value or value == "+io":
                raise OSError(errno.EINVAL, "Invalid argument")
        write_file(path, value)

    monkeypatch.setattr(tree_module, "write_file", picky)
    cg = CgroupTree(base, base_is_own=False)
    with caplog.at_level(logging.WARNING, logger="elasticd.cgroup"):
        cg.setup()
        cg.ensure_tenant("acme")
    assert attempts[:5] == [ALL, "+cpu", "+memory", "+pids", "+io"]
    assert cg.missing == ["io"]
    assert cg.controllers_of("acme") == frozenset({"cpu", "memory", "pids"})
    warnings = [r.getMessage() for r in caplog.records if "controller io" in r.getMessage()]
    assert len(warnings) == 1 and "Invalid argument" in warnings[0]


def test_real_kernel_controller_files_win_over_the_parent_record(base: Path) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    tenant = cg.ensure_tenant("acme")
    (tenant / "cgroup.controllers").write_text("cpu memory\n")  # as the kernel would show it
    assert cg.controllers_of("acme") == frozenset({"cpu", "memory"})


def test_names_cannot_escape_the_base(base: Path) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    for bad in ("..", "../x", "a/b", "", "Acme", ".control"):
        with pytest.raises(ValueError):
            cg.ensure_tenant(bad)
        with pytest.raises(ValueError):
            cg.leaf("acme", bad)


def test_remove_app_and_tenant_on_a_fake_tree(base: Path, caplog: pytest.LogCaptureFixture) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    leaf = cg.ensure_app("acme", "shop")
    cg.ensure_app("acme", "blog")
    (leaf / "cgroup.procs").write_text("123\n456\n")  # what the trampoline wrote
    assert cg.procs_of("acme", "shop") == [123, 456]
    cg.apply_limits("acme", Resources(cpu=10.0), [])
    assert cg.remove_app("acme", "shop")
    assert not leaf.exists()
    assert cg.remove_app("acme", "shop")  # already gone
    assert cg.procs_of("acme", "shop") == []
    assert cg.inner_apps("acme") == ["blog"]
    assert cg.remove_tenant("acme")
    assert not (base / "tenants" / "acme").exists()
    assert cg.inner_tenants() == []


def test_remove_never_deletes_directories_inside(base: Path, caplog: pytest.LogCaptureFixture) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    leaf = cg.ensure_app("acme", "shop")
    (leaf / "nested").mkdir()
    with caplog.at_level(logging.WARNING, logger="elasticd.cgroup"):
        assert not cg.remove_app("acme", "shop")
    assert (leaf / "nested").is_dir()
    assert any(str(leaf) in r.getMessage() for r in caplog.records)


def test_remove_reports_busy(base: Path, monkeypatch: pytest.MonkeyPatch,
                             caplog: pytest.LogCaptureFixture) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    leaf = cg.ensure_app("acme", "shop")

    def busy(self: Path) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy", str(self))

    monkeypatch.setattr(Path, "rmdir", busy)
    with caplog.at_level(logging.WARNING, logger="elasticd.cgroup"):
        assert not cg.remove_app("acme", "shop")
    assert leaf.is_dir()
    assert any("processes" in r.getMessage() for r in caplog.records)


def test_kill_leaf(base: Path) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    leaf = cg.ensure_app("acme", "shop")
    assert not cg.kill_leaf("acme", "shop")
    assert not (leaf / "cgroup.kill").exists()  # never created in a fake tree
    (leaf / "cgroup.kill").write_text("")
    assert cg.kill_leaf("acme", "shop")
    assert _read(leaf / "cgroup.kill") == "1"


def test_inner_tenants_lists_only_our_names(base: Path) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    cg.ensure_tenant("zeta")
    cg.ensure_tenant("acme")
    (base / "tenants" / "Operator Group").mkdir()
    (base / "tenants" / "cgroup.weird").write_text("")
    assert cg.inner_tenants() == ["acme", "zeta"]


def test_write_file_replaces_content_in_one_write(tmp_path: Path) -> None:
    target = tmp_path / "cpu.max"
    write_file(target, "max 100000")
    write_file(target, "5000 100000")
    assert _read(target) == "5000 100000"
    with pytest.raises(FileNotFoundError):
        write_file(tmp_path / "missing-dir" / "cpu.max", "max")


def test_populated_reads_cgroup_events(base: Path) -> None:
    cg = CgroupTree(base, base_is_own=False)
    cg.setup()
    leaf = cg.ensure_app("acme", "shop")
    assert cg.populated("acme", "shop") is None  # a fake tree has no cgroup.events
    (leaf / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert cg.populated("acme", "shop") is True
    (leaf / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert cg.populated("acme", "shop") is False


def test_setup_error_is_an_oserror() -> None:
    assert issubclass(CgroupError, OSError)


def test_apply_limits_reports_a_tenant_it_cannot_create(tmp_path: Path) -> None:
    base = _fake_base(tmp_path / "cg")
    cg = CgroupTree(base, base_is_own=False)  # setup() not run: <base>/tenants is missing
    problems = cg.apply_limits("acme", Resources(), [])
    assert len(problems) == 1 and "acme" in problems[0]


class _BusyTree:
    """A tree whose leaf refuses rmdir (EBUSY: a process on its way out) a few times, then goes."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.removed: list[str] = []

    def kill_leaf(self, tenant: str, app: str) -> bool:
        return False

    def remove_app(self, tenant: str, app: str) -> bool:
        if self.busy:
            self.busy -= 1
            return False
        self.removed.append(f"{tenant}/{app}")
        return True

    def remove_tenant(self, tenant: str) -> bool:
        self.removed.append(tenant)
        return True


def _two_configs():
    from elasticd.config import parse_config
    text = """\
tenants:
  acme:
    apps:
      shop: {domains: [shop.localhost], root: /srv, groups: {g: {command: [app]}}}
      blog: {domains: [blog.localhost], root: /srv, groups: {g: {command: [app]}}}
"""
    old = parse_config(text)
    blog = "      blog: {domains: [blog.localhost], root: /srv, groups: {g: {command: [app]}}}\n"
    new = parse_config(text.replace(blog, ""))
    return old, new


async def test_a_removed_leaf_refused_with_ebusy_is_retried_until_it_goes() -> None:
    from elasticd.cgroup.activation import Activation
    old, new = _two_configs()
    placement = Activation()
    tree = placement.tree = _BusyTree(busy=3)  # type: ignore[assignment]
    await placement.remove_dropped(old, lambda: new, retry=0.01)
    assert tree.removed == ["acme/blog"] and tree.busy == 0


async def test_a_removed_leaf_configured_again_meanwhile_is_kept() -> None:
    from elasticd.cgroup.activation import Activation
    old, new = _two_configs()
    placement = Activation()
    tree = placement.tree = _BusyTree(busy=1000)  # type: ignore[assignment]
    current = {"config": new}

    async def bring_it_back() -> None:
        import asyncio
        await asyncio.sleep(0.05)
        current["config"] = old  # a later reload named the app again: its leaf stays

    import asyncio
    await asyncio.gather(placement.remove_dropped(old, lambda: current["config"], retry=0.01), bring_it_back())
    assert tree.removed == []
