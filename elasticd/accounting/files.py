"""Persistent descriptors on one cgroup's interface files (the sampler's I/O shell).

Opening, reading and closing a cgroup file costs 7-9 µs; keeping it open and re-reading it with pread at
offset 0 costs 1.3-2.3 µs (benchmarks/sampler_bench.py), and kernfs regenerates the content on every read
from offset 0. So each (cgroup, file) keeps ONE O_RDONLY descriptor, opened relative to a descriptor of the
cgroup directory (no path walk), and a pass over every file open is one list comprehension of preads.

What persistent descriptors bring, and how it is handled:

- The cgroup is removed under an open descriptor: on the kernel, reads fail with ENODEV; in a fake tree
  (plain files) reads would go on returning the old content, so a removed directory is recognised by its
  link count (0 once rmdir'ed). Either way every descriptor is closed, the values are missing, and the
  directory is reopened on a later tick (at most once per tick): a cgroup removed and made again is
  picked up.
- A file that is absent (controller not enabled, PSI off, a fake tree) is retried after 1, 2, 4, then
  every 8 ticks, so a host without a controller does not pay a failed open per file per tick;
  ``reset_retries`` (after each activation: a reload may enable controllers) retries at once.
- Any other read error (EBADF, EOPNOTSUPP...) closes that one descriptor and retries like an absent file.

The sampler keeps files open only for active cgroups, within its share of the open-file limit; every other read
is ``read_transient`` (open, read, close). And no open here keeps a descriptor numbered at or above the ceiling
(``set_descriptor_ceiling``: the limit less a reserve): the kernel hands out the lowest free number, so an open
that lands there means fewer than the reserve are free, and it is closed at once and counted as a miss
(``descriptors_refused``). The admin socket and the front keep the reserve to accept with.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from elasticd.cgroup.discovery import cgroup2_mounts

from .sample import FILES

__all__ = ["CgroupFiles", "cgroup2_devices", "read_populated", "read_transient", "set_descriptor_ceiling"]

log = logging.getLogger("elasticd.accounting")

_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# One read takes the whole file: these files are a few hundred bytes (io.stat: ~80 per disk).
_READ_SIZE = 65536
_MAX_BACKOFF = 8  # ticks

# Seams for tests (e.g. a pread that raises ENODEV); module globals are as cheap to look up as os.pread.
_pread = os.pread
_open = os.open
_fstat = os.fstat

_emfile_logged = False

# No descriptor numbered at or above this is kept (set_descriptor_ceiling); opens refused for it, counted.
_ceiling = 1 << 30
descriptors_refused = 0


def set_descriptor_ceiling(ceiling: int) -> None:
    global _ceiling
    _ceiling = ceiling


def _open_below_ceiling(path: str | Path, flags: int, dir_fd: int | None = None) -> int:
    """os.open, refused (EMFILE) when the descriptor it got is within the reserve."""
    global descriptors_refused
    fd = _open(path, flags, dir_fd=dir_fd)
    if fd >= _ceiling:
        _close(fd)
        descriptors_refused += 1
        raise OSError(errno.EMFILE, "descriptors are low: the last ones are kept for the admin socket and the front")
    return fd


def read_populated(path: str | Path) -> bool | None:
    """Whether the cgroup at ``path`` has a process in it or below it (``cgroup.events``), None where the file
    cannot be read (a fake tree has none; a removed cgroup)."""
    try:
        fd = _open_below_ceiling(os.path.join(path, "cgroup.events"), _FLAGS)
    except OSError:
        return None
    try:
        data = _pread(fd, 256, 0)
    except OSError:
        return None
    finally:
        _close(fd)
    if b"populated 1" in data:
        return True
    return False if b"populated 0" in data else None


def read_transient(path: str | Path, names: Sequence[str] = FILES) -> list[bytes | None]:
    """Every file's content with descriptors opened and closed here (None where missing or refused)."""
    try:
        directory = _open_below_ceiling(path, _DIR_FLAGS)
    except OSError as exc:
        _note_open_error(exc, path)
        return [None] * len(names)
    contents: list[bytes | None] = []
    try:
        for name in names:
            try:
                fd = _open_below_ceiling(name, _FLAGS, dir_fd=directory)
            except OSError as exc:
                _note_open_error(exc, os.path.join(path, name))
                contents.append(None)
                continue
            try:
                contents.append(_pread(fd, _READ_SIZE, 0))
            except OSError:
                contents.append(None)
            finally:
                _close(fd)
    finally:
        _close(directory)
    return contents


@functools.cache
def cgroup2_devices(proc: str = "/proc") -> frozenset[int]:
    """The st_dev of every cgroup2 mount (read once: the mount table does not change under a daemon)."""
    try:
        text = Path(proc, "self", "mountinfo").read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return frozenset()
    devices = set()
    for point, _root in cgroup2_mounts(text):
        with contextlib.suppress(OSError):
            devices.add(os.stat(point).st_dev)
    return frozenset(devices)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class CgroupFiles:
    """The files of FILES (or ``names``) of the cgroup at ``path``. Not thread-safe (event loop only)."""

    __slots__ = ("_dir", "_fds", "_kernfs", "_misses", "_retry_at", "names", "path")

    def __init__(self, path: str | Path, names: Sequence[str] = FILES) -> None:
        self.path = os.fspath(path)
        self.names = tuple(names)
        self._dir: int | None = None
        self._kernfs = False  # on the cgroup2 file system, where a removal shows as ENODEV
        self._fds: list[int | None] = [None] * len(self.names)
        self._misses = [0] * len(self.names)  # consecutive failed opens, for the back-off
        self._retry_at = [0] * len(self.names)  # the tick from which an open is tried again

    # ----------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        fds = self._fds
        for i, fd in enumerate(fds):
            if fd is not None:
                _close(fd)
                fds[i] = None
        if self._dir is not None:
            _close(self._dir)
            self._dir = None

    @property
    def open_count(self) -> int:
        return sum(fd is not None for fd in self._fds) + (self._dir is not None)

    def reset_retries(self) -> None:
        self._misses = [0] * len(self.names)
        self._retry_at = [0] * len(self.names)

    def _open_dir(self) -> bool:
        try:
            self._dir = directory = _open_below_ceiling(self.path, _DIR_FLAGS)
        except OSError as exc:
            _note_open_error(exc, self.path)
            return False
        try:
            self._kernfs = _fstat(directory).st_dev in cgroup2_devices()
        except OSError:
            self._kernfs = False
        self.reset_retries()  # a (re)made cgroup: its files are all worth trying now
        return True

    def _removed(self) -> bool:
        # A fake tree's removed directory: its link count drops to 0. Only checked off cgroup2, whose
        # reads fail with ENODEV instead: an fstat there costs ~1 µs per cgroup per tick for nothing.
        if self._dir is None:
            return True
        try:
            return _fstat(self._dir).st_nlink == 0
        except OSError:
            return True

    def _open(self, i: int, tick: int) -> int | None:
        try:
            fd = _open_below_ceiling(self.names[i], _FLAGS, dir_fd=self._dir)
        except OSError as exc:
            _note_open_error(exc, os.path.join(self.path, self.names[i]))
            misses = self._misses[i] = self._misses[i] + 1
            self._retry_at[i] = tick + min(1 << (misses - 1), _MAX_BACKOFF)
            return None
        self._misses[i] = 0
        self._fds[i] = fd
        return fd

    # ----------------------------------------------------------------------------------- reading

    def read(self, tick: int) -> list[bytes | None]:
        """Every file's current content (None where missing). ``tick`` counts the caller's passes: it paces
        the retries of missing files."""
        if self._dir is not None and not self._kernfs and self._removed():
            self.close()
        if self._dir is None and not self._open_dir():
            return [None] * len(self.names)
        fds = self._fds
        if None not in fds:
            # The common case, every file open: one comprehension, no per-file bookkeeping. A failure is
            # sorted out file by file below.
            with contextlib.suppress(OSError):
                return [_pread(fd, _READ_SIZE, 0) for fd in cast("list[int]", fds)]
        contents: list[bytes | None] = [None] * len(self.names)
        for i, fd in enumerate(fds):
            if fd is None:
                if tick < self._retry_at[i]:
                    continue
                fd = self._open(i, tick)
                if fd is None:
                    continue
            try:
                contents[i] = _pread(fd, _READ_SIZE, 0)
            except OSError as exc:
                if exc.errno == errno.ENODEV:
                    # The cgroup was removed (or a file of it hidden): what was read this pass belongs to
                    # a group that is gone. Start over from the directory on the next tick.
                    self.close()
                    return [None] * len(self.names)
                _close(fd)
                fds[i] = None
                self._misses[i] += 1
                self._retry_at[i] = tick + 1
                log.debug("cannot read %s: %s", os.path.join(self.path, self.names[i]), exc)
        if self._kernfs and not any(fd is not None for fd in fds):
            # On cgroupfs, nothing open means nothing to report a removal (ENODEV): reopen the directory
            # next tick, so a group removed and made again is found (rare: every cgroup has cpu.stat).
            self.close()
        return contents


def _note_open_error(exc: OSError, path: str | Path) -> None:
    global _emfile_logged
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        if not _emfile_logged:
            _emfile_logged = True
            log.warning("cannot open %s: %s; cgroup values are missing until descriptors are free "
                        "(raise LimitNOFILE= of elasticd.service)", path, exc.strerror)
    elif exc.errno not in (errno.ENOENT, errno.ENODEV, errno.ENOTDIR):
        log.debug("cannot open %s: %s", path, exc)
