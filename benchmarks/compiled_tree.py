"""A copy of a checkout with its front compiled by mypyc (setup.py's build, ``ELASTICD_MYPYC=1``), as the .deb
ships it: for the benchmarks that compare the compiled front with the sources (front_bench.py, front_cpu.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["compile_front"]


def compile_front(repo: Path, where: Path) -> Path:
    """``repo``'s front compiled in place in a copy made in ``where`` (a new directory); returns the copy."""
    tree = where / "compiled"
    tree.mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(repo / name, tree / name)
    shutil.copytree(repo / "elasticd", tree / "elasticd", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    print(f"compiling {repo}'s front with mypyc (setup.py) ...", file=sys.stderr, flush=True)
    built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree,
                           env={**os.environ, "ELASTICD_MYPYC": "1"}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if built.returncode != 0:
        raise RuntimeError("the mypyc build failed:\n" + built.stdout[-3000:])
    return tree
