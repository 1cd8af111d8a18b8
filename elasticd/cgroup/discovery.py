"""Where the cgroup v2 hierarchy is mounted and which cgroup elasticd itself is in.

Pure parsers over the text of ``/proc/self/mountinfo`` and ``/proc/self/cgroup``, plus one thin reader.
Hybrid hosts (systemd's "hybrid" layout, v1 controllers beside one v2 hierarchy) mount cgroup2 at
``/sys/fs/cgroup/unified``; pure v2 hosts at ``/sys/fs/cgroup``. Never assume either: read the mount table.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

__all__ = [
    "cgroup2_mounts",
    "own_cgroup",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "read_own_cgroup",
]

# The kernel escapes space, tab, newline and backslash in mountinfo paths as 3-digit octal (\040 ...).
_OCTAL_RE = re.compile(r"\\([0-7]{3})")
_DELETED = " (deleted)"


def _unescape(field: str) -> str:
    return _OCTAL_RE.sub(lambda m: chr(int(m.group(1), 8)), field)


def cgroup2_mounts(text: str) -> list[tuple[str, str]]:
    """Every cgroup2 mount as (mount point, root inside the hierarchy), in mountinfo order.

    A mountinfo line is ``ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER``:
    the optional fields vary in number, so the file system type is the field after the lone ``-``.
    """
    mounts: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) > sep + 1 and fields[sep + 1] == "cgroup2":
            mounts.append((_unescape(fields[4]), _unescape(fields[3])))
    return mounts


def parse_mountinfo(text: str) -> str | None:
    """The mount point of the cgroup2 file system, or None when none is mounted.

    With several cgroup2 mounts (bind mounts of sub-trees, e.g. into a container's view) the one that
    shows the whole hierarchy (root ``/``) is preferred.
    """
    mounts = cgroup2_mounts(text)
    for point, root in mounts:
        if root == "/":
            return point
    return mounts[0][0] if mounts else None


def parse_proc_cgroup(text: str) -> str | None:
    """The v2 path from the ``0::/path`` line; hybrid files also hold ``N:controllers:/path`` v1 lines.

    The path is relative to the reader's cgroup namespace root. A cgroup removed while we are in it
    (only possible for a zombie or a racing read) is shown with `` (deleted)``, which is not part of it.
    """
    for line in text.splitlines():
        if line.startswith("0::"):
            path = line[3:]
            if path.endswith(_DELETED):
                path = path[: -len(_DELETED)]
            return path or None
    return None


def own_cgroup(mountinfo_text: str, proc_cgroup_text: str) -> Path | None:
    """The directory of our own cgroup: mount point joined with the v2 path.

    A mount's ROOT field says which part of the hierarchy it shows: a bind mount of ``/docker/abc`` at
    ``/sys/fs/cgroup`` (containers without a cgroup namespace) shows our ``/docker/abc/x`` at
    ``/sys/fs/cgroup/x``, so that root is stripped; a cgroup outside every mount's root is not visible.
    """
    path = parse_proc_cgroup(proc_cgroup_text)
    if path is None or not path.startswith("/"):
        return None
    own = PurePosixPath(path)
    # The most specific mount root that holds our path wins.
    best: tuple[int, Path] | None = None
    for point, root in cgroup2_mounts(mountinfo_text):
        root_path = PurePosixPath(root)
        if own == root_path or root_path in own.parents:
            depth = len(root_path.parts)
            if best is None or depth > best[0]:
                rel = own.relative_to(root_path)
                best = (depth, Path(point, *rel.parts))
    return None if best is None else best[1]


def read_own_cgroup(proc: str = "/proc") -> Path | None:
    """Our own cgroup directory from ``{proc}/self/mountinfo`` and ``{proc}/self/cgroup``."""
    try:
        mountinfo = Path(proc, "self", "mountinfo").read_text(encoding="utf-8", errors="surrogateescape")
        cgroup = Path(proc, "self", "cgroup").read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None
    return own_cgroup(mountinfo, cgroup)
