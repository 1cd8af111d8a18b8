"""The layout's import rule (DESIGN.md, "Architecture"): shells import cores, never the reverse; the front's
client and worker connections never import each other; the worker library never imports the daemon; and
no import cycle, not even through imports made only for the type checker. The cores are the modules
pyproject.toml has mypy check strictly: one list for both rules."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "elasticd"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Every elasticd module ``name`` imports, at run time or under TYPE_CHECKING alike."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _cores() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    patterns = [m for section in config if section.get("disallow_untyped_defs") for m in section["module"]]
    return {name for name in MODULES if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


CORES = _cores()
# Packages whose __init__ only gathers names (and imports whatever they hold); a core may import its own.
_NEUTRAL = {"elasticd", "elasticd.config", "elasticd.front.core"}


def test_the_cores_are_the_pure_modules_the_issue_names():
    assert {"elasticd.front.core.relay", "elasticd.front.core.dispatch", "elasticd.front.core.exchange",
            "elasticd.pool.policy", "elasticd.pool.budget", "elasticd.config.load", "elasticd.cgroup.limits",
            "elasticd.worker_ids"} <= CORES


def test_cores_import_no_shell():
    offences = {core: sorted(m for m in GRAPH[core] if m not in CORES and m not in _NEUTRAL) for core in CORES}
    assert {core: shells for core, shells in offences.items() if shells} == {}


def test_the_client_and_worker_connections_never_import_each_other():
    assert "elasticd.front.upstream" not in GRAPH["elasticd.front.client"]
    assert "elasticd.front.client" not in GRAPH["elasticd.front.upstream"]
    assert "elasticd.front.server" not in GRAPH["elasticd.front.client"]


def test_the_worker_library_never_imports_the_daemon():
    library = {name for name in MODULES if name == "elasticd.worker" or name.startswith("elasticd.worker.")}
    shared = {"elasticd", "elasticd.frames"}  # the channel's framing: both ends speak it (pure, stdlib only)
    assert {name: sorted(GRAPH[name] - library - shared) for name in library if GRAPH[name] - library - shared} == {}
    assert GRAPH["elasticd.frames"] <= {"elasticd"}


def test_no_import_cycle_even_for_the_type_checker():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in GRAPH[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    assert cycles == []


def test_elasticctl_loads_no_cgroup_sampler_or_daemon_code():
    """elasticctl is short-lived: importing it must not pull the cgroup layer, the sampler or the daemon."""
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", "import sys, elasticd.ctl; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    heavy = ("elasticd.cgroup", "elasticd.accounting.sampler", "elasticd.daemon", "elasticd.front", "elasticd.pool",
             "elasticd.supervisor")
    assert [m for m in loaded if m.startswith(heavy)] == []


def test_no_two_public_classes_or_type_aliases_share_a_name():
    """One name, one meaning: a newcomer who finds `Reading` or `GroupKey` finds the one thing it is."""
    defined: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found = node.name
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                  and node.targets[0].id[:1].isupper() and not node.targets[0].id.isupper()
                  and isinstance(node.value, ast.Subscript)):  # a type alias such as GroupKey = tuple[...]
                found = node.targets[0].id
            else:
                continue
            if not found.startswith("_"):
                defined.setdefault(found, []).append(name)
    assert {n: where for n, where in defined.items() if len(where) > 1} == {}


def _string_literals(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_string_literals(element) for element in node.elts)
    return False


def test_no_state_is_compared_as_a_string():
    """A worker's states are supervisor/lifecycle.py's enum and its named sets; a reader that compares a state to a
    spelled-out string would silently stop matching when a state is renamed."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names_a_state = any((isinstance(side, ast.Attribute) and side.attr == "state")
                                or (isinstance(side, ast.Name) and side.id == "state") for side in sides)
            if names_a_state and any(_string_literals(side) for side in sides):
                found.append(f"{name}:{node.lineno}")
    assert found == []
