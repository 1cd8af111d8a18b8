"""A tenant's file: the body's shape and its text (document.py), and the file written whole or not at all, with its
backups aside (store.py), including a writer interrupted half-way."""

from __future__ import annotations

import io
import os

import pytest
from ruamel.yaml import YAML

from elasticd.tenant_files import store
from elasticd.tenant_files.document import BodyError, parse_body, tenant_text

BODY = b"# shop's limits\nresources: {cpu: 50%}\napps: {}\n"


@pytest.mark.parametrize(("raw", "kind", "says"), [
    (b"[1]", "application/json", "must be the tenant's mapping"),
    (b"null", "application/json", "not null"),
    (b"{bad", "application/json", "not valid JSON"),
    (b"a: [", "application/yaml", "not valid YAML"),
    (b"\xff\xfe", "application/json", "not UTF-8"),
    (b'{"tenants": {"acme": {}}}', "application/json", "not a whole file"),
    (b"x" * ((1 << 20) + 1), "application/json", "over the"),
])
def test_bodies_that_are_not_a_tenants_mapping(raw, kind, says):
    with pytest.raises(BodyError, match=says):
        parse_body(raw, kind)


def test_the_body_is_kept_as_sent_under_its_tenant_and_its_lines_can_be_found():
    body = parse_body(BODY, "application/yaml; charset=utf-8")
    text, offset = tenant_text("acme", BODY, body, "test")
    assert "    # shop's limits\n    resources: {cpu: 50%}\n" in text
    assert YAML(typ="safe").load(io.StringIO(text))["tenants"]["acme"] == body
    assert text.splitlines()[offset] == "    # shop's limits"  # the body's line 1 is the file's offset + 1


def test_a_body_that_cannot_be_placed_as_it_is_is_dumped():
    raw = b"---\nresources: {cpu: 50%}\n"  # a document marker: it cannot be indented under a key
    body = parse_body(raw, "application/yaml")
    text, offset = tenant_text("acme", raw, body, "test")
    assert offset is None and YAML(typ="safe").load(io.StringIO(text))["tenants"]["acme"] == body


def test_write_replace_and_remove_keep_backups_aside(tmp_path):
    confd, aside = tmp_path / "elastic.d", tmp_path / "state"
    confd.mkdir()
    path = confd / "acme.yaml"
    assert store.write_file(path, "one\n", aside) is None
    backup = store.write_file(path, "two\n", aside)
    assert path.read_text() == "two\n" and backup is not None and backup.read_text() == "one\n"
    assert backup.parent == aside and os.listdir(confd) == ["acme.yaml"]
    removed = store.remove_file(path, aside)
    assert not path.exists() and removed is not None and removed.read_text() == "two\n"
    assert os.listdir(confd) == []
    store.restore(path, removed)
    assert path.read_text() == "two\n"


def test_a_write_interrupted_half_way_leaves_the_old_file_whole(tmp_path, monkeypatch):
    confd, aside = tmp_path / "elastic.d", tmp_path / "state"
    confd.mkdir()
    path = confd / "acme.yaml"
    store.write_file(path, "old\n", aside)

    def crash(src, dst):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.write_file(path, "new\n", aside)
    monkeypatch.undo()
    assert path.read_text() == "old\n" and os.listdir(confd) == ["acme.yaml"]  # no temporary file left
    assert [name for name in os.listdir(aside) if name.startswith("acme.yaml.bak.")] == []  # nor its backup
    # a writer killed outright leaves its hidden temporary file: no include matches it, the next write removes it
    (confd / ".acme.yaml.123-abcd.tmp").write_text("half of a fi")
    store.write_file(path, "newer\n", aside)
    assert os.listdir(confd) == ["acme.yaml"] and path.read_text() == "newer\n"


def test_backups_are_bounded(tmp_path):
    from datetime import UTC, datetime, timedelta
    confd, aside = tmp_path / "elastic.d", tmp_path / "state"
    confd.mkdir()
    path = confd / "acme.yaml"
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(store.KEEP + 5):
        store.write_file(path, f"{n}\n", aside, now=start + timedelta(minutes=n))
    assert len(os.listdir(aside)) == store.KEEP
