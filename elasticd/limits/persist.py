"""``elasticctl limit … --persist``: write a tenant's run-time limits into its ``resources`` in the config file.

The file shell around ``splice`` (the pure splice and its proof): ``persist_limits`` reads the file, runs
the pure half, and replaces the file atomically under a lock, keeping the old one as ``<file>.bak.<UTC time>``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from secrets import token_hex

from elasticd.atomic_file import fsync_dir, make_backup, unlink_quietly, write_new
from elasticd.limits.splice import (
    LimitEdit,
    PersistError,
    PersistResult,
    backup_name,
    changed_lines,
    check_edit,
    edit_text,
)

__all__ = ["LimitEdit", "PersistError", "PersistResult", "persist_limits"]


# --------------------------------------------------------------------------------------------- the file shell

# One edit at a time in this process, and (through flock on a lock file) across processes.
#
# Why a separate ``<file>.lock`` and not a lock on the config itself: the edit *replaces* the config by rename,
# so a lock taken on the config's inode protects a file that is no longer at the path once the first editor
# is done. A second editor that was waiting on the old inode would wake up holding a lock on a dead file and
# read stale text: its edit would silently drop the first one's. The lock file is never replaced nor removed
# (removing it would reopen the same race between "open" and "lock"), so everyone locks the same inode.
#
# Why flock and not fcntl/lockf: POSIX record locks belong to the *process* (two threads never exclude each
# other) and are dropped when the process closes *any* descriptor of the file. flock locks belong to the open
# file description, so they exclude other processes and also other opens within this process. The
# threading.Lock in front makes the in-process case a plain queue rather than a polling loop.
_THREAD_LOCK = threading.Lock()
_POLL = 0.05


def _oserror(what: str, path: Path, exc: OSError) -> PersistError:
    return PersistError(f"cannot {what} {path}: {exc.strerror or exc}")


@contextmanager
def _locked(path: Path, timeout: float, lock: Path | None = None) -> Iterator[None]:
    deadline = time.monotonic() + timeout
    if not _THREAD_LOCK.acquire(timeout=timeout):
        raise PersistError(f"{path} is being edited by another request: gave up after {timeout:g}s")
    try:
        lock = lock if lock is not None else path.with_name(path.name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            # Read-only is enough for flock on a local filesystem (NFS emulates flock with record locks, which
            # want a writable descriptor). It lets an existing lock file be used on a read-only mount, so that
            # failure is reported where it matters, as the config that cannot be written.
            try:
                fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                raise _oserror("create the lock file", lock, exc) from None
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise PersistError(f"{path} is being edited by another process (it holds {lock}): "
                                           f"gave up after {timeout:g}s") from None
                    time.sleep(_POLL)
            yield
        finally:
            os.close(fd)  # releases the flock
    finally:
        _THREAD_LOCK.release()


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}.persist-"


def _remove_stale_tmps(path: Path) -> None:
    """Remove temporary files a killed editor left behind. Only called under the lock: any file of our naming
    pattern then belongs to an editor that is gone, since a live one would be holding the lock."""
    prefix = _tmp_prefix(path)
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            with suppress(OSError):  # best effort: a read-only directory fails the write itself, clearly
                os.unlink(path.parent / name)


def _backup_path(target: Path, now: datetime, aside: Path | None) -> Path:
    name = backup_name(target, now)
    return aside / name.name if aside is not None else name


def persist_limits(path: str | Path, tenant: str, edit: LimitEdit, *, now: datetime | None = None,
                   timeout: float = 30.0, aside: Path | None = None) -> PersistResult:
    """Write ``edit`` into ``tenants.<tenant>.resources`` of the config file at ``path``.

    Synchronous and thread-safe (call it through ``asyncio.to_thread``). Either the whole edit lands, with the
    old file kept as a backup, or PersistError is raised and the config is byte-identical and no temporary
    file is left behind (a writer killed outright leaves one, which the next call removes). Beside the config
    it keeps ``<file>.lock`` (empty, never removed) and one ``<file>.bak.<time>`` per change (never rotated); with
    ``aside`` (a tenant's own file in server.tenant_config_dir, where nothing but tenant files may lie, and which
    ``elasticctl tenant remove`` must leave empty of it), both go in that directory instead.
    """
    # A symlinked config is edited where it really lives: renaming over the link would replace the link.
    target = Path(os.path.realpath(path))
    if aside is not None:
        os.makedirs(aside, mode=0o750, exist_ok=True)
    with _locked(target, timeout, aside / f"{target.name}.lock" if aside is not None else None):
        _remove_stale_tmps(target)
        try:
            with open(target, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
        except OSError as exc:
            raise _oserror("read", target, exc) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PersistError(f"cannot read {target}: not UTF-8 ({exc})") from None
        try:
            new_text = edit_text(text, tenant, edit)
        except PersistError as exc:
            raise PersistError(f"{target}: {exc}") from None
        if new_text == text:
            return PersistResult(target, None, 0)
        check_edit(text, new_text, tenant, edit, str(target))

        # The replacement, step by step. rename() atomically swaps which inode the name points at: a reader
        # (a reload, an operator's editor) sees the whole old file or the whole new one, never a mix, and a
        # crash at any point leaves one of the two at the path. Hence the temporary file goes in the *same*
        # directory: rename() cannot cross filesystems, and a copy across them would not be atomic.
        tmp = target.with_name(f"{_tmp_prefix(target)}{os.getpid()}-{token_hex(4)}.tmp")
        try:
            write_new(tmp, new_text.encode("utf-8"), st)
        except OSError as exc:
            unwritable = exc.errno in (errno.EACCES, errno.EROFS)  # the directory is; name it
            raise _oserror("write", target.parent if unwritable else target, exc) from None
        try:
            # Someone (an editor, not us: we hold the lock) may have saved the file since we read it.
            now_st = os.stat(target)
            if (now_st.st_ino, now_st.st_size, now_st.st_mtime_ns) != (st.st_ino, st.st_size, st.st_mtime_ns):
                raise PersistError(f"{target} changed while it was being edited; nothing was written, try again")
            backup = make_backup(target, data, st, _backup_path(target, now or datetime.now(UTC), aside))
            try:
                os.replace(tmp, target)
            except BaseException:
                unlink_quietly(backup)
                raise
        except BaseException as exc:
            unlink_quietly(tmp)
            if isinstance(exc, OSError):
                raise _oserror("replace", target, exc) from None
            raise
        try:
            fsync_dir(target.parent)
        except OSError as exc:
            raise PersistError(f"{target} was replaced (old file kept as {backup.name}) but its directory could "
                               f"not be synced: {exc.strerror or exc}") from None
    return PersistResult(target, backup, changed_lines(text, new_text))
