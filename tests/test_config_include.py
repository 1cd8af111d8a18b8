"""One file per tenant: the main file's include: globs, errors that name their file and line, a tenant defined
twice, files refused for who may write them or where they point, server.tenant_config_dir, and the cache that lets a
reload take an unchanged file's tenants as they were."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elasticd.config import ConfigError, load_config
from elasticd.config.include import ParsedFiles


def _app(name: str, root: Path) -> str:
    return (f"apps: {{{name}: {{domains: [{name}.localhost], root: {root}, "
            "groups: {g: {command: [x], pool: {min_workers: 0}}}}}")


@pytest.fixture
def host(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    confd = tmp_path / "elastic.d"
    confd.mkdir(mode=0o755)
    main = tmp_path / "elastic.yaml"

    def write_main(extra: str = "", tenants: str = "") -> Path:
        main.write_text(f"include: [{confd}/*.yaml]\nserver:\n  listen: 127.0.0.1:9000{extra}\n{tenants}")
        return main

    def write_tenant(name: str, body: str | None = None, file: str | None = None) -> Path:
        path = confd / (file or f"{name}.yaml")
        path.write_text(body if body is not None else f"tenants:\n  {name}:\n    {_app(name + 'app', root)}\n")
        os.chmod(path, 0o644)
        return path

    write_main()
    return main, confd, root, write_main, write_tenant


def test_tenants_from_every_included_file_and_the_main_one(host):
    main, confd, root, write_main, write_tenant = host
    write_main(tenants=f"tenants:\n  local:\n    {_app('localapp', root)}\n")
    write_tenant("acme")
    write_tenant("globex")
    config = load_config(main)
    assert sorted(config.tenants) == ["acme", "globex", "local"]
    assert config.tenant_files == {"acme": str(confd / "acme.yaml"), "globex": str(confd / "globex.yaml")}
    assert config.file_of("local") == str(main) and config.includes == (f"{confd}/*.yaml",)


def test_a_main_file_without_include_works_as_before(tmp_path):
    main = tmp_path / "elastic.yaml"
    main.write_text("server: {listen: 127.0.0.1:9000}\n")
    assert load_config(main).includes == ()


def test_relative_globs_are_relative_to_the_main_file(host):
    main, _confd, _root, _write_main, write_tenant = host
    main.write_text("include: [elastic.d/*.yaml]\n")
    write_tenant("acme")
    assert list(load_config(main).tenants) == ["acme"]


def test_an_error_in_an_included_file_names_that_file_and_its_line(host):
    main, _confd, root, _write_main, write_tenant = host
    write_tenant("acme")
    bad = write_tenant("globex", f"tenants:\n  globex:\n    resources: {{cpu: 15O%}}\n    {_app('g', root)}\n")
    with pytest.raises(ConfigError) as info:
        load_config(main)
    assert str(info.value).startswith(f'{bad}: tenants.globex.resources.cpu (line 3): "15O%" is not a percentage')


def test_a_tenant_defined_in_two_files_is_refused_naming_both(host):
    main, _confd, root, _write_main, write_tenant = host
    first = write_tenant("acme")
    second = write_tenant("acme", f"# a copy\ntenants:\n  acme:\n    {_app('other', root)}\n", file="zz-acme.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(main)
    assert str(info.value) == (f"{second}: tenants.acme (line 3): is defined again here: {first} (line 2) defines "
                               "it already")


def test_a_domain_routed_twice_across_files_names_the_second_file(host):
    main, _confd, root, _write_main, write_tenant = host
    write_tenant("acme")
    second = write_tenant("globex", f"tenants:\n  globex:\n    {_app('acmeapp', root)}\n")
    with pytest.raises(ConfigError) as info:
        load_config(main)
    assert str(info.value).startswith(f"{second}: tenants.globex.apps.acmeapp.domains (line 3): ")
    assert "is already routed to tenants.acme.apps.acmeapp" in str(info.value)


@pytest.mark.parametrize(("body", "says"), [
    ("- a list\n", "tenants file is"),
    ("tenants: [acme]\n", "tenants (line 1): must be a mapping"),
    ("server: {listen: 127.0.0.1:1}\n", "server (line 1): unknown key (expected one of: tenants)"),
    ("tenants:\n  Bad_Name:\n    apps: {}\n", "tenants.Bad_Name (line 2): \"Bad_Name\" is not a valid tenant name"),
    ("tenants: {acme: [\n", "line 2: not valid YAML"),
])
def test_bad_included_files_are_refused_with_what_and_where(host, body, says):
    main, _confd, _root, _write_main, write_tenant = host
    bad = write_tenant("acme", body)
    with pytest.raises(ConfigError) as info:
        load_config(main)
    text = str(info.value)
    assert text.startswith(f"{bad}: "), text
    if says != "tenants file is":
        assert says in text, text


def test_a_symlink_that_points_elsewhere_is_refused(host, tmp_path):
    main, confd, root, _write_main, write_tenant = host
    outside = tmp_path / "outside.yaml"
    outside.write_text(f"tenants:\n  evil:\n    {_app('evil', root)}\n")
    (confd / "evil.yaml").symlink_to(outside)
    with pytest.raises(ConfigError) as info:
        load_config(main)
    assert f"{confd}/evil.yaml is a symbolic link to {outside}, outside {confd}" in str(info.value)
    assert "include (line 1)" in str(info.value)
    (confd / "evil.yaml").unlink()
    target = write_tenant("acme")
    (confd / "b.yaml").symlink_to(target.name)  # within the directory: taken (and then a duplicate)
    with pytest.raises(ConfigError, match="is defined again here"):
        load_config(main)


@pytest.mark.parametrize("mode", [0o664, 0o666])
def test_a_file_others_may_write_is_refused(host, mode):
    main, _confd, _root, _write_main, write_tenant = host
    path = write_tenant("acme")
    os.chmod(path, mode)
    with pytest.raises(ConfigError) as info:
        load_config(main)
    assert f"{path} is writable by" in str(info.value) and "could raise its own limits" in str(info.value)


def test_tenant_config_dir_must_be_covered_by_an_include(host, tmp_path):
    main, confd, _root, write_main, _write_tenant = host
    write_main(extra=f"\n  tenant_config_dir: {confd}")
    assert load_config(main).server.tenant_config_dir == str(confd)
    write_main(extra=f"\n  tenant_config_dir: {tmp_path / 'elsewhere'}")
    with pytest.raises(ConfigError) as info:
        load_config(main)
    assert f"server.tenant_config_dir (line 4): {tmp_path / 'elsewhere'} is not read" in str(info.value)


def test_an_unchanged_file_keeps_its_tenants_and_a_changed_one_is_read_again(host):
    main, confd, root, _write_main, write_tenant = host
    write_tenant("acme")
    write_tenant("globex")
    cache = ParsedFiles()
    first = load_config(main, cache)
    again = load_config(main, cache)
    assert again.tenants["acme"] is first.tenants["acme"] and again.tenants["globex"] is first.tenants["globex"]
    write_tenant("globex", f"tenants:\n  globex:\n    resources: {{cpu: 50%}}\n    {_app('globexapp', root)}\n")
    changed = load_config(main, cache)
    assert changed.tenants["acme"] is first.tenants["acme"]
    assert changed.tenants["globex"].resources.cpu == 50.0
    # a broken file: refused, and the cache keeps the last good parse of every file
    write_tenant("globex", "tenants: [\n")
    with pytest.raises(ConfigError):
        load_config(main, cache)
    assert len(cache.entries) == 2
    (confd / "globex.yaml").unlink()
    assert list(load_config(main, cache).tenants) == ["acme"] and len(cache.entries) == 1


def test_a_tenant_opening_its_own_root_cannot_stop_the_others_reloads(host):
    """A hostile tenant owns its root and may chmod it o+w: the reload of another tenant's change goes through;
    its own next change is refused, naming the root."""
    main, _confd, root, _write_main, write_tenant = host
    mine = root.parent / "acme-root"
    mine.mkdir(mode=0o755)
    write_tenant("acme", f"tenants:\n  acme:\n    {_app('acmeapp', mine)}\n")
    write_tenant("globex")
    cache = ParsedFiles()
    load_config(main, cache)
    os.chmod(mine, 0o777)
    write_tenant("globex", f"tenants:\n  globex:\n    resources: {{cpu: 50%}}\n    {_app('globexapp', root)}\n")
    assert load_config(main, cache).tenants["globex"].resources.cpu == 50.0
    write_tenant("acme", f"tenants:\n  acme:\n    resources: {{cpu: 10%}}\n    {_app('acmeapp', mine)}\n")
    with pytest.raises(ConfigError, match="is writable by everyone"):
        load_config(main, cache)
