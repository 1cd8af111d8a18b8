"""The README is read on a clone: every link in it resolves inside the repository (a path outside it, such as the
team's ../shared, is a dead link there)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# [text](target) and ![alt](target); the target up to a space (a title) or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)")


def _local_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t)]


def test_every_local_link_of_the_readme_resolves_inside_the_repository():
    broken = []
    for target in _local_links((ROOT / "README.md").read_text()):
        path = (ROOT / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert broken == []


def test_the_link_finder_sees_what_a_renderer_would():
    text = "see [x](docs/a.md), ![p](docs/b.png \"t\"), [web](https://e.org/x), [here](#top), [up](../shared/VM.md)"
    assert _local_links(text) == ["docs/a.md", "docs/b.png", "../shared/VM.md"]
