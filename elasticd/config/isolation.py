"""``tenants.<t>.isolation``: whether a tenant's workers get a view of the host of their own, and what it holds
beyond the defaults (``supervisor/sandbox.py`` builds the view).

A tenant with a ``user:`` (other than root) is isolated unless it says ``isolation: {enabled: false}``. A tenant
without one cannot be: its workers run as root, and a root process with its capabilities can undo any mount made
for it. The paths are checked against the disk as it is at load (as a tenant's user and its app roots are): a bind
whose source is missing would be a worker that never starts, so it is refused here, with its key and line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from elasticd.config.model import App, Isolation, RunAs
from elasticd.config.walk import Walk, absolute_path, kind

__all__ = ["BWRAP", "ISOLATION_KEYS", "SYSTEM_READ_ONLY", "SYSTEM_TRY", "inside", "isolation_section", "tmp_dirs"]

# bubblewrap (Debian's package ``bubblewrap``, what Flatpak uses) by its absolute path: it runs as root, so never
# through a PATH a group's ``env`` could point at a tenant's files (as setpriv: supervisor/spawn.py).
BWRAP = "/usr/bin/bwrap"

ISOLATION_KEYS = ("enabled", "writable", "read_only")

# Shown read-only to every isolated worker (supervisor/sandbox.py). /usr and /etc must exist; the rest as the host has
# them (a merged-/usr host has /bin as a symlink to usr/bin: bound, it is a directory showing /usr/bin, which is the
# same to a program).
SYSTEM_READ_ONLY = ("/usr", "/etc")
SYSTEM_TRY = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/run/systemd/resolve")


def tmp_dirs(tenant_tmp: str) -> tuple[str, str]:
    """The host directories that are a tenant's /tmp and /var/tmp (``tenant_tmp``: ``<server.tmp_dir>/<tenant>``)."""
    return f"{tenant_tmp}/tmp", f"{tenant_tmp}/var-tmp"


def inside(path: str, base: str) -> bool:
    """Whether ``path`` is ``base`` or lies under it (both already normalised)."""
    return path == base or path.startswith(base.rstrip("/") + "/")


def isolation_section(walk: Walk, m: Mapping[Any, Any], path: str, run_as: RunAs | None,
                      apps: Mapping[str, App]) -> Isolation | None:
    """The tenant's isolation from its mapping ``m`` (the tenant's own node), or None when its workers are not
    isolated."""
    here = f"{path}.isolation"
    line = walk.key_line(m, "isolation")
    node = walk.mapping(m.get("isolation"), here, line, ISOLATION_KEYS)
    enabled = node.get("enabled", True)
    if not isinstance(enabled, bool):
        walk.error(f"{here}.enabled", walk.key_line(node, "enabled"), f"{kind(enabled)} is not true or false")
        return None
    said = "isolation" in m and m["isolation"] is not None
    if not enabled:
        return None
    if run_as is None or run_as.uid == 0:
        if said:  # (by default, a tenant without a user of its own is simply not isolated)
            who = "no user" if run_as is None else "user root"
            walk.error(here, line, f"needs a user other than root beside it (the tenant has {who}): its workers would "
                                   "run as root, whose capabilities undo any view made for them")
        return None
    if not os.access(BWRAP, os.X_OK):
        where, at = (here, line) if said else (f"{path}.user", walk.key_line(m, "user"))
        walk.error(where, at, f"isolating the tenant's workers needs bubblewrap ({BWRAP}), which is not installed "
                              "here: apt install bubblewrap, or say isolation: {enabled: false}")
        return None
    home = _own_home(run_as)
    roots = [os.path.realpath(app.root) for app in apps.values()]
    writable = _paths(walk, node, "writable", here)
    for index, (raw, real) in enumerate(writable):
        allowed = [*roots, *([home] if home is not None else [])]
        if not any(inside(real, base) for base in allowed):
            where = f"{here}.writable[{index}]"
            walk.error(where, Walk.item_line(node["writable"], index),
                       f"{raw} is outside the tenant's app roots ({', '.join(roots) or 'none'})"
                       + (f" and its user's home ({home})" if home is not None else "")
                       + ": a tenant may be given write access only to what is its own")
    read_only = _paths(walk, node, "read_only", here)
    return Isolation(writable=tuple(real for _, real in writable), read_only=tuple(real for _, real in read_only),
                     home=home)


def _own_home(run_as: RunAs) -> str | None:
    """The user's home when it is a directory the user owns (bound read-write: it is the tenant's own); a home
    such as /nonexistent, or one the user shares with root's files, is not bound at all."""
    try:
        st = os.stat(run_as.home)
    except OSError:
        return None
    if not os.path.isdir(run_as.home) or st.st_uid != run_as.uid or run_as.home in ("/", ""):
        return None
    return os.path.realpath(run_as.home)


def _paths(walk: Walk, node: Mapping[Any, Any], key: str, here: str) -> list[tuple[str, str]]:
    """The list under ``key``: (as written, as resolved on the disk now), each an existing absolute path."""
    raw = node.get(key)
    if raw is None:
        return []
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        walk.error(f"{here}.{key}", walk.key_line(node, key), f"must be a list of paths, not {kind(raw)}")
        return []
    found: list[tuple[str, str]] = []
    for index, item in enumerate(raw):
        where, at = f"{here}.{key}[{index}]", Walk.item_line(raw, index)
        try:
            text = absolute_path(item)
        except ValueError as exc:
            walk.error(where, at, str(exc))
            continue
        if not os.path.exists(text):
            walk.error(where, at, f"{text} does not exist: a bind of a missing path would keep every worker of the "
                                  "tenant from starting")
            continue
        real = os.path.realpath(text)
        if real == "/":
            walk.error(where, at, f"{text} is the whole file system: the view would hide nothing")
            continue
        found.append((text, real))
    return found
