"""The file half of ``--persist``: backup, atomic replace, owner and mode, the lock, and real failures
(a read-only mount, a full disk, a writer killed half-way) that must leave the config byte-identical."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from elasticd.config import parse_config
from elasticd.limits.persist import LimitEdit, PersistError, persist_limits

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 10, 5, 12, 34, 56, tzinfo=UTC)
LOCK = "elastic.yaml.lock"

CONFIG = """\
# elasticd test config
tenants:
  acme:
    resources:
      cpu: 150%      # a comment
      memory: 1G
    apps:
      shop:
        domains: [shop.localhost]
        root: /srv/acme/shop
        groups:
          green:
            command: ["{python}", "-m", "elasticd.demo"]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "etc" / "elastic.yaml"
    path.parent.mkdir()
    path.write_text(CONFIG)
    return path


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def resources(path: Path):
    return parse_config(path.read_text()).tenants["acme"].resources


def assert_untouched(path: Path, before: dict[str, bytes]) -> None:
    """The config is byte-identical and nothing new is in its directory but the (empty) lock file."""
    after = files(path.parent)
    assert after.pop(LOCK, b"") == b""
    before = dict(before)
    before.pop(LOCK, None)
    assert after == before


def is_tmp(name: str) -> bool:
    return name.startswith(".elastic.yaml.persist-") and name.endswith(".tmp")


# --------------------------------------------------------------------------------------------- the happy path


def test_persist_replaces_the_file_and_keeps_a_timestamped_backup(config):
    old = config.read_bytes()
    old_inode = config.stat().st_ino
    result = persist_limits(config, "acme", LimitEdit(cpu="50%", pids=256), now=NOW)
    assert result.path == config
    assert result.backup == config.parent / "elastic.yaml.bak.20261005T123456Z"
    assert result.changed_lines == 2
    assert result.backup.read_bytes() == old
    assert config.read_text() == CONFIG.replace("cpu: 150%      #", "cpu: 50%       #").replace(
        "      memory: 1G\n", "      memory: 1G\n      pids: 256\n")
    assert config.stat().st_ino != old_inode  # replaced by rename, not rewritten in place
    assert sorted(files(config.parent)) == ["elastic.yaml", "elastic.yaml.bak.20261005T123456Z", LOCK]

    # The same second again: the first backup is not overwritten.
    second = persist_limits(config, "acme", LimitEdit(memory="512M"), now=NOW)
    assert second.backup == config.parent / "elastic.yaml.bak.20261005T123456Z.1"
    assert result.backup.read_bytes() == old
    assert resources(second.backup).pids == 256
    assert resources(config).memory == 512 * 1024**2


def test_the_backup_time_is_utc(config):
    local = datetime(2026, 10, 5, 14, 34, 56, tzinfo=timezone(timedelta(hours=2)))
    assert persist_limits(config, "acme", LimitEdit(cpu="50%"), now=local).backup.name == (
        "elastic.yaml.bak.20261005T123456Z")
    before = datetime.now(UTC).replace(microsecond=0)
    backup = persist_limits(config, "acme", LimitEdit(cpu="60%")).backup
    stamp = datetime.strptime(backup.name.removeprefix("elastic.yaml.bak."), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert before <= stamp <= datetime.now(UTC)


def test_nothing_to_change_writes_nothing(config):
    st = config.stat()
    result = persist_limits(config, "acme", LimitEdit(cpu="150%"))
    assert (result.backup, result.changed_lines) == (None, 0)
    assert (config.stat().st_ino, config.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert sorted(files(config.parent)) == ["elastic.yaml", LOCK]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("hard_links", [True, False], ids=["backup-by-link", "backup-by-copy"])
def test_owner_and_mode_are_kept(config, monkeypatch, hard_links):
    os.chown(config, 1234, 1234)
    os.chmod(config, 0o640)
    old_inode = config.stat().st_ino
    if not hard_links:  # e.g. a filesystem without them: the backup is a copy, with the same owner and mode
        def no_link(*args, **kwargs):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(os, "link", no_link)
    result = persist_limits(config, "acme", LimitEdit(memory="2G"), now=NOW)
    for path in (config, result.backup):
        st = path.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 1234, 1234), path
    assert result.backup.read_text() == CONFIG
    assert (result.backup.stat().st_ino == old_inode) is hard_links  # a link is the old file itself


def test_a_symlinked_config_is_edited_where_it_lives(config, tmp_path):
    link = tmp_path / "elastic.yaml"
    link.symlink_to(config)
    result = persist_limits(link, "acme", LimitEdit(cpu="50%"), now=NOW)
    assert link.is_symlink() and result.path == config
    assert resources(link).cpu == 50.0
    assert result.backup.parent == config.parent


def test_short_writes_are_completed(config, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    persist_limits(config, "acme", LimitEdit(cpu="50%"))
    assert resources(config).cpu == 50.0
    assert parse_config(config.read_text()).tenants["acme"].apps["shop"].root == "/srv/acme/shop"


# --------------------------------------------------------------------------------------------- refusals


def test_an_invalid_value_changes_nothing(config):
    before = files(config.parent)
    with pytest.raises(PersistError) as caught:
        persist_limits(config, "acme", LimitEdit(cpu="fifty"))
    assert 'tenants.acme.resources.cpu (line 5): "fifty" is not a percentage' in str(caught.value)
    assert str(config) in str(caught.value)
    assert_untouched(config, before)


def test_an_unknown_tenant_changes_nothing(config):
    before = files(config.parent)
    with pytest.raises(PersistError, match=rf"^{config}: no tenant 'globex' in the file \(tenants: acme\)"):
        persist_limits(config, "globex", LimitEdit(cpu="50%"))
    assert_untouched(config, before)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(PersistError, match=rf"cannot read {tmp_path}/nope.yaml: No such file"):
        persist_limits(tmp_path / "nope.yaml", "acme", LimitEdit(cpu="50%"))


def test_a_failed_rename_takes_the_backup_back(config, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(os, "replace", broken)
    before = files(config.parent)
    with pytest.raises(PersistError, match=rf"cannot replace {config}: Input/output error"):
        persist_limits(config, "acme", LimitEdit(cpu="50%"), now=NOW)
    assert_untouched(config, before)


def test_a_file_changed_by_someone_else_meanwhile_is_not_overwritten(config, monkeypatch):
    from elasticd.limits import persist

    real = persist.check_edit

    def and_an_editor_saves(*args, **kwargs):
        real(*args, **kwargs)
        config.write_text(CONFIG.replace("1G", "3G"))
    monkeypatch.setattr(persist, "check_edit", and_an_editor_saves)
    with pytest.raises(PersistError, match="changed while it was being edited"):
        persist_limits(config, "acme", LimitEdit(cpu="50%"))
    assert config.read_text() == CONFIG.replace("1G", "3G")
    assert not [n for n in os.listdir(config.parent) if is_tmp(n) or ".bak." in n]


# --------------------------------------------------------------------------------------------- concurrency


def slow_fsync(monkeypatch, seconds: float = 0.2) -> None:
    """Widen the window between reading the file and renaming over it: without the lock, edits would be lost."""
    real = os.fsync

    def slow(fd: int) -> None:
        time.sleep(seconds)
        real(fd)
    monkeypatch.setattr(os, "fsync", slow)


EDITS = [LimitEdit(cpu="50%"), LimitEdit(memory="512M"), LimitEdit(pids=100), LimitEdit(io_weight=300),
         LimitEdit(io_read="10M"), LimitEdit(io_write="20M")]
LANDED = {"cpu": 50.0, "memory": 512 * 1024**2, "pids": 100, "io_weight": 300, "io_read": 10 * 1024**2,
          "io_write": 20 * 1024**2}


def assert_all_landed(path: Path, keys) -> None:
    res = resources(path)
    assert {k: getattr(res, k) for k in keys} == {k: LANDED[k] for k in keys}
    assert not [n for n in os.listdir(path.parent) if is_tmp(n)]


def test_two_threads_both_land(config, monkeypatch):
    slow_fsync(monkeypatch)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda e: persist_limits(config, "acme", e), EDITS[:2]))
    assert_all_landed(config, ["cpu", "memory"])
    assert len({r.backup for r in results}) == 2  # one after the other, each keeping what it replaced


async def test_many_calls_through_asyncio_to_thread_all_land(config, monkeypatch):
    slow_fsync(monkeypatch, 0.05)
    await asyncio.gather(*(asyncio.to_thread(persist_limits, config, "acme", e) for e in EDITS))
    assert_all_landed(config, LANDED)


CHILD = """
import os, signal, sys, time
from elasticd.limits.persist import LimitEdit, persist_limits

how, path, key, value = sys.argv[1:]
if how == "slow":
    real = os.fsync
    os.fsync = lambda fd: (time.sleep(0.3), real(fd))[1]
elif how.startswith("kill-at-"):  # die, as with a power cut or an OOM kill, at the first call of os.<name>
    setattr(os, how.removeprefix("kill-at-"), lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))
persist_limits(path, "acme", LimitEdit(**{key: int(value) if value.isdigit() else value}))
"""


def child(how: str, path: Path, key: str, value: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-c", CHILD, how, str(path), key, value], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)


def test_two_processes_both_land(config):
    procs = [child("slow", config, "cpu", "50%"), child("slow", config, "io_write", "20M")]
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        proc.stderr.close()
    assert_all_landed(config, ["cpu", "io_write"])
    assert len([n for n in os.listdir(config.parent) if ".bak." in n]) == 2


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_call_waits_for_another_process_then_lands_or_gives_up(config):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(config.parent / LOCK), "1.0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(PersistError, match=rf"being edited by another process \(it holds .*/{LOCK}\)"):
            persist_limits(config, "acme", LimitEdit(cpu="50%"), timeout=0.2)
        assert config.read_text() == CONFIG
        started = time.monotonic()
        persist_limits(config, "acme", LimitEdit(cpu="50%"))  # waits for the holder to let go
        assert time.monotonic() - started > 0.3
        assert holder.poll() is not None
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert resources(config).cpu == 50.0


def test_a_call_queued_behind_another_in_this_process_gives_up_after_its_timeout(config):
    fd = os.open(config.parent / LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # flock locks belong to an open file, so this counts as another editor
        first = threading.Thread(target=persist_limits, args=(config, "acme", LimitEdit(cpu="50%")))
        first.start()
        first.join(0.3)
        assert first.is_alive() and config.read_text() == CONFIG
        with pytest.raises(PersistError, match=r"being edited by another request: gave up after 0\.2s"):
            persist_limits(config, "acme", LimitEdit(memory="2G"), timeout=0.2)
    finally:
        os.close(fd)
    first.join(10)
    assert resources(config).cpu == 50.0


# --------------------------------------------------------------------------------------------- a killed writer


@pytest.mark.parametrize("point", ["fsync", "link", "replace"])
def test_a_writer_killed_before_the_rename_leaves_the_config_as_it_was(config, point):
    """SIGKILL at the fsync of the new text, before the backup link, and between write and rename."""
    old = config.read_bytes()
    proc = child(f"kill-at-{point}", config, "memory", "2G")
    assert proc.wait(timeout=60) == -signal.SIGKILL
    proc.stderr.close()
    assert config.read_bytes() == old
    left = [n for n in os.listdir(config.parent) if is_tmp(n)]
    assert len(left) == 1  # nothing can clean up after SIGKILL: the next call does
    for name in os.listdir(config.parent):
        if ".bak." in name:  # killed after the backup link: it is the old file, complete
            assert (config.parent / name).read_bytes() == old
    persist_limits(config, "acme", LimitEdit(memory="2G"))
    assert not [n for n in os.listdir(config.parent) if is_tmp(n)]
    assert resources(config).memory == 2 * 1024**3


def test_stale_temporary_files_are_removed_and_nothing_else(config):
    for name in (".elastic.yaml.persist-99999-deadbeef.tmp", ".elastic.yaml.swp", "other.tmp",
                 ".other.yaml.persist-1-00000000.tmp"):
        (config.parent / name).write_text("x")
    persist_limits(config, "acme", LimitEdit(cpu="50%"))
    assert ".elastic.yaml.persist-99999-deadbeef.tmp" not in os.listdir(config.parent)
    for name in (".elastic.yaml.swp", "other.tmp", ".other.yaml.persist-1-00000000.tmp"):
        assert (config.parent / name).exists()


# --------------------------------------------------------------------------------------------- real mounts


@pytest.fixture
def tmpfs(tmp_path):
    """Mount small tmpfs file systems under tmp_path (root only); each is unmounted, by its path, at the end."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", str(point)], check=False)


def remount_ro(point: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)


def test_a_read_only_directory_changes_nothing(tmpfs):
    point = tmpfs("ro", "1M")
    config = point / "elastic.yaml"
    config.write_text(CONFIG)
    persist_limits(config, "acme", LimitEdit(cpu="50%"), now=NOW)  # the lock file exists from now on
    remount_ro(point)
    before = files(point)
    with pytest.raises(PersistError, match=rf"cannot write {point}: Read-only file system"):
        persist_limits(config, "acme", LimitEdit(memory="2G"), now=NOW + timedelta(seconds=1))
    assert files(point) == before


def test_a_read_only_directory_without_a_lock_file_changes_nothing(tmpfs):
    point = tmpfs("ro", "1M")
    (point / "elastic.yaml").write_text(CONFIG)
    remount_ro(point)
    before = files(point)
    with pytest.raises(PersistError, match=rf"cannot create the lock file {point}/{LOCK}: Read-only file system"):
        persist_limits(point / "elastic.yaml", "acme", LimitEdit(memory="2G"))
    assert files(point) == before


def test_a_disk_that_fills_during_the_write_changes_nothing(tmpfs):
    point = tmpfs("full", "64k")
    config = point / "elastic.yaml"
    config.write_text(CONFIG)
    (point / LOCK).touch()
    filler = os.open(point / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # take every free block: the next one written hits ENOSPC
        while True:
            os.write(filler, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(filler)
    before = files(point)
    with pytest.raises(PersistError, match=rf"cannot write {config}: No space left on device"):
        persist_limits(config, "acme", LimitEdit(memory="2G", io_read="50M", io_write="20M"), now=NOW)
    assert files(point) == before

    (point / "filler").unlink()
    persist_limits(config, "acme", LimitEdit(memory="2G"), now=NOW)
    assert resources(config).memory == 2 * 1024**3
