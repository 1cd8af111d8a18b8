"""Files replaced whole, never half: a new file written beside its target, fsynced, renamed over it, and the
directory fsynced; the old one kept as a backup first. Shared by ``limit --persist`` (limits/persist.py) and the
tenant files a panel writes (tenant_files/store.py).
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import suppress
from pathlib import Path

__all__ = ["fsync_dir", "make_backup", "unlink_quietly", "write_new"]


def unlink_quietly(path: Path) -> None:
    with suppress(OSError):
        os.unlink(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_new(path: Path, data: bytes, st: os.stat_result | None, mode: int = 0o640) -> Path:
    """Create ``path`` (O_EXCL) holding ``data`` with the owner and mode of ``st`` (None: this process's, and
    ``mode``), fsynced. On failure nothing is left behind."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            # Owner first: chown clears set-id bits, chmod then puts the mode back exactly. Created 0600, so the
            # text is never readable by more people than the original allows while it is being written.
            own = os.fstat(fd)
            if st is not None and (own.st_uid, own.st_gid) != (st.st_uid, st.st_gid):
                os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, stat.S_IMODE(st.st_mode) if st is not None else mode)
            _write_all(fd, data)
            # The data must be on disk before the rename makes it the config: otherwise a power cut just after
            # the rename can leave a durable *name* for a file whose blocks were never written (an empty config).
            os.fsync(fd)
        finally:
            os.close(fd)  # close can report a deferred write error too (NFS)
    except BaseException:
        unlink_quietly(path)
        raise
    return path


def make_backup(path: Path, data: bytes, st: os.stat_result, base: Path) -> Path:
    """Keep the old file (its bytes ``data``, its stat ``st``) as ``base`` (or ``base.N`` when taken): a hard link
    to the old inode where the filesystem allows (exact bytes, owner, mode and times, and no space needed on a full
    disk), else a copy (another filesystem: EXDEV)."""
    for n in range(1000):
        candidate = base if n == 0 else base.with_name(f"{base.name}.{n}")
        try:
            os.link(path, candidate, follow_symlinks=False)
            return candidate
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EACCES, errno.ENOSYS,
                                 errno.EXDEV):
                raise
        try:
            return write_new(candidate, data, st)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "too many backups with this timestamp", str(base))


def fsync_dir(directory: Path) -> None:
    # rename() is atomic, but it is a change to the *directory*: until the directory itself is fsynced, a
    # crash can bring back the old entry (or, on some filesystems, neither). fsync of the new file does not
    # cover its name. Some filesystems do not support fsync on a directory (EINVAL): nothing more to do there.
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)
