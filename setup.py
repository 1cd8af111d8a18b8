"""elasticd's build. pyproject.toml says everything but this: with ``ELASTICD_MYPYC=1`` in the environment the
front (``elasticd/front``: the relay cores and their asyncio shells, the request path) is compiled with mypyc,
from the same typed sources, into C extensions next to them; without it elasticd builds as pure Python.

The request path is where the front's CPU goes (benchmarks/front_bench.py): compiled, it costs about a quarter
less. The .deb is built compiled (packaging/deb/debian/rules, with Debian's own mypy); ``./dev test`` runs the
suite on the sources and again on a compiled copy, since mypyc checks types at run time that Python does not.
Needs mypy (which carries mypyc) and a C compiler with Python's headers (python3-dev) when compiling.
"""

import os
from pathlib import Path

from setuptools import setup

# The request path: the whole core and the shells that carry its effects out (not the front's metrics
# collector, read once a scrape). Paths relative to the source tree, where pip and pybuild run this.
COMPILED = [*sorted(str(path) for path in Path("elasticd/front/core").glob("*.py")),
            "elasticd/front/client.py", "elasticd/front/forwarding.py", "elasticd/front/links.py",
            "elasticd/front/listening.py", "elasticd/front/queueing.py", "elasticd/front/server.py",
            "elasticd/front/upstream.py", "elasticd/front/waiting.py", "elasticd/front/worker_health.py",
            "elasticd/front/worker_links.py"]


def ext_modules() -> list:
    if os.environ.get("ELASTICD_MYPYC", "0") != "1":
        return []
    from mypyc.build import mypycify

    # --ignore-missing-imports: Debian's httptools and psutil ship no type information (./dev test checks the
    # types in full; this is only the compile).
    # One shared library for the lot, named (elasticd/front_native__mypyc...so) rather than after a hash at the
    # top of site-packages, where it would sit outside the package.
    return mypycify(["--ignore-missing-imports", *COMPILED], opt_level="3",
                    separate=[(COMPILED, "elasticd.front_native")])


setup(ext_modules=ext_modules())
