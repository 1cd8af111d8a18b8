"""The README is read on a clone: every link in it (and in docs/) resolves inside the repository (a path outside it,
such as the team's ../shared, is a dead link there), and it starts where a newcomer does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# [text](target) and ![alt](target); the target up to a space (a title) or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)")


def _local_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t)]


def test_every_local_link_of_the_readme_and_the_docs_resolves_inside_the_repository():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in _local_links(page.read_text()):
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []


def test_the_readme_shows_the_two_commands_and_a_first_request_early():
    """A newcomer reads what it is, the two commands, then what to try: the development internals come later, in
    docs/DEVELOPMENT.md."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first_curl = next(i for i, line in enumerate(lines) if line.startswith("curl "))
    assert first_curl < 80
    assert "./dev run" in "\n".join(lines[:first_curl]) and "./dev test" in "\n".join(lines[:first_curl])
    assert len(lines) < 800


def test_the_link_finder_sees_what_a_renderer_would():
    text = "see [x](docs/a.md), ![p](docs/b.png \"t\"), [web](https://e.org/x), [here](#top), [up](../shared/VM.md)"
    assert _local_links(text) == ["docs/a.md", "docs/b.png", "../shared/VM.md"]


def test_the_module_map_names_every_module():
    """docs/DEVELOPMENT.md's module map: a newcomer finds every module there, under its package."""
    entries = _map_entries((ROOT / "docs" / "DEVELOPMENT.md").read_text())
    missing = []
    for path in sorted((ROOT / "elasticd").rglob("*.py")):
        package = path.parent.relative_to(ROOT / "elasticd").as_posix()
        if path.name == "__init__.py" and package != "worker":  # (the library's names live in its __init__)
            continue
        if path.name not in (entries if package == "." else entries.get(f"{package}/", "")):
            missing.append(path.relative_to(ROOT).as_posix())
    assert missing == []


def _map_entries(text: str) -> dict[str, str]:
    """The module map's entries: an entry starts at a line indented by two spaces with its name; its lines indented
    deeper follow it."""
    entries: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.strip():
            name, _, rest = line.strip().partition(" ")
            entries[name] = rest
        elif name is not None and line.startswith("   "):
            entries[name] += " " + line.strip()
        else:
            name = None
    return entries
