"""The .deb's Build-Depends list everything its build reads, and nothing else keeps a list of build packages.

The build compiles the front with mypyc, which type-checks the compiled modules and every module they import, so
the libraries that import closure reaches are read by the build: a library missing from the build root makes a
class subclassing one of its types an error (``disallow_subclassing_any``, strict) or weakens the check to Any.
The build root holds only the Build-Depends (packaging/build-root), so a gap here fails the build there; this test
names the gap before a build does."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each third-party import's Debian package (the .deb depends on Debian's, not PyPI's).
DEBIAN_PACKAGE = {
    "aiohttp": "python3-aiohttp",
    "httptools": "python3-httptools",
    "prometheus_client": "python3-prometheus-client",
    "psutil": "python3-psutil",
    "ruamel": "python3-ruamel.yaml",
    "uvloop": "python3-uvloop",
}

# The packages a build needs that no import names: what only the build root may hold.
BUILD_TOOLS = ("build-essential", "dpkg-dev", "debhelper", "dh-python", "pybuild-plugin-pyproject",
               "python3-all-dev", "python3-setuptools", "python3-wheel", "lintian")


def compiled_modules() -> list[Path]:
    """setup.py's COMPILED list, evaluated as setup.py evaluates it (setup.py itself runs setup() when run)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMPILED" for t in node.targets):
            expression = ast.Expression(node.value)
            paths = eval(compile(expression, "setup.py", "eval"),
                         {"Path": lambda p: ROOT / p, "sorted": sorted, "str": str})
            return [ROOT / path for path in paths]
    raise AssertionError("setup.py has no COMPILED list")


def module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def imported_names(path: Path) -> set[str]:
    """Every absolute module name an import in PATH names (relative ones resolved), TYPE_CHECKING ones included."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def third_party_closure(start: list[Path]) -> set[str]:
    """The top-level third-party modules reached from START through elasticd's own imports."""
    seen: set[Path] = set()
    third: set[str] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_names(path):
            top = name.split(".")[0]
            if top == "elasticd":
                parts = name.split(".")
                todo.extend(f for i in range(1, len(parts) + 1) if (f := module_file(".".join(parts[:i]))))
            elif top and top not in sys.stdlib_module_names and top not in ("mypy_extensions", "typing_extensions"):
                third.add(top)
    return third


def build_depends() -> set[str]:
    control = (ROOT / "packaging/deb/debian/control").read_text()
    field = re.search(r"^Build-Depends:(.*?)^\S", control, re.MULTILINE | re.DOTALL)
    assert field, "packaging/deb/debian/control has no Build-Depends"
    return {entry.split()[0] for entry in field.group(1).replace("\n", " ").split(",") if entry.strip()}


def test_the_compiled_front_reads_these_libraries():
    # Pinned, so a new import into the request path is a decision seen here (and in the Build-Depends).
    assert third_party_closure(compiled_modules()) == {"httptools", "prometheus_client", "ruamel"}


def test_build_depends_list_every_library_the_build_reads():
    reached = third_party_closure(compiled_modules())
    unknown = reached - DEBIAN_PACKAGE.keys()
    assert not unknown, f"the compiled front imports {sorted(unknown)}: name their Debian package in this test"
    missing = {DEBIAN_PACKAGE[top] for top in reached} - build_depends()
    assert not missing, f"packaging/deb/debian/control's Build-Depends lacks {sorted(missing)}"
    assert {"debhelper-compat", "dh-python", "pybuild-plugin-pyproject", "python3-all-dev",
            "python3-mypy"} <= build_depends()


def test_no_list_of_build_packages_is_kept_anywhere_but_the_control_file():
    """The test root, ./dev and the VM image hold no build tool: the build root reads them from the control file."""
    kept = {
        "packaging/suite-root/packages": (ROOT / "packaging/suite-root/packages").read_text(),
        "integration/image/packages": (ROOT / "integration/image/packages").read_text(),
    }
    for where, text in kept.items():
        listed = {line.split("#")[0].strip() for line in text.splitlines()} - {""}
        assert not listed & set(BUILD_TOOLS), (where, sorted(listed & set(BUILD_TOOLS)))
    # ./dev's package lists: its bash arrays (NAME=(a b c), over lines)
    arrays = re.findall(r"^(\w+)=\(([^)]*)\)", (ROOT / "dev").read_text(), re.MULTILINE)
    assert len(arrays) >= 4
    for name, words in arrays:
        assert not set(words.split()) & set(BUILD_TOOLS), (name, sorted(set(words.split()) & set(BUILD_TOOLS)))
    assert "apt-get build-dep" in (ROOT / "packaging/build-root/build-root").read_text()
