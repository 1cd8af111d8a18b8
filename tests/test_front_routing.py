"""The front's pure decisions as tables: which app a Host header reaches, who is next, which headers cross."""

from __future__ import annotations

from collections import Counter

import pytest
from multidict import CIMultiDict

from elasticd.config import parse_config
from elasticd.front.relay import forwarded_request_headers, forwarded_response_headers
from elasticd.front.routing import AppRoute, RoundRobin, RouteTable, normalize_host

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
          blue: {command: [x]}
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
    assert table.lookup("shop.localhost:8080") == SHOP
    assert table.lookup("shop.example.com.") == SHOP
    assert table.lookup("www.blog.localhost") == AppRoute("globex", "blog", "blue")  # first group by default
    assert table.lookup("unknown.localhost") is None
    assert len(table) == 4
    assert set(table.routes()) == {SHOP, AppRoute("globex", "blog", "blue")}


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


def test_round_robin_cycles_fairly_per_key() -> None:
    rr = RoundRobin()
    picks = [rr.pick("a", ["w1", "w2", "w3"]) for _ in range(9)]
    assert picks == ["w1", "w2", "w3"] * 3
    assert [rr.pick("b", ["x", "y"]) for _ in range(3)] == ["x", "y", "x"]  # keys are independent
    assert Counter(rr.pick("c", ["p", "q", "r", "s"]) for _ in range(4000)) == dict.fromkeys("pqrs", 1000)


@pytest.mark.parametrize(("before", "after", "expected"), [
    (["w1", "w2", "w3"], ["w1", "w2"], ["w1", "w2", "w1"]),  # position 2 wraps on the shorter list
    (["w1", "w2"], ["w1", "w2", "w3"], ["w2", "w3", "w1", "w2"]),  # goes on from where it was
    (["w1", "w2", "w3"], ["w9"], ["w9", "w9"]),
])
def test_round_robin_survives_list_changes(before: list[str], after: list[str], expected: list[str]) -> None:
    rr = RoundRobin()
    for _ in range(len(before) - 1):  # leave the position at the last item of the old list
        rr.pick("k", before)
    assert [rr.pick("k", after) for _ in expected] == expected


def test_round_robin_empty_and_retain() -> None:
    rr = RoundRobin()
    with pytest.raises(ValueError):
        rr.pick("k", [])
    rr.pick("gone", ["a", "b"])
    rr.pick("kept", ["a", "b"])
    rr.retain({"kept"})
    assert rr.pick("gone", ["a", "b"]) == "a"  # forgotten: starts over
    assert rr.pick("kept", ["a", "b"]) == "b"


def test_request_headers_drop_hop_by_hop_and_add_forwarded() -> None:
    incoming = CIMultiDict([
        ("Host", "shop.localhost:8080"), ("Connection", "keep-alive, X-Secret"), ("X-Secret", "1"),
        ("Keep-Alive", "timeout=5"), ("TE", "trailers"), ("Transfer-Encoding", "chunked"),
        ("Upgrade", "h2c"), ("Proxy-Authorization", "Basic eA=="), ("Proxy-Connection", "keep-alive"),
        ("Trailer", "X-Sum"), ("Expect", "100-continue"), ("Cookie", "a=1"), ("Cookie", "b=2"),
        ("X-Forwarded-For", "10.0.0.1"), ("Content-Length", "12"),
    ])
    out = forwarded_request_headers(incoming, "127.0.0.1", "http", "shop.localhost:8080")
    assert list(out.items()) == [
        ("Host", "shop.localhost:8080"), ("Cookie", "a=1"), ("Cookie", "b=2"),
        ("X-Forwarded-For", "10.0.0.1, 127.0.0.1"), ("Content-Length", "12"),
        ("X-Forwarded-Proto", "http"), ("X-Forwarded-Host", "shop.localhost:8080"),
    ]


@pytest.mark.parametrize(("incoming", "peer", "expected"), [
    ([], "127.0.0.1", {"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http",
                       "X-Forwarded-Host": "h"}),
    ([], None, {"X-Forwarded-Proto": "http", "X-Forwarded-Host": "h"}),  # a Unix-socket listener has no peer
    ([("X-Forwarded-For", "a"), ("X-Forwarded-For", "b")], "c",
     {"X-Forwarded-For": "a, b, c", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "h"}),
    ([("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "shop.example")], "::1",
     {"X-Forwarded-For": "::1", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "shop.example"}),
])
def test_forwarded_headers(incoming: list[tuple[str, str]], peer: str | None,
                           expected: dict[str, str]) -> None:
    assert dict(forwarded_request_headers(CIMultiDict(incoming), peer, "http", "h")) == expected


def test_response_headers_keep_length_and_repeats() -> None:
    incoming = CIMultiDict([
        ("Content-Length", "5"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Connection", "close, X-Hop"),
        ("X-Hop", "x"), ("Keep-Alive", "timeout=5"), ("Transfer-Encoding", "chunked"),
        ("Proxy-Authenticate", "Basic"), ("Content-Encoding", "gzip"), ("Trailers", "x"),
    ])
    assert list(forwarded_response_headers(incoming).items()) == [
        ("Content-Length", "5"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Content-Encoding", "gzip"),
    ]
