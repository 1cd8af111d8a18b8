"""A tenant's file on disk, written whole or not at all (the I/O shell of tenant_files).

The new text goes to a hidden temporary file beside the target (``.acme.yaml.<pid>-<hex>.tmp``: rename cannot
cross file systems, and no include glob matches a hidden name), fsynced, then renamed over the target and the
directory fsynced: a crash at any point leaves the old file or the new one at the path, never half of one, and at
worst a hidden temporary file that the next write removes. The old file is kept first as a backup in
``<state_dir>/tenant-files/`` (a hard link, or a copy across file systems), the newest ``KEEP`` per tenant: nothing of
elasticd's lies beside the tenant files, so ``remove`` leaves the directory as if the tenant had never been there.
"""

from __future__ import annotations

import os
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from secrets import token_hex

from elasticd.atomic_file import fsync_dir, make_backup, unlink_quietly, write_new

__all__ = ["KEEP", "remove_file", "restore", "write_file"]

KEEP = 10  # backups per tenant file


def _backup_base(path: Path, aside: Path, now: datetime) -> Path:
    return aside / f"{path.name}.bak.{now.astimezone(UTC):%Y%m%dT%H%M%SZ}"


def _remove_stale_tmps(path: Path) -> None:
    """Temporary files of a writer that died: only called under the caller's lock (one writer at a time)."""
    prefix = f".{path.name}."
    with suppress(OSError):
        for name in os.listdir(path.parent):
            if name.startswith(prefix) and name.endswith(".tmp"):
                unlink_quietly(path.parent / name)


def _prune(path: Path, aside: Path) -> None:
    prefix = f"{path.name}.bak."
    with suppress(OSError):
        backups = sorted(name for name in os.listdir(aside) if name.startswith(prefix))
        for name in backups[:-KEEP]:
            unlink_quietly(aside / name)


def _old(path: Path) -> tuple[bytes, os.stat_result] | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(), os.fstat(handle.fileno())
    except FileNotFoundError:
        return None


def write_file(path: Path, text: str, aside: Path, now: datetime | None = None) -> Path | None:
    """Replace or create ``path`` with ``text``; returns the old file's backup (None: there was none). Raises
    OSError with nothing changed (a temporary file removed, a backup made for it removed)."""
    os.makedirs(aside, mode=0o750, exist_ok=True)
    _remove_stale_tmps(path)
    old = _old(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{token_hex(4)}.tmp")
    write_new(tmp, text.encode("utf-8"), old[1] if old is not None else None)
    backup = None
    try:
        if old is not None:
            backup = make_backup(path, old[0], old[1], _backup_base(path, aside, now or datetime.now(UTC)))
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        if backup is not None:
            unlink_quietly(backup)
        raise
    fsync_dir(path.parent)
    _prune(path, aside)
    return backup


def remove_file(path: Path, aside: Path, now: datetime | None = None) -> Path | None:
    """Remove ``path``, its last text kept as a backup first; returns the backup (None: there was no file)."""
    os.makedirs(aside, mode=0o750, exist_ok=True)
    _remove_stale_tmps(path)
    old = _old(path)
    if old is None:
        return None
    backup = make_backup(path, old[0], old[1], _backup_base(path, aside, now or datetime.now(UTC)))
    try:
        os.unlink(path)
    except BaseException:
        unlink_quietly(backup)
        raise
    fsync_dir(path.parent)
    _prune(path, aside)
    return backup


def restore(path: Path, backup: Path | None) -> None:
    """Undo a write or a removal whose configuration then could not be applied: the backup back at the path
    (whole, as written), or no file where there was none."""
    if backup is None:
        unlink_quietly(path)
        fsync_dir(path.parent)
        return
    with open(backup, "rb") as handle:
        data, st = handle.read(), os.fstat(handle.fileno())
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{token_hex(4)}.tmp")
    write_new(tmp, data, st)
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)
