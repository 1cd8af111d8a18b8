"""Whether a tenant's user can run its worker's command, read from the file system as it is now (a shell:
it stats and opens files). Checked before each start, so an interpreter the tenant cannot run is one clear
error naming the tenant, the path and why, not a crash loop until ``failed``."""

from __future__ import annotations

import os
import shutil
import stat

from elasticd.config.model import RunAs
from elasticd.supervisor.spawn import permits

__all__ = ["runnable"]


def runnable(argv0: str, path_env: str, run_as: RunAs) -> str | None:
    """Why the tenant's user cannot run its command's first word (None: it can). Checked before each start,
    so a venv under /root (0700) or a script without the x bit is one clear error, not a crash loop."""
    found = argv0 if "/" in argv0 else shutil.which(argv0, path=path_env)
    if found is None:
        return f"{argv0!r} is not found in PATH={path_env}"
    real = os.path.realpath(found)
    for path in dict.fromkeys([*_parents(os.path.abspath(found)), *_parents(real)]):
        try:
            st = os.stat(path)
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        if not permits(st, run_as.uid, run_as.gid, 1):
            return (f"{path} (owner uid {st.st_uid}, gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}) "
                    f"cannot be searched by user {run_as.user}")
    st = os.stat(real)
    if not permits(st, run_as.uid, run_as.gid, 1):
        return f"{real} (mode {stat.S_IMODE(st.st_mode):04o}) is not executable by user {run_as.user}"
    if not permits(st, run_as.uid, run_as.gid, 4) and not _is_elf(real):
        return f"{real} (mode {stat.S_IMODE(st.st_mode):04o}) is a script user {run_as.user} cannot read"
    return None


def _parents(path: str) -> list[str]:
    parts, current = [], os.path.dirname(path)
    while True:
        parts.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            return parts[::-1]
        current = parent


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
