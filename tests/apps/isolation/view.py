"""What a worker sees of the host from inside its sandbox, as a JSON-able dict (copied into each Python app's
root beside its app.py; standard library only).

- ``pids``: the entries of /proc that are pids (in its own pid namespace: bubblewrap's init and its own few);
- ``others``: for each path in ``$OTHER_ROOTS`` (another tenant's app root, ``:``-separated), whether it exists;
- ``own_root``: whether its own root (its working directory) is there, ``tmp_writable``: whether /tmp takes a file.
"""

from __future__ import annotations

import os
import tempfile


def observe(app: str) -> dict[str, object]:
    try:
        with tempfile.NamedTemporaryFile(dir="/tmp", prefix=f"{app}-probe-"):
            tmp_writable = True
    except OSError:
        tmp_writable = False
    return {
        "app": app,
        "uid": os.getuid(),
        "pid": os.getpid(),
        "pids": sorted(int(name) for name in os.listdir("/proc") if name.isdigit()),
        "others": {path: os.path.exists(path) for path in os.environ.get("OTHER_ROOTS", "").split(":") if path},
        "cwd": os.getcwd(),
        "own_root": os.path.isdir(os.getcwd()),
        "tmp_writable": tmp_writable,
    }
