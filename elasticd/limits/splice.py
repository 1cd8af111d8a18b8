"""The pure half of ``--persist``: splice a tenant's new limits into the config text, and prove the result.

``edit_text`` (text in, edited text out) and ``check_edit`` (does the edited text load, and does it mean the
old document with exactly these values set?). No I/O, no clock; ``persist`` is the file shell around it.

Why splice the text instead of dumping ruamel's round-trip model? ruamel's dumper re-emits the whole
document: one indentation setting for every level (a file with 4-space levels, or with ``-`` items at the
key's column, comes back re-indented), ``null`` written as an empty value, double quotes in flow lists turned
into single quotes, long flow mappings re-wrapped. On our own example config a one-value change through
``load``/``dump`` rewrites six other lines. "Only the changed values' lines differ" is not a promise a dump
can keep. ruamel's *parser* can: its events carry the exact character span of every node, so the edit is a
splice of the operator's file at those spans (a value replaced where it stands, a missing key inserted as a
new line in its mapping), and every other byte, comments, quoting, anchors and blank lines included, is left
as it was. ruamel's loader then reads the result back to prove the splice means what was asked.
"""


from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)

from elasticd.config import ConfigError, parse_config

__all__ = ["LimitEdit", "PersistError", "PersistResult", "backup_name", "changed_lines", "check_edit", "edit_text"]


@dataclass(frozen=True, slots=True)
class LimitEdit:
    """Values as the operator typed them ("512M", "50%", "max", 200); None leaves a key as it is."""

    cpu: str | None = None
    memory: str | None = None
    swap: str | None = None
    pids: str | int | None = None
    io_weight: int | None = None
    io_read: str | None = None
    io_write: str | None = None

    def changes(self) -> dict[str, Any]:
        """The edit as the nested keys of ``resources`` it sets, in the order they are written."""
        top = {k: getattr(self, k) for k in ("cpu", "memory", "swap", "pids", "io_weight")}
        changes: dict[str, Any] = {k: v for k, v in top.items() if v is not None}
        io = {k: v for k, v in (("read", self.io_read), ("write", self.io_write)) if v is not None}
        if io:
            changes["io_bandwidth"] = io
        return changes


class PersistError(Exception):
    """The file was not changed; the message says why (a config error with its key path, or an OS error)."""


@dataclass(frozen=True, slots=True)
class PersistResult:
    path: Path
    backup: Path | None  # None: the file already said this, nothing was written
    changed_lines: int  # lines of the new file that are new or rewritten


# --------------------------------------------------------------------------------------------- the pure edit


@dataclass(slots=True, eq=False)
class _Node:
    """A node of the parsed document with its character span in the text."""

    kind: str  # "map", "seq", "scalar" or "alias"
    start: int
    end: int  # one past its last character; a block collection ends where its last child does
    column: int
    flow: bool = False
    style: str | None = None  # a scalar's quoting: None (plain), "'", '"', "|" or ">"
    anchor: str | None = None  # the &name it defines, or for an alias the name it refers to
    value: str = ""
    entries: list[tuple[_Node, _Node]] = field(default_factory=list)  # a map's (key, value) pairs
    close: int = 0  # a flow map's closing brace

    def get(self, key: str) -> tuple[_Node, _Node] | None:
        for k, v in self.entries:
            if k.kind == "scalar" and k.value == key:
                return k, v
        return None

    def is_null(self) -> bool:
        return self.kind == "scalar" and not self.style and self.value in ("", "~", "null", "Null", "NULL")


class _Tree:
    """The first document of a YAML text as ``_Node``s, built from ruamel's parser events (see the module doc)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.aliased: set[str] = set()  # anchors some alias refers to: such nodes are shared
        events = iter(YAML().parse(text))
        self.root: _Node | None = None
        for event in events:
            if isinstance(event, DocumentStartEvent):
                first = next(events)
                if isinstance(first, (ScalarEvent, AliasEvent, MappingStartEvent, SequenceStartEvent)):
                    self.root = self._node(first, events)
                break
        for _ in events:  # parse to the end, so a syntax error anywhere is reported here
            pass

    def _node(self, event: Any, events: Iterator[Any]) -> _Node:
        start, column = event.start_mark.index, event.start_mark.column
        if isinstance(event, AliasEvent):
            self.aliased.add(event.anchor)
            return _Node("alias", start, event.end_mark.index, column, anchor=event.anchor)
        if isinstance(event, ScalarEvent):
            return _Node("scalar", start, event.end_mark.index, column, style=event.style or None,
                         anchor=event.anchor, value=event.value)
        flow = bool(event.flow_style)
        if isinstance(event, SequenceStartEvent):
            node = _Node("seq", start, event.end_mark.index, column, flow=flow, anchor=event.anchor)
            while not isinstance(event := next(events), SequenceEndEvent):
                item = self._node(event, events)
                node.entries.append((item, item))
        else:
            node = _Node("map", start, event.end_mark.index, column, flow=flow, anchor=event.anchor)
            while not isinstance(event := next(events), MappingEndEvent):
                key = self._node(event, events)
                value = self._node(next(events), events)
                if value.kind == "scalar" and not value.style and value.start == value.end:
                    # An empty value (``memory:``) is reported at the *next* token, maybe lines below. Its real
                    # place is right after the key's colon: that is where a new value goes.
                    colon = re.compile(r"\s*:").match(self.text, key.end)
                    value.start = value.end = colon.end() if colon else key.end
                node.entries.append((key, value))
        if node.entries and node.entries[0][0].kind != "alias":
            node.column = node.entries[0][0].column  # a block mapping's indentation is its keys' column
        if flow:
            node.close, node.end = event.start_mark.index, event.end_mark.index
        elif node.entries:
            node.end = node.entries[-1][1].end
        return node


_PLAIN_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._%+-]*$")
_PREFIX_RE = re.compile(r"^(?:[&!]\S*\s+)*")  # a scalar's own &anchor and !tag, kept in front of a new value


def _render(value: str | int, old: _Node | None) -> str:
    """The operator's text as a YAML scalar, in the old value's quoting where it had one.

    A number is always plain (quoted, it would be a string, and every numeric key wants a number); other text
    keeps the old quote style; plain text that YAML would misread (or that holds a newline, a ``#`` or flow
    punctuation) is double-quoted, with JSON's escapes, which are YAML's, so nothing typed can add a key.
    """
    text = str(value).strip()
    style = old.style if old is not None and old.kind == "scalar" else None
    if re.fullmatch(r"[0-9]+", text):
        return text
    if style == "'" and "\n" not in text:
        return "'" + text.replace("'", "''") + "'"
    if style != '"' and _PLAIN_RE.match(text):
        return text
    return json.dumps(text)


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    return _render(value, None)


class _Editor:
    """Collects splices (start, end, new text) against one text, then applies them all at once."""

    def __init__(self, tree: _Tree, newline: str, io_flow: bool) -> None:
        self.tree = tree
        self.text = tree.text
        self.nl = newline
        self.io_flow = io_flow  # a new io_bandwidth is written as a flow map, as the file's others are
        self.splices: list[tuple[int, int, int, str]] = []

    def splice(self, start: int, end: int, new: str) -> None:
        self.splices.append((start, len(self.splices), end, new))

    def apply(self) -> str:
        # From the end backwards, so earlier offsets stay valid; at one offset the first recorded comes first.
        text = self.text
        for start, _, end, new in sorted(self.splices, reverse=True):
            text = text[:start] + new + text[end:]
        return text

    def line_end(self, index: int) -> int:
        """Where a new line goes after the line holding ``index`` (or at ``index`` if a line starts there)."""
        if index > 0 and self.text[index - 1] == "\n":
            return index
        found = self.text.find("\n", index)
        return found + 1 if found >= 0 else len(self.text)

    def lines(self, at: int, body: str) -> None:
        if at == len(self.text) and self.text and not self.text.endswith("\n"):
            body = self.nl + body
        self.splice(at, at, body)

    def block(self, items: dict[str, Any], indent: int, step: int) -> str:
        out = []
        for key, value in items.items():
            pad = " " * indent
            if isinstance(value, dict) and not (key == "io_bandwidth" and self.io_flow):
                out.append(f"{pad}{key}:{self.nl}{self.block(value, indent + step, step)}")
            else:
                out.append(f"{pad}{key}: {_flow(value)}{self.nl}")
        return "".join(out)

    def edit_map(self, node: _Node, owner: _Node | None, changes: dict[str, Any], path: str,
                 before: str | None = None) -> None:
        """Set ``changes`` (nested dicts for nested maps) in mapping ``node`` whose key is ``owner``."""
        _not_shared(self.tree, node, path)
        step = node.column - owner.column if owner is not None and not node.flow else 0
        step = step if step > 0 else 2
        new: dict[str, Any] = {}
        for key, want in changes.items():
            found = node.get(key)
            if found is None:
                new[key] = want
                continue
            knode, vnode = found
            kpath = f"{path}.{key}"
            if isinstance(want, dict):
                if vnode.kind in ("map", "alias"):
                    self.edit_map(vnode, knode, want, kpath)  # which refuses an alias, saying why
                elif vnode.is_null():
                    self.fill_null(knode, vnode, want, in_flow=node.flow, step=step)
                else:
                    raise PersistError(f"{kpath} is {_what(vnode)}, not a mapping: edit it by hand")
            elif vnode.kind in ("map", "seq"):
                raise PersistError(f"{kpath} is {_what(vnode)}, not a value: edit it by hand")
            elif vnode.kind == "alias":
                self.splice(vnode.start, vnode.end, _render(want, None))  # only this use of the anchor changes
            else:
                _not_shared(self.tree, vnode, kpath)
                if vnode.start == vnode.end:  # ``memory:`` (or ``{memory}``, which has no colon)
                    colon = vnode.start > 0 and self.text[vnode.start - 1] == ":"
                    self.splice(vnode.start, vnode.end, (" " if colon else ": ") + _render(want, vnode))
                else:
                    self.replace(vnode, _render(want, vnode))
        if new:
            self.add_entries(node, owner, new, before, step)

    def replace(self, vnode: _Node, new: str) -> None:
        old = self.text[vnode.start:vnode.end]
        new = _PREFIX_RE.match(old).group() + new  # type: ignore[union-attr]  # keeps &anchor/!tag; matches ""
        if old.endswith("\n"):  # a block scalar owned its line break
            self.splice(vnode.start, vnode.end, new + self.nl)
            return
        # An end-of-line comment keeps its column (files align them), as long as one space remains before it.
        gap = re.compile(r"[ \t]+(?=#)").match(self.text, vnode.end)
        if gap is not None and "\n" not in old:
            room = len(gap.group()) - (len(new) - len(old))
            self.splice(vnode.start, gap.end(), new + " " * max(1, room))
        else:
            self.splice(vnode.start, vnode.end, new)

    def fill_null(self, knode: _Node, vnode: _Node, want: dict[str, Any], *, in_flow: bool, step: int) -> None:
        """``resources:`` (or ``~``/``null``) becomes a mapping holding ``want``."""
        if in_flow:
            self.splice(vnode.start, vnode.end, (" " if vnode.start == vnode.end else "") + _flow(want))
            return
        if vnode.start != vnode.end:  # drop the ``~`` and the space before it; a comment after it stays
            start = vnode.start
            while start > knode.end and self.text[start - 1] in " \t":
                start -= 1
            self.splice(start, vnode.end, "")
        self.lines(self.line_end(knode.end), self.block(want, knode.column + step, step))

    def add_entries(self, node: _Node, owner: _Node | None, new: dict[str, Any], before: str | None,
                    step: int) -> None:
        if node.flow:
            if node.entries:
                self.splice(node.entries[-1][1].end, node.entries[-1][1].end, ", " + _flow(new)[1:-1])
            else:
                self.splice(node.close, node.close, _flow(new)[1:-1])
            return
        # A block map: a new line after the entry it follows, so a comment above the next key stays with it.
        index = next((i for i, (k, _) in enumerate(node.entries) if k.kind == "scalar" and k.value == before),
                     len(node.entries))
        if index > 0:
            at = self.line_end(node.entries[index - 1][1].end)
        elif owner is not None:
            at = self.line_end(owner.end)  # first: right under the mapping's own key, above any comment
        else:
            at = self.text.rfind("\n", 0, node.entries[0][0].start) + 1
        self.lines(at, self.block(new, node.column, step))


def _what(node: _Node) -> str:
    return {"map": "a mapping", "seq": "a list", "alias": f"an alias (*{node.anchor})"}.get(node.kind, "a value")


def _not_shared(tree: _Tree, node: _Node, path: str) -> None:
    """Refuse to edit a node that other places reach through an alias: the edit would change them too."""
    if node.kind == "alias":
        raise PersistError(f"{path} is an alias (*{node.anchor}): editing it would change &{node.anchor} and "
                           "every other use of it; edit the file by hand")
    if node.anchor is not None and node.anchor in tree.aliased:
        raise PersistError(f"{path} is shared through the anchor &{node.anchor}: changing it would change every "
                           f"*{node.anchor} too; edit the file by hand")


def _io_flow_style(tenants: _Node) -> bool:
    """Whether the file writes io_bandwidth as a flow map (the example config does; so does a new one)."""
    for _, tnode in tenants.entries:
        res = tnode.get("resources") if tnode.kind == "map" else None
        io = res[1].get("io_bandwidth") if res and res[1].kind == "map" else None
        if io and io[1].kind == "map":
            return io[1].flow
    return True


def edit_text(text: str, tenant: str, edit: LimitEdit) -> str:
    """Set the values of ``edit`` in ``tenants.<tenant>.resources`` of a config text; every other byte stays.

    Raises PersistError when the text is not YAML, the tenant does not exist, or a node on the way is not a
    mapping (or is shared through an anchor). The result is not validated here: see ``check_edit``.
    """
    changes = edit.changes()
    try:
        tree = _Tree(text)
    except Exception as exc:  # ruamel's parser raises MarkedYAMLError and a few unmarked errors
        raise PersistError(f"not valid YAML: {exc}") from None
    root = tree.root
    top = root.get("tenants") if root is not None and root.kind == "map" else None
    if top is None or top[1].kind != "map":
        raise PersistError(f"no tenant {tenant!r}: the file has no tenants mapping")
    found = top[1].get(tenant)
    if found is None:
        raise PersistError(f"no tenant {tenant!r} in the file (tenants: {', '.join(_names(top[1])) or 'none'})")
    tkey, tnode = found
    if tnode.kind not in ("map", "alias"):
        raise PersistError(f"tenants.{tenant} is {_what(tnode) if not tnode.is_null() else 'empty'}, "
                           "not a mapping: edit it by hand")
    if not changes:
        return text
    _not_shared(tree, top[1], "tenants")
    editor = _Editor(tree, "\r\n" if "\r\n" in text else "\n", _io_flow_style(top[1]))
    editor.edit_map(tnode, tkey, {"resources": changes}, f"tenants.{tenant}", before="apps")
    return editor.apply()


def _names(node: _Node) -> list[str]:
    return [k.value for k, _ in node.entries if k.kind == "scalar"]


def _plain(node: Any) -> Any:
    if isinstance(node, CommentedMap):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [_plain(v) for v in node]
    return node


def _as_typed(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_edit(old_text: str, new_text: str, tenant: str, edit: LimitEdit, source: str = "<string>") -> None:
    """Raise PersistError unless ``new_text`` is a valid config that means ``old_text`` with ``edit`` applied.

    The first half is elasticd's own validation (the message names the key path and line). The second is a
    guard on the splice itself: both texts are loaded, and the new one must equal the old one with exactly the
    edited keys set to the typed values, so a misplaced insert or a broken neighbour can never be written.
    """
    try:
        parse_config(new_text, source)
    except ConfigError as exc:
        raise PersistError(f"{source}: the edited file would not load, nothing was changed:\n{exc}") from None
    yaml = YAML(typ="rt")
    try:
        expected, new = _plain(yaml.load(old_text)), _plain(yaml.load(new_text))
    except Exception as exc:  # the new text loaded just now; the old one may not have
        raise PersistError(f"{source} does not load as it is: {exc}") from None
    try:
        tenant_node = expected["tenants"][tenant]
        if not isinstance(tenant_node.get("resources"), dict):
            tenant_node["resources"] = {}
        _expect(tenant_node["resources"], new["tenants"][tenant]["resources"], edit.changes(),
                f"tenants.{tenant}.resources")
    except (KeyError, TypeError, AttributeError) as exc:
        raise PersistError(f"{source}: the edit did not land as intended ({exc}); nothing was changed") from None
    if expected != new:
        raise PersistError(f"{source}: the edit changed more than tenants.{tenant}.resources; nothing was changed")


def _expect(expected: dict[str, Any], got: dict[str, Any], changes: dict[str, Any], path: str) -> None:
    """Set in ``expected`` (the old document) the values ``got`` (the new one) must hold for ``changes``."""
    for key, want in changes.items():
        if isinstance(want, dict):
            if not isinstance(expected.get(key), dict):
                expected[key] = {}
            _expect(expected[key], got[key], want, f"{path}.{key}")
        elif _as_typed(got[key]) != str(want).strip():
            raise KeyError(f"{path}.{key} reads {got[key]!r}")
        else:
            expected[key] = got[key]


def changed_lines(old_text: str, new_text: str) -> int:
    """How many lines of the new text are new or rewritten."""
    matcher = difflib.SequenceMatcher(None, old_text.splitlines(), new_text.splitlines(), autojunk=False)
    return sum(j2 - j1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert"))


def backup_name(path: Path, now: datetime) -> Path:
    """``<file>.bak.<YYYYmmddTHHMMSSZ>``; a naive ``now`` is taken as UTC."""
    now = now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)
    return path.with_name(f"{path.name}.bak.{now:%Y%m%dT%H%M%SZ}")
