"""``tenants.<t>.isolation``: its defaults, and each refusal naming the key and its line. The user is ``nobody``
(on every Debian host); the paths are this test's own."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

import elasticd.config.isolation as isolation
from elasticd.config import ConfigError, parse_config
from elasticd.config.model import Isolation

pytestmark = pytest.mark.skipif(not Path(isolation.BWRAP).exists(), reason="bubblewrap is not installed")

NOBODY = pwd.getpwnam("nobody")


def _config(tmp_path: Path, tenant_extra: str = "", user: str | None = "nobody", second: str = "") -> str:
    """acme's user is on line 5, the first line of ``tenant_extra`` on line 6 (5 without a user)."""
    (tmp_path / "a").mkdir(exist_ok=True)
    user_line = f"    user: {user}\n" if user is not None else ""
    return (f"server:\n  runtime_dir: {tmp_path}/run\ntenants:\n  acme:\n{user_line}{tenant_extra}"
            f"    apps:\n      shop:\n        domains: [shop.localhost]\n        root: {tmp_path}/a\n"
            f"        groups:\n          main: {{command: [/bin/true]}}\n{second}")


def _errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return [str(issue) for issue in info.value.issues]


def test_a_tenant_with_a_user_is_isolated_by_default(tmp_path):
    config = parse_config(_config(tmp_path))
    assert config.tenants["acme"].isolation == Isolation(home=None)  # nobody's home is /nonexistent: not bound


def test_a_tenant_without_a_user_or_turned_off_is_not(tmp_path):
    assert parse_config(_config(tmp_path, user=None)).tenants["acme"].isolation is None
    off = _config(tmp_path, "    isolation: {enabled: false}\n")
    assert parse_config(off).tenants["acme"].isolation is None


def test_writable_and_read_only_paths_are_resolved(tmp_path):
    (tmp_path / "a" / "uploads").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "shared")
    text = _config(tmp_path, f"    isolation:\n      writable: [{tmp_path}/a/uploads]\n"
                             f"      read_only: [{tmp_path}/link]\n")
    view = parse_config(text).tenants["acme"].isolation
    assert view == Isolation(writable=(f"{tmp_path}/a/uploads",), read_only=(f"{tmp_path}/shared",))


@pytest.mark.parametrize(("extra", "user", "expected"), [
    ("    isolation: {writable: [/usr/lib]}\n", "nobody",
     "tenants.acme.isolation.writable[0] (line 6): /usr/lib is outside the tenant's app roots"),
    ("    isolation:\n      read_only: [/no/such/runtime]\n", "nobody",
     "tenants.acme.isolation.read_only[0] (line 7): /no/such/runtime does not exist"),
    ("    isolation: {read_only: [relative/path]}\n", "nobody",
     'tenants.acme.isolation.read_only[0] (line 6): "relative/path" is not an absolute path'),
    ("    isolation: {read_only: /usr}\n", "nobody",
     'tenants.acme.isolation.read_only (line 6): must be a list of paths, not "/usr"'),
    ("    isolation: {read_only: [/]}\n", "nobody",
     "tenants.acme.isolation.read_only[0] (line 6): / is the whole file system"),
    ("    isolation: {enabled: yes please}\n", "nobody",
     'tenants.acme.isolation.enabled (line 6): "yes please" is not true or false'),
    ("    isolation: {mounts: []}\n", "nobody",
     "tenants.acme.isolation.mounts (line 6): unknown key (expected one of: enabled, writable, read_only)"),
    ("    isolation: {}\n", None,
     "tenants.acme.isolation (line 5): needs a user other than root beside it (the tenant has no user)"),
    ("    isolation: {writable: []}\n", "root",
     "tenants.acme.isolation (line 6): needs a user other than root beside it (the tenant has user root)"),
])
def test_each_refusal_names_the_key_and_line(tmp_path, extra, user, expected):
    errors = _errors(_config(tmp_path, extra, user=user))
    assert any(error.startswith(expected) for error in errors), errors


def test_a_view_may_not_hold_another_tenants_root_or_elasticds_runtime(tmp_path):
    other = (f"  globex:\n    apps:\n      blog:\n        domains: [blog.localhost]\n        root: {tmp_path}/a/blog\n"
             "        groups:\n          main: {command: [/bin/true]}\n")
    errors = _errors(_config(tmp_path, second=other))
    assert any(e.startswith(f"tenants.acme.apps.shop.root (line 9): {tmp_path}/a holds tenant globex's root "
                            f"{tmp_path}/a/blog") for e in errors), errors
    (tmp_path / "run").mkdir()
    errors = _errors(_config(tmp_path, f"    isolation: {{read_only: [{tmp_path}]}}\n"))
    assert any(e.startswith(f"tenants.acme.isolation.read_only[0] (line 6): {tmp_path} holds elasticd's runtime "
                            "directory") for e in errors), errors


def test_without_bubblewrap_an_isolated_tenant_is_refused_at_load(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "BWRAP", str(tmp_path / "no-bwrap"))
    errors = _errors(_config(tmp_path))
    assert errors == [f"tenants.acme.user (line 5): isolating the tenant's workers needs bubblewrap "
                      f"({tmp_path}/no-bwrap), which is not installed here: apt install bubblewrap, or say "
                      "isolation: {enabled: false}"]
    assert parse_config(_config(tmp_path, "    isolation: {enabled: false}\n")).tenants["acme"].isolation is None


def test_a_view_is_checked_against_every_other_root_by_prefix_not_by_pairs():
    """The index behind the view check (checks._Roots): roots a path holds, and roots it lies inside, with names
    that sort between a root and its children ("/srv/a-x" between "/srv/a" and "/srv/a/b")."""
    from elasticd.config.checks import _exposes, _Roots
    roots = _Roots({"/srv/a": ["a"], "/srv/a-x": ["ax"], "/srv/a/b": ["b"], "/srv/c": ["c"]})
    assert sorted(roots.held_by("/srv/a")) == ["/srv/a", "/srv/a/b"]
    assert list(roots.around("/srv/a/b/uploads")) == ["/srv/a/b", "/srv/a"]
    assert _exposes("/srv/a", "a", roots, "/run/elasticd") == (
        "holds tenant b's root /srv/a/b: it cannot be in another tenant's view")
    assert _exposes("/srv/a/b/up", "b", roots, "/run/elasticd") == (
        "lies inside tenant a's root /srv/a: it cannot be in another tenant's view")
    assert _exposes("/srv/a-x", "ax", roots, "/run/elasticd") is None
    assert "runtime directory" in _exposes("/run", "c", roots, "/run/elasticd")
