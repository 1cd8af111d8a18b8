"""Which whole disks hold a tenant's application roots, as the "MAJ:MIN" keys io.max wants.

io.max (blk-throttle) accepts only whole disks, not partitions: a root on /dev/sda1 (8:1) is limited
on /dev/sda (8:0). sysfs says which is which: ``/sys/dev/block/MAJ:MIN`` is a symlink into
``/sys/devices/.../block/sda/sda1``; a partition's directory has a ``partition`` file, and its parent
directory is the disk, whose ``dev`` file holds the disk's "MAJ:MIN".
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["disk_of", "disk_of_device", "disks_for_roots"]


@functools.lru_cache(maxsize=1024)
def disk_of_device(major: int, minor: int, sys_root: str = "/sys") -> str | None:
    """The whole disk of block device MAJ:MIN as "MAJ:MIN", or None when it is no block device.

    Major 0 is the kernel's "unnamed" device: tmpfs, overlayfs, NFS, and btrfs (each subvolume gets an
    anonymous st_dev, so btrfs roots cannot be mapped here). Device-mapper and md devices are whole
    block devices of their own (no ``partition`` file), and io.max limits I/O submitted to them.

    Remembered per device (a device's disk does not change under a running host): each tenant's activation asks
    for each of its app roots, 10,000 sysfs walks at a start of 10,000 apps, nearly all for one or two devices.
    """
    if major == 0:
        return None
    entry = Path(sys_root, "dev", "block", f"{major}:{minor}")
    if not entry.exists():
        return None
    if not (entry / "partition").exists():
        return f"{major}:{minor}"
    # Resolve the symlink first: ".." of /sys/dev/block/8:1 is /sys/dev, not the disk.
    disk = Path(os.path.realpath(entry)).parent
    try:
        dev = (disk / "dev").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return dev or None


def _device_of(path: str) -> int:
    return os.stat(path).st_dev


def disk_of(path: str, sys_root: str = "/sys") -> str | None:
    """The whole disk holding ``path`` (which must exist), or None when it is on no block device."""
    dev = _device_of(path)
    return disk_of_device(os.major(dev), os.minor(dev), sys_root)


def _nearest_existing(path: str) -> str:
    """``path`` or its nearest existing parent: an app root may not exist yet (deployed later), but the
    directory it will be created in is on the same file system (unless a mount appears; rare, re-checked
    on every activation)."""
    current = Path(path)
    while not current.exists() and current != current.parent:
        current = current.parent
    return str(current)


def disks_for_roots(
    roots: Iterable[str],
    sys_root: str = "/sys",
    *,
    device_of: Callable[[str], int] | None = None,
) -> tuple[list[str], list[str]]:
    """(the sorted unique whole disks under ``roots``, the roots on no block device).

    ``device_of`` gives a path's st_dev (default: os.stat; a seam for tests, whose tmp dirs are often on
    tmpfs or overlay).
    Disks sort numerically by (major, minor).
    """
    device_of = device_of or _device_of
    disks: set[str] = set()
    nowhere: list[str] = []
    for root in roots:
        try:
            dev = device_of(_nearest_existing(root))
        except OSError:
            nowhere.append(root)
            continue
        disk = disk_of_device(os.major(dev), os.minor(dev), sys_root)
        if disk is None:
            nowhere.append(root)
        else:
            disks.add(disk)
    return sorted(disks, key=_dev_key), nowhere


def _dev_key(dev: str) -> tuple[int, int]:
    major, _, minor = dev.partition(":")
    try:
        return int(major), int(minor)
    except ValueError:
        return (1 << 32, 0)
