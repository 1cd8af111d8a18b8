"""The included files of a configuration: the main file's ``include:`` globs expanded, each match read with its
stamp and checked for who may write it, and the cache that lets a reload skip every file that did not change.

One file per tenant is how a hosting host is run (a panel writes ``/etc/elastic.d/<tenant>.yaml``), so a host of
2,000 tenants reloads 2,000 files. Reading and stat-ing them is cheap (about 20 µs a file); parsing and validating
them is not (a thousand apps is a second of YAML): a file whose stamp (device, inode, size, modification and change
times, in nanoseconds) is the one parsed last time keeps its tenants as they were built then. A panel's atomic
write (a new inode, renamed over) always changes the stamp; ``elasticctl reload --all`` forgets the cache.

What is refused, each naming the file:
- a match that is not a regular file, or a symlink whose target lies outside the glob's directory (an include is
  the operator's directory, not a way to read a file from elsewhere);
- a file, or its directory, writable by its group or by others, or owned by a tenant's user (a tenant who could
  write it could raise its own limits; the loader checks the owners once it knows the tenants' users);
- a file over ``MAX_BYTES``, or not UTF-8.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_BYTES", "Included", "ParsedFiles", "Stamp", "check_included", "expand", "glob_covers",
           "owned_by_tenant", "read_included"]

MAX_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Stamp:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> Stamp:
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class Included:
    path: str
    stamp: Stamp | None = None
    text: str | None = None
    problem: str | None = None  # why it cannot be taken
    owners: tuple[int, int] = (0, 0)  # the file's and its directory's


def expand(globs: Sequence[str]) -> list[tuple[str, str]]:
    """(glob, file) for every file the globs match, each glob's in sorted order, globs in their order, a file matched
    twice once. Hidden names (a panel's temporary file, ``.acme.yaml.tmp``) are never matched, as the shell's glob
    does."""
    seen: set[str] = set()
    found: list[tuple[str, str]] = []
    for pattern in globs:
        for path in sorted(glob.glob(pattern)):
            if path not in seen:
                seen.add(path)
                found.append((pattern, path))
    return found


def glob_covers(globs: Iterable[str], path: str) -> bool:
    """Whether ``path`` would be matched by one of the globs (a name in a directory the globs read)."""
    directory, name = os.path.split(os.path.normpath(path))
    for pattern in globs:
        pdir, pname = os.path.split(os.path.normpath(pattern))
        if pdir == directory and fnmatch.fnmatch(name, pname) and not name.startswith("."):
            return True
    return False


def _writers(info: os.stat_result) -> str | None:
    if info.st_mode & 0o022:
        who = "others" if info.st_mode & 0o002 else "its group"
        return f"is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def check_included(pattern: str, path: str, folders: dict[str, os.stat_result] | None = None) -> Included:
    """One match of ``pattern`` looked at, not read: its stamp and owners, or the reason it is refused. ``folders``
    caches each directory's stat over one load (2,000 files in one directory: one stat of it)."""
    try:
        link = os.lstat(path)
        if stat.S_ISLNK(link.st_mode):
            home = os.path.realpath(os.path.dirname(pattern))
            target = os.path.realpath(path)
            if os.path.dirname(target) != home:
                return Included(path, problem=f"is a symbolic link to {target}, outside {home}: an included file "
                                              "must live in the include's directory")
            info = os.stat(path)
        else:
            info = link
        if not stat.S_ISREG(info.st_mode):
            return Included(path, problem="is not a regular file")
        directory = os.path.dirname(path) or "."
        folder = folders.get(directory) if folders is not None else None
        if folder is None:
            folder = os.stat(directory)
            if folders is not None:
                folders[directory] = folder
        why = _writers(info)
        if why is None:
            why = _writers(folder)
            if why is not None:
                why = f"lies in a directory that {why}"
        if why is not None:
            return Included(path, problem=f"{why}: a tenant who could write it could raise its own limits")
        if info.st_size > MAX_BYTES:
            return Included(path, problem=f"is {info.st_size} bytes, over the {MAX_BYTES} an included file may be")
    except OSError as exc:
        return Included(path, problem=f"cannot be read: {exc.strerror or exc}")
    return Included(path, Stamp.of(info), owners=(info.st_uid, folder.st_uid))


def read_included(pattern: str, path: str, checked: Included | None = None) -> Included:
    """One match of ``pattern``, read with its stamp (as read: a file replaced between the look and the read is
    taken as read), or the reason it is refused."""
    looked = checked if checked is not None else check_included(pattern, path)
    if looked.problem is not None:
        return looked
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
            info = os.fstat(handle.fileno())
    except OSError as exc:
        return Included(path, problem=f"cannot be read: {exc.strerror or exc}")
    if len(data) > MAX_BYTES or _writers(info) is not None:
        return check_included(pattern, path)  # (it changed under us: say why as a look says it)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Included(path, problem=f"is not UTF-8 (byte {exc.start})")
    return Included(path, Stamp.of(info), text, owners=(info.st_uid, looked.owners[1]))


def owned_by_tenant(included: Included, tenant_uids: Mapping[int, str]) -> str | None:
    """Why ``included`` is refused when a tenant's user owns it or its directory (that user could rewrite it)."""
    for what, uid in (("is", included.owners[0]), ("lies in a directory", included.owners[1])):
        if uid in tenant_uids:
            return (f"{what} owned by {tenant_uids[uid]}, the user tenant workers run as: a tenant who could write "
                    "it could raise its own limits")
    return None


@dataclass(slots=True)
class ParsedFiles:
    """The last good parse of each included file: its stamp, and what was built from it (the tenants it defines,
    as the loader built them). Only a file whose whole configuration was valid is kept."""

    entries: dict[str, tuple[Stamp, Mapping[str, Any]]] = field(default_factory=dict)

    def get(self, included: Included) -> Mapping[str, Any] | None:
        entry = self.entries.get(included.path)
        return entry[1] if entry is not None and entry[0] == included.stamp else None

    def keep(self, kept: Mapping[str, tuple[Stamp, Mapping[str, Any]]]) -> None:
        """The files of a configuration that loaded: these, and no others (a removed file goes)."""
        self.entries = dict(kept)

    def clear(self) -> None:
        self.entries = {}
