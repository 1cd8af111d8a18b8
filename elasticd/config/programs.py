"""A group's program must be in its tenant's view: said at load (``--check``, a reload), not found by five failed
starts.

An isolated tenant's workers see the host through bubblewrap's binds (supervisor/sandbox.py): the system
(/usr, /etc, /opt…), the tenant's app roots, ``writable:`` and ``read_only:`` paths and its home; its own /tmp and
/var/tmp (directories of ``server.tmp_dir``, not the host's). A ``python:`` or a command under the host's /tmp,
/var, /srv, /root or another user's /home is not there: ``setpriv: failed to execute …: No such file or directory``,
five times, then the group is marked failed. So each program is judged here from the view's own binds, whoever runs
the check (a shell sees the host's /tmp; the unit's ``ExecStartPre=`` has a private one; the answer is the same,
because a path under /tmp is judged in the tenant's own /tmp directory, not in the checker's):

- ``python:``, else the command's first word when it is an absolute path (``{python}`` alone is elasticd's own
  interpreter, which the spawn adds to the view); a script's ``#!`` interpreter;
- for a Python interpreter of a venv: the interpreter it was made from (``pyvenv.cfg``'s ``home``), and the paths an
  editable install puts on ``sys.path`` (``.pth`` lines, setuptools' ``__editable__`` finders);
- each as written and as its links resolve (a venv's ``bin/python`` is a link to the base interpreter).

A tenant whose file did not change (``unchanged``) is not looked at again: what lies in its own directories is
the tenant's to change, and its deleting a venv must not refuse the operator's reload of the others.
"""

from __future__ import annotations

import ast
import glob
import os
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from elasticd.config.isolation import SYSTEM_READ_ONLY, SYSTEM_TRY, inside, tmp_dirs
from elasticd.config.model import Group, Server, Tenant
from elasticd.config.walk import Walk

__all__ = ["check_programs", "view_refusal"]

_PRIVATE = ("/tmp", "/var/tmp")
_FINDER_MAPPING = re.compile(r"^MAPPING\s*(?::[^=]*)?=\s*(\{.*?\})\s*$", re.M | re.S)


class _View:
    """What an isolated tenant's view shows, as host paths."""

    __slots__ = ("_parts", "private", "shown")

    def __init__(self, server: Server, tenant: Tenant) -> None:
        view = tenant.isolation
        assert view is not None
        roots = tuple(dict.fromkeys(os.path.realpath(app.root) for app in tenant.apps.values()))
        home = (view.home,) if view.home is not None else ()
        self.shown = (*SYSTEM_READ_ONLY, *SYSTEM_TRY, *roots, *view.writable, *view.read_only, *home)
        tmp, var_tmp = tmp_dirs(os.path.join(server.tmp_dir, tenant.name))
        self.private = {"/tmp": tmp, "/var/tmp": var_tmp}
        parts = ["the system (/usr, /etc, /opt, /bin, /lib…)", f"its app roots ({', '.join(roots)})"]
        if view.writable or view.read_only:
            parts.append(f"its isolation paths ({', '.join(dict.fromkeys((*view.writable, *view.read_only)))})")
        if home:
            parts.append(f"its home ({home[0]})")
        self._parts = parts

    def describe(self) -> str:
        return ", ".join(self._parts)


def view_refusal(path: str, view: _View) -> str | None:
    """Why ``path`` (absolute, as the worker would name it) is not in the view, or None when it is there. (The binds'
    order: a root under /tmp is bound over the tenant's own /tmp, so it is seen where it is on the host.)"""
    if not any(inside(path, base) for base in view.shown):
        for inner in _PRIVATE:
            if inside(path, inner):
                if os.path.lexists(view.private[inner] + path[len(inner):]):
                    return None  # (the tenant's own file, there as the worker will see it)
                return (f"is not in the tenant's view: its {inner} is a directory of its own "
                        f"({view.private[inner]}), which holds no {path[len(inner):].lstrip('/') or 'such path'}")
        return f"is not in the tenant's view, which shows of the host only {view.describe()}"
    real = os.path.realpath(path)
    if real != path and not any(inside(real, base) for base in view.shown):
        return f"leads to {real}, which is not in the tenant's view ({view.describe()})"
    return None


def _programs(group: Group, root: str) -> Iterator[tuple[str, str]]:
    """(key, absolute path) of what a worker of the group execs and loads: python:, the command's first word."""
    if group.python is not None:
        yield "python", group.python
        yield from (("python", path) for path in _python_needs(group.python))
    if group.command and "{python}" not in group.command[0] and os.path.isabs(group.command[0]):
        first = os.path.normpath(group.command[0])
        yield "command[0]", first
        interpreter = _shebang(first)
        if interpreter is not None:
            yield "command[0]", interpreter
            yield from (("command[0]", path) for path in _python_needs(interpreter))
    elif group.command and group.python is None and "{python}" not in group.command[0]:
        first = os.path.normpath(os.path.join(root, group.command[0]))  # (relative: in the app's root, its cwd)
        interpreter = _shebang(first) if os.sep in group.command[0] else None
        if interpreter is not None:
            yield "command[0]", interpreter


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    return words[0] if words and os.path.isabs(words[0]) else None


def _python_needs(interpreter: str) -> Iterator[str]:
    """For a venv's interpreter: the base interpreter's directory and the editable installs' source paths."""
    prefix = os.path.dirname(os.path.dirname(interpreter))
    try:
        with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as f:
            config = f.read()
    except (OSError, UnicodeDecodeError):
        return
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and os.path.isabs(value.strip()):
            yield value.strip()
    for site in glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")):
        yield from _editable_paths(site)


def _editable_paths(site: str) -> Iterator[str]:
    for pth in sorted(glob.glob(os.path.join(site, "*.pth"))):
        try:
            with open(pth, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            line = line.strip()
            if os.path.isabs(line) and os.path.exists(line):
                yield os.path.normpath(line)
    for finder in sorted(glob.glob(os.path.join(site, "__editable___*_finder.py"))):
        try:
            with open(finder, encoding="utf-8") as f:
                found = _FINDER_MAPPING.search(f.read())
            mapping = ast.literal_eval(found.group(1)) if found else {}
        except (OSError, UnicodeDecodeError, ValueError, SyntaxError):
            continue
        if isinstance(mapping, dict):
            yield from (os.path.normpath(p) for p in mapping.values() if isinstance(p, str) and os.path.isabs(p))


def check_programs(walk: Walk, server: Server, tenants: Mapping[str, Tenant], root: dict[Any, Any],
                   unchanged: Collection[str] = ()) -> None:
    """Every isolated tenant's groups' programs, in its view (``root``: the document, for the lines)."""
    for tenant in tenants.values():
        if tenant.isolation is None or tenant.name in unchanged:
            continue
        view = _View(server, tenant)
        for app in tenant.apps.values():
            for group in app.groups.values():
                said: set[str] = set()
                for key, path in _programs(group, app.root):
                    problem = view_refusal(path, view)
                    if problem is None or key in said:
                        continue
                    said.add(key)  # (one error per key: its first missing part)
                    node = root["tenants"][tenant.name]["apps"][app.name]["groups"][group.name]
                    line = Walk.key_line(node, "python") if key == "python" else Walk.item_line(node["command"], 0)
                    walk.error(f"tenants.{tenant.name}.apps.{app.name}.groups.{group.name}.{key}", line,
                               f"{path} {problem}: its workers could not start (\"No such file or directory\"). "
                               "Put it under the app's root, or name its directory in isolation.read_only")
