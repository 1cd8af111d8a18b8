"""The front's routing as tables: which app a Host header reaches."""

from __future__ import annotations

import pytest

from elasticd.config import parse_config
from elasticd.front.core.routing import AppRoute, RouteTable, normalize_host

SHOP = AppRoute("acme", "shop", "green")
BLOG = AppRoute("globex", "blog", "blue")
WILD = AppRoute("globex", "wild", "main")

CONFIG = """
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost, Shop.Example.COM]
        root: /srv/acme/shop
        default_group: green
        groups:
          blue: {command: [x], concurrency: 3}
          green: {command: [x]}
  globex:
    apps:
      blog:
        domains: [blog.localhost, www.blog.localhost]
        root: /srv/globex/blog
        groups:
          blue: {command: [x]}
"""


@pytest.mark.parametrize(("header", "host"), [
    ("shop.localhost", "shop.localhost"),
    ("shop.localhost:8080", "shop.localhost"),
    ("SHOP.LocalHost", "shop.localhost"),
    ("shop.localhost.", "shop.localhost"),
    ("shop.localhost.:8080", "shop.localhost"),
    ("  shop.localhost  ", "shop.localhost"),
    ("[::1]:8080", "::1"),
    ("[::1]", "::1"),
    ("[FE80::1]:80", "fe80::1"),
    ("::1", "::1"),  # bare IPv6: invalid in Host, but not a port
    ("127.0.0.1:8080", "127.0.0.1"),
    ("[::1", None),
    ("", None),
    (None, None),
    (":8080", None),
    (".", None),
])
def test_normalize_host(header: str | None, host: str | None) -> None:
    assert normalize_host(header) == host


def test_from_config_maps_every_domain_to_the_default_group() -> None:
    table = RouteTable.from_config(parse_config(CONFIG))
    shop = AppRoute("acme", "shop", "green", groups=frozenset({"blue", "green"}), label="acme/shop",
                    concurrency=(("blue", 3), ("green", 8)), queues=(("blue", 100, 5.0), ("green", 100, 5.0)))
    assert table.lookup("shop.localhost:8080") == shop
    assert table.lookup("shop.example.com.") == shop
    # each group's concurrency bounds the front's connections to its workers (front.core.bounds)
    assert (shop.concurrency_of("blue"), shop.concurrency_of("green"), shop.concurrency_of("gone")) == (3, 8, 8)
    blog = AppRoute("globex", "blog", "blue", groups=frozenset({"blue"}), label="globex/blog",
                    concurrency=(("blue", 8),), queues=(("blue", 100, 5.0),))
    assert table.lookup("www.blog.localhost") == blog  # first group by default
    assert table.lookup("unknown.localhost") is None
    assert len(table) == 4
    assert set(table.routes()) == {shop, blog}


@pytest.mark.parametrize(("header", "route"), [
    ("shop.localhost", SHOP),
    ("SHOP.LOCALHOST:443", SHOP),
    ("[::1]:8080", BLOG),
    ("::1", BLOG),
    ("a.wild.test", WILD),
    ("a.b.wild.test", WILD),
    ("a.deep.wild.test", SHOP),  # the longer wildcard suffix wins
    ("deep.wild.test", WILD),  # "*.deep.wild.test" needs a label before it, "*.wild.test" matches
    ("wild.test", None),  # and "*.wild.test" needs one too
    ("exact.wild.test", BLOG),  # an exact name beats any wildcard
    ("other.localhost", None),
    (None, None),
])
def test_lookup(header: str | None, route: AppRoute | None) -> None:
    table = RouteTable({"shop.localhost": SHOP, "::1": BLOG, "*.wild.test": WILD, "*.deep.wild.test": SHOP,
                        "exact.wild.test": BLOG})
    assert table.lookup(header) == route


def test_catch_all_only_when_nothing_else_matches() -> None:
    table = RouteTable({"*": WILD, "shop.localhost": SHOP})
    assert table.lookup("shop.localhost") == SHOP
    assert table.lookup("anything.else") == WILD
    assert table.lookup(None) is None  # no Host header is never routed
