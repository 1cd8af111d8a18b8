"""The pure half of ``--persist``: a round-trip edit of awkward real-world YAML changes only the expected lines."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from elasticd.config import parse_config
from elasticd.limits.splice import LimitEdit, PersistError, changed_lines, check_edit, edit_text

ROOT = Path(__file__).resolve().parent.parent


def doc(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def diff(old: str, new: str) -> list[str]:
    """The changed lines only (no context), with their hunk headers: positions are asserted too."""
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), n=0, lineterm="")
    return [line for line in lines if not line.startswith(("---", "+++"))]


def edited(text: str, tenant: str, edit: LimitEdit) -> str:
    new = edit_text(text, tenant, edit)
    check_edit(text, new, tenant, edit)  # loads with parse_config, and means exactly old + edit
    parse_config(new)
    return new


# --------------------------------------------------------------------------------------------- documents

COMMENTS = doc("""
    # elasticd (a head comment)

    server:   # the server
      listen: 127.0.0.1:8080   # the front
    # between the sections

    tenants:   # every tenant
      # before acme
      acme:   # acme itself
        # before resources
        resources:   # after the key
          # before cpu
          cpu: 150%   # cpu, aligned
          memory: 1G  # memory, close
          # after memory

        # before apps
        apps:
          shop:
            domains: [shop.localhost]   # domains
            root: /srv/acme/shop
            groups:
              green:
                command: ["{python}", "-m", "elasticd.demo"]
    # the very end
""")

FOUR_SPACES = doc("""
    ---
    # four spaces per level, quoted values, a sequence at the key's column
    server:
        listen: 127.0.0.1:8080
        cgroups:
            path: null
    tenants:
        acme:
            resources:
                cpu: "150%"
                memory: '1G'
                io_weight: 100
            apps:
                shop:
                    domains:
                    - shop.localhost
                    root: /srv/acme/shop
                    groups:
                        green:
                            command:
                                - "{python}"
                                - -m
                                - elasticd.demo
""")

FLOW = doc("""
    tenants:
      acme:
        resources: {cpu: 150%, memory: 1G}
        apps: {shop: {domains: [shop.localhost], root: /srv/acme/shop, groups: {g: {command: [a]}}}}
      globex:
        resources:
          io_bandwidth: { read: 50M , write: "20M" }   # the disk
          pids: 64
        apps:
          blog:
            domains: [blog.localhost]
            root: /srv/globex/blog
            groups:
              main:
                command: [b]
                pool: {min_workers: 1, max_workers: 2,
                       memory_limit: 256M}
""")

ANCHORS = doc("""
    tenants:
      acme:
        resources:
          cpu: &cpu 100%
          memory: 1G
        apps:
          shop:
            domains: [shop.localhost]
            root: /srv/acme/shop
            groups:
              green:
                command: &cmd ["{python}", "-m", "elasticd.demo"]
                env: &common {A: 1, B: "two"}
              blue:
                command: *cmd
                env: *common
      globex:
        resources:
          cpu: *cpu
        apps:
          blog:
            domains: [blog.localhost]
            root: /srv/globex/blog
            groups:
              main:
                command: *cmd
                env: *common
""")

NO_RESOURCES = doc("""
    tenants:

      acme:

        quotas:
          max_concurrent_requests: 64

        # the applications
        apps:

          shop:
            domains: [shop.localhost]
            root: /srv/acme/shop
            groups:
              green:
                command: [a]
                pool: {min_workers: 1, max_workers: 4, reception_threshold: 0.5,
                       admission_threshold: 0.8, compaction_margin: 1.5}
""")

NULL_RESOURCES = doc("""
    tenants:
      acme:
          resources: ~   # limits come later
          apps:
              shop: {domains: [shop.localhost], root: /srv/acme/shop, groups: {g: {command: [a]}}}
""")

BLOCK_IO = doc("""
    tenants:
      acme:
        resources:
          io_bandwidth:
            read: 50M    # rbps
          cpu: 10%
        apps:
          shop: {domains: [shop.localhost], root: /srv/acme/shop, groups: {g: {command: [a]}}}
      globex:
        apps:
          blog: {domains: [blog.localhost], root: /srv/globex/blog, groups: {g: {command: [a]}}}
""")

EXAMPLE = (ROOT / "etc" / "elastic.d" / "acme.yaml").read_text()  # the example's tenant files (limit --persist's)
EXAMPLE_GLOBEX = (ROOT / "etc" / "elastic.d" / "globex.yaml").read_text()

ROUND_TRIPS = [
    pytest.param(COMMENTS, "acme", LimitEdit(cpu="50%", memory="512M", pids=256), [
        "@@ -13,2 +13,3 @@",
        "-      cpu: 150%   # cpu, aligned",
        "-      memory: 1G  # memory, close",
        "+      cpu: 50%    # cpu, aligned",
        "+      memory: 512M # memory, close",
        "+      pids: 256",
    ], id="comments-everywhere"),
    pytest.param(FOUR_SPACES, "acme", LimitEdit(cpu="50%", memory="512M", io_write="20M"), [
        "@@ -10,2 +10,2 @@",
        '-            cpu: "150%"',
        "-            memory: '1G'",
        '+            cpu: "50%"',
        "+            memory: '512M'",
        "@@ -12,0 +13 @@",
        "+            io_bandwidth: {write: 20M}",
    ], id="four-spaces-quoted-document-start"),
    pytest.param(FLOW, "globex", LimitEdit(io_read="10M", io_write="5M"), [
        "@@ -7 +7 @@",
        '-      io_bandwidth: { read: 50M , write: "20M" }   # the disk',
        '+      io_bandwidth: { read: 10M , write: "5M" }   # the disk',
    ], id="flow-io-bandwidth-in-place"),
    pytest.param(FLOW, "acme", LimitEdit(memory="2G", io_read="1M"), [
        "@@ -3 +3 @@",
        "-    resources: {cpu: 150%, memory: 1G}",
        "+    resources: {cpu: 150%, memory: 2G, io_bandwidth: {read: 1M}}",
    ], id="flow-resources-gets-a-flow-key"),
    pytest.param(ANCHORS, "globex", LimitEdit(cpu="50%"), [
        "@@ -19 +19 @@",
        "-      cpu: *cpu",
        "+      cpu: 50%",
    ], id="alias-replaced-here-only"),
    pytest.param(ANCHORS, "acme", LimitEdit(memory="2G", swap="512M"), [
        "@@ -5 +5,2 @@",
        "-      memory: 1G",
        "+      memory: 2G",
        "+      swap: 512M",
    ], id="anchors-elsewhere-untouched"),
    pytest.param(NO_RESOURCES, "acme", LimitEdit(cpu="50%", io_weight=200), [
        "@@ -6,0 +7,3 @@",
        "+    resources:",
        "+      cpu: 50%",
        "+      io_weight: 200",
    ], id="resources-added-before-apps"),
    pytest.param(NULL_RESOURCES, "acme", LimitEdit(memory="1G", io_read="50M"), [
        "@@ -3 +3,3 @@",
        "-      resources: ~   # limits come later",
        "+      resources:   # limits come later",
        "+          memory: 1G",
        "+          io_bandwidth: {read: 50M}",
    ], id="null-resources-filled-at-the-files-indent"),
    pytest.param(BLOCK_IO, "acme", LimitEdit(io_read="max", io_write="1G", cpu="max"), [
        "@@ -5,2 +5,3 @@",
        "-        read: 50M    # rbps",
        "-      cpu: 10%",
        "+        read: max    # rbps",
        "+        write: 1G",
        "+      cpu: max",
    ], id="block-io-bandwidth-gets-a-block-key"),
    pytest.param(BLOCK_IO, "globex", LimitEdit(io_read="5M"), [
        "@@ -9,0 +10,3 @@",
        "+    resources:",
        "+      io_bandwidth:",
        "+        read: 5M",
    ], id="new-io-bandwidth-follows-the-files-block-style"),
    pytest.param(EXAMPLE, "acme", LimitEdit(cpu="50%", memory="512M", io_write="10M"), [
        "@@ -9,2 +9,2 @@",
        '-      cpu: 150%                     # -> cpu.max "150000 100000"; "max" = unlimited',
        "-      memory: 1G                    # -> memory.max",
        '+      cpu: 50%                      # -> cpu.max "150000 100000"; "max" = unlimited',
        "+      memory: 512M                  # -> memory.max",
        "@@ -14 +14 @@",
        "-      io_bandwidth: {read: 50M, write: 20M}   # -> io.max rbps/wbps on each disk under the apps' roots",
        "+      io_bandwidth: {read: 50M, write: 10M}   # -> io.max rbps/wbps on each disk under the apps' roots",
    ], id="the-example-config"),
]


@pytest.mark.parametrize(("text", "tenant", "edit", "expected"), ROUND_TRIPS)
def test_round_trip_changes_only_the_expected_lines(text, tenant, edit, expected, request):
    if text is EXAMPLE:
        request.getfixturevalue("demo_users")  # its tenants' users must exist for it to load
    parse_config(text)  # every document is a valid config to begin with
    new = edited(text, tenant, edit)
    assert diff(text, new) == expected
    assert changed_lines(text, new) == sum(1 for line in expected if line.startswith("+"))


# --------------------------------------------------------------------------------------------- values as typed


def raw(text: str, tenant: str) -> dict:
    return YAML().load(text)["tenants"][tenant]["resources"]


@pytest.mark.parametrize(("old", "edit", "line"), [
    ("memory: 1G", LimitEdit(memory="512M"), "memory: 512M"),
    ("memory: 1G", LimitEdit(memory="1024M"), "memory: 1024M"),  # not normalised to 1G
    ("memory: 1G", LimitEdit(memory="536870912"), "memory: 536870912"),
    ("memory: '1G'", LimitEdit(memory="512M"), "memory: '512M'"),
    ('memory: "1G"', LimitEdit(memory="max"), 'memory: "max"'),
    ("cpu: 150%", LimitEdit(cpu="50%"), "cpu: 50%"),
    ("cpu: 150%", LimitEdit(cpu=" 12.5% "), "cpu: 12.5%"),
    ('cpu: "150%"', LimitEdit(cpu="50%"), 'cpu: "50%"'),
    ("cpu: '150%'", LimitEdit(cpu="max"), "cpu: 'max'"),
    ("pids: 512", LimitEdit(pids="max"), "pids: max"),
    ("pids: 'max'", LimitEdit(pids=256), "pids: 256"),  # a number is never quoted: it would be a string
    ("pids: max", LimitEdit(pids="256"), "pids: 256"),
    ("io_weight: 100", LimitEdit(io_weight=250), "io_weight: 250"),
    ("swap: 0", LimitEdit(swap="1G"), "swap: 1G"),
    ("cpu: !!str 150%", LimitEdit(cpu="50%"), "cpu: !!str 50%"),
    ("cpu:", LimitEdit(cpu="50%"), "cpu: 50%"),
])
def test_a_value_keeps_the_unit_and_quoting_typed(old, edit, line):
    text = doc(f"""
        tenants:
          acme:
            resources:
              {old}
            apps: {{}}
    """)
    new = edited(text, "acme", edit)
    assert diff(text, new) == ["@@ -4 +4 @@", f"-      {old}".rstrip(), f"+      {line}"]


def test_absent_keys_are_added_inside_the_resources_block():
    text = doc("""
        tenants:
          acme:
            resources:
              cpu: 150%
            # the apps
            apps: {}
          globex:
            resources: {}
    """)
    new = edited(text, "acme", LimitEdit(memory="512M", io_read="50M", io_write="20M"))
    assert diff(text, new) == ["@@ -4,0 +5,2 @@", "+      memory: 512M", "+      io_bandwidth: {read: 50M, write: 20M}"]
    assert raw(new, "acme") == {"cpu": "150%", "memory": "512M", "io_bandwidth": {"read": "50M", "write": "20M"}}
    new = edited(text, "globex", LimitEdit(cpu="5%", io_read="1M"))
    assert diff(text, new) == ["@@ -8 +8 @@", "-    resources: {}",
                               "+    resources: {cpu: 5%, io_bandwidth: {read: 1M}}"]


def test_resources_added_to_a_tenant_without_one_goes_under_its_key_when_apps_comes_first():
    text = doc("""
        tenants:
            acme:     # the tenant
                # its apps
                apps: {}
                quotas: {max_concurrent_requests: 4}
    """)
    new = edited(text, "acme", LimitEdit(cpu="50%"))
    assert diff(text, new) == ["@@ -2,0 +3,2 @@", "+        resources:", "+            cpu: 50%"]


def test_line_endings_and_a_byte_order_mark_are_kept():
    text = "\ufefftenants:\r\n  acme:\r\n    resources:\r\n      cpu: 150%\r\n    apps: {}"  # and no final newline
    new = edited(text, "acme", LimitEdit(cpu="50%", memory="1G"))
    assert new == "\ufefftenants:\r\n  acme:\r\n    resources:\r\n      cpu: 50%\r\n      memory: 1G\r\n    apps: {}"
    new = edited(text, "acme", LimitEdit(swap="0"))  # the config's last line gets its line break
    assert diff(text, new) == ["@@ -4,0 +5 @@", "+      swap: 0"]


def test_a_block_scalar_value_becomes_a_plain_one():
    text = "tenants:\n  acme:\n    resources:\n      cpu: |\n        150%\n      memory: 1G\n    apps: {}\n"
    new = edited(text, "acme", LimitEdit(cpu="50%"))
    assert new == "tenants:\n  acme:\n    resources:\n      cpu: 50%\n      memory: 1G\n    apps: {}\n"


def test_merge_keys_are_overridden_locally_not_edited_at_the_anchor():
    text = doc("""
        tenants:
          acme:
            resources: &base {cpu: 100%, memory: 1G}
            apps: {}
          globex:
            resources:
              <<: *base
              cpu: 20%
            apps: {}
    """)
    new = edited(text, "globex", LimitEdit(cpu="30%", memory="2G"))
    assert diff(text, new) == ["@@ -8 +8,2 @@", "-      cpu: 20%", "+      cpu: 30%", "+      memory: 2G"]
    assert parse_config(new).tenants["acme"].resources.memory == 1024**3
    with pytest.raises(PersistError, match=r"tenants\.acme\.resources is shared through the anchor &base"):
        edit_text(text, "acme", LimitEdit(memory="2G"))


def test_a_shared_value_is_refused_but_its_alias_is_replaced():
    with pytest.raises(PersistError, match=r"tenants\.acme\.resources\.cpu is shared through the anchor &cpu"):
        edit_text(ANCHORS, "acme", LimitEdit(cpu="50%"))
    text = "tenants:\n  acme:\n    resources: &r {cpu: 1%}\n    apps: {}\n  globex:\n    resources: *r\n    apps: {}\n"
    with pytest.raises(PersistError, match=r"tenants\.globex\.resources is an alias \(\*r\)"):
        edit_text(text, "globex", LimitEdit(cpu="50%"))


# --------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("text", "tenant", "message"), [
    ("tenants:\n  acme:\n    apps: {}\n", "globex", r"no tenant 'globex' in the file \(tenants: acme\)"),
    ("server: {}\n", "acme", r"no tenant 'acme': the file has no tenants mapping"),
    ("", "acme", r"no tenant 'acme': the file has no tenants mapping"),
    ("tenants: [acme]\n", "acme", r"no tenant 'acme': the file has no tenants mapping"),
    ("tenants:\n  acme:\n", "acme", r"tenants\.acme is empty, not a mapping"),
    ("tenants:\n  acme: [1]\n", "acme", r"tenants\.acme is a list, not a mapping"),
    ("tenants:\n  acme:\n    resources: [1]\n", "acme", r"tenants\.acme\.resources is a list, not a mapping"),
    ("tenants:\n  acme:\n    resources: {io_bandwidth: 5M}\n", "acme",
     r"tenants\.acme\.resources\.io_bandwidth is a value, not a mapping"),
    ("tenants:\n  acme:\n    resources: {cpu: {a: 1}}\n", "acme", r"tenants\.acme\.resources\.cpu is a mapping, not"),
    ("tenants:\n  acme: {resources: {cpu: 1%}\n", "acme", r"not valid YAML"),
])
def test_edit_text_refuses(text, tenant, message):
    with pytest.raises(PersistError, match=message):
        edit_text(text, tenant, LimitEdit(cpu="50%", io_read="1M"))


def test_an_invalid_value_is_reported_with_its_key_path_and_line():
    new = edit_text(COMMENTS, "acme", LimitEdit(cpu="fifty"))
    with pytest.raises(PersistError) as caught:
        check_edit(COMMENTS, new, "acme", LimitEdit(cpu="fifty"), "/etc/elastic.yaml")
    assert 'tenants.acme.resources.cpu (line 13): "fifty" is not a percentage' in str(caught.value)
    assert str(caught.value).startswith("/etc/elastic.yaml: the edited file would not load, nothing was changed")


def test_typed_text_cannot_add_yaml_of_its_own():
    evil = "50%\n      memory: 1T"
    new = edit_text(COMMENTS, "acme", LimitEdit(cpu=evil))
    assert diff(COMMENTS, new) == ["@@ -13 +13 @@", "-      cpu: 150%   # cpu, aligned",
                                   '+      cpu: "50%\\n      memory: 1T" # cpu, aligned']
    assert raw(new, "acme")["cpu"] == evil.strip()
    with pytest.raises(PersistError, match="is not a percentage"):
        check_edit(COMMENTS, new, "acme", LimitEdit(cpu=evil))
    for text in ("# x", "a: b", "{x}", "50%, memory: 1T", "'q'"):
        new = edit_text(FLOW, "acme", LimitEdit(cpu=text))
        assert YAML().load(new)["tenants"]["acme"]["resources"]["cpu"] == text


def test_check_edit_catches_an_edit_that_did_not_land_or_changed_more():
    new = COMMENTS.replace("cpu: 150%", "cpu: 50%")
    check_edit(COMMENTS, new, "acme", LimitEdit(cpu="50%"))
    with pytest.raises(PersistError, match=r"did not land as intended \(.*tenants\.acme\.resources\.cpu reads"):
        check_edit(COMMENTS, new, "acme", LimitEdit(cpu="40%"))
    with pytest.raises(PersistError, match=r"changed more than tenants\.acme\.resources"):
        check_edit(COMMENTS, new.replace("root: /srv/acme/shop", "root: /srv/x"), "acme", LimitEdit(cpu="50%"))


def test_nothing_to_change_returns_the_text_itself():
    assert edit_text(COMMENTS, "acme", LimitEdit()) == COMMENTS
    assert edit_text(COMMENTS, "acme", LimitEdit(cpu="150%")) == COMMENTS
    with pytest.raises(PersistError, match="no tenant"):
        edit_text(COMMENTS, "globex", LimitEdit())


def test_an_aliased_tenant_is_refused():
    text = "tenants:\n  acme: &t\n    resources: {cpu: 1%}\n    apps: {}\n  globex: *t\n"
    with pytest.raises(PersistError, match=r"tenants\.globex is an alias \(\*t\): editing it would change &t"):
        edit_text(text, "globex", LimitEdit(cpu="50%"))
    with pytest.raises(PersistError, match=r"tenants\.acme is shared through the anchor &t"):
        edit_text(text, "acme", LimitEdit(cpu="50%"))


EVERY_FIELD = {"cpu": "75%", "memory": "768M", "swap": "max", "pids": 300, "io_weight": 500, "io_read": "5M",
               "io_write": "max"}


DOCUMENTS = {"comments": COMMENTS, "four-spaces": FOUR_SPACES, "flow": FLOW, "anchors": ANCHORS,
             "no-resources": NO_RESOURCES, "null-resources": NULL_RESOURCES, "block-io": BLOCK_IO, "example": EXAMPLE,
             "example-globex": EXAMPLE_GLOBEX}


@pytest.mark.parametrize(("name", "tenant"), [
    ("comments", "acme"), ("four-spaces", "acme"), ("flow", "acme"), ("flow", "globex"), ("anchors", "globex"),
    ("no-resources", "acme"), ("null-resources", "acme"), ("block-io", "acme"), ("block-io", "globex"),
    ("example", "acme"), ("example-globex", "globex"),
])
def test_each_key_and_mixes_of_them_land_and_a_second_time_change_nothing(name, tenant, request):
    if name.startswith("example"):
        request.getfixturevalue("demo_users")
    text = DOCUMENTS[name]
    names = list(EVERY_FIELD)
    for mask in [1 << i for i in range(len(names))] + [0b1111111, 0b1010101, 0b0101010, 0b1100011, 0b0011100]:
        edit = LimitEdit(**{n: EVERY_FIELD[n] for i, n in enumerate(names) if mask >> i & 1})
        new = edited(text, tenant, edit)  # check_edit: it loads, and means exactly the old text plus the edit
        assert edit_text(new, tenant, edit) == new, edit
