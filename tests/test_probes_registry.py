"""The registry snapshot (probes/registry_snapshot.py, probes/registry_check.py): publishing, signing, and the
reader's checks in their order. Tables; time passed in."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from typing import Any

import pytest

from elasticd.probes.registry_check import (
    BAD_SIGNATURE,
    FUTURE,
    MALFORMED,
    REPLAYED,
    STALE,
    UNREACHABLE,
    Accepted,
    Refused,
    check_snapshot,
)
from elasticd.probes.registry_snapshot import (
    MIN_SECRET,
    SIGNATURE_HEADER,
    VERSION,
    canonical,
    node_load,
    read_secret,
    sign,
    snapshot,
)

SECRET = b"s" * 32
OTHER = b"o" * 32
NOW = 1_000_000.0


def body(**fields: Any) -> bytes:
    """A canonical snapshot body generated at NOW - 1 with a ttl of 10, ``fields`` replacing (None: dropping)."""
    out: dict[str, Any] = {"version": 1, "instance": "host-a", "generated_at": NOW - 1, "ttl": 10.0, "apps": []}
    for key, value in fields.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return canonical(out)


def signed(raw: bytes) -> str:
    return sign(SECRET, raw)


# -- canonical JSON and the signature -------------------------------------------------------------------------


def test_the_constants() -> None:
    assert (SIGNATURE_HEADER, VERSION, MIN_SECRET) == ("X-Elastic-Registry-Signature", 1, 32)


@pytest.mark.parametrize(("value", "raw"), [
    ({"b": 1, "a": 2}, b'{"a":2,"b":1}'),  # keys sorted, no spaces
    ({"a": 2, "b": 1}, b'{"a":2,"b":1}'),  # the same bytes whatever the insertion order
    ({"z": {"y": 1, "x": [3, 1]}}, b'{"z":{"x":[3,1],"y":1}}'),  # nested keys sorted, lists kept in order
    ({"name": "café ✓"}, '{"name":"café ✓"}'.encode()),  # UTF-8, not \\u escapes
    ({"f": 1.5, "n": None, "t": True}, b'{"f":1.5,"n":null,"t":true}'),
    ({}, b"{}"),
])
def test_canonical_is_key_sorted_and_stable(value: dict[str, Any], raw: bytes) -> None:
    assert canonical(value) == raw
    assert canonical(json.loads(canonical(value))) == raw  # read back and written again: the same bytes


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_canonical_refuses_what_is_not_json(bad: float) -> None:
    with pytest.raises(ValueError):
        canonical({"x": bad})


def test_sign_is_hmac_sha256_in_lower_case_hex() -> None:
    payload = b'{"a":1}'
    want = "sha256=" + hmac.new(SECRET, payload, hashlib.sha256).hexdigest()
    assert sign(SECRET, payload) == want
    assert want == want.lower() and len(want) == len("sha256=") + 64
    assert sign(SECRET, payload) != sign(OTHER, payload)
    assert sign(SECRET, payload) != sign(SECRET, payload + b" ")


def test_sign_and_check_round_trip() -> None:
    apps = [{"tenant": "acme", "app": "shop", "groups": []}]
    raw = canonical(snapshot("host-a", NOW - 1, 10.0, apps))
    result = check_snapshot(200, raw, sign(SECRET, raw), SECRET, NOW, None)
    assert result == Accepted(json.loads(raw), NOW - 1, NOW + 9)
    assert isinstance(result, Accepted) and result.snapshot["apps"] == apps
    refused = check_snapshot(200, raw, sign(OTHER, raw), SECRET, NOW, None)
    assert isinstance(refused, Refused) and refused.state == BAD_SIGNATURE


# -- read_secret ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "secret"), [
    (b"k" * 32, b"k" * 32),
    (b"k" * 32 + b"\n", b"k" * 32),  # the newline an editor leaves
    (b"k" * 32 + b"\r\n", b"k" * 32),
    (b"  " + b"k" * 32 + b" \n", b"k" * 32),  # whitespace at both ends
    (b"k" * 64, b"k" * 64),
    (b"k" * 16 + b" " + b"k" * 16, b"k" * 16 + b" " + b"k" * 16),  # inner whitespace is the secret's
])
def test_read_secret(data: bytes, secret: bytes) -> None:
    assert read_secret(data, "/etc/elasticd/registry.secret") == secret


@pytest.mark.parametrize(("data", "length"), [
    (b"k" * 31, 31),
    (b"k" * 31 + b"\n", 31),  # the newline does not make up the difference
    (b"  " + b"k" * 31 + b"  ", 31),
    (b"", 0),
    (b"\n", 0),
])
def test_read_secret_refuses_a_short_secret(data: bytes, length: int) -> None:
    with pytest.raises(ValueError) as refused:
        read_secret(data, "/etc/secret")
    assert str(refused.value) == f"/etc/secret: the registry secret is {length} bytes; at least 32 are needed"


# -- snapshot -------------------------------------------------------------------------------------------------


def worker(wid: str, healthy: Any = True, opened: Any = 0, limit: Any = 8, capacity: Any = None) -> dict[str, Any]:
    return {"id": wid, "healthy": healthy, "open": opened, "limit": limit, "capacity": capacity}


def reading(used: Any, limit: Any) -> dict[str, Any]:
    return {"source": "prometheus", "used": used, "limit": limit, "at": NOW - 2}


def test_snapshot_sorts_apps_groups_and_workers() -> None:
    apps: list[dict[str, Any]] = [
        {"tenant": "zeta", "app": "a", "groups": []},
        {"tenant": "acme", "app": "shop", "groups": [
            {"group": "green", "workers": [worker("acme.shop.green.2"), worker("acme.shop.green.1")]},
            {"group": "blue", "workers": [worker("acme.shop.blue.1", capacity=reading(3, 8))]},
        ]},
        {"tenant": "acme", "app": "blog", "groups": []},
    ]
    before = copy.deepcopy(apps)
    out = snapshot("host-a", NOW, 10.0, apps)
    assert apps == before  # not mutated, not even reordered
    assert out["version"] == 1 and out["instance"] == "host-a"
    assert (out["generated_at"], out["ttl"]) == (NOW, 10.0)
    assert [(a["tenant"], a["app"]) for a in out["apps"]] == [("acme", "blog"), ("acme", "shop"), ("zeta", "a")]
    shop = out["apps"][1]
    assert [g["group"] for g in shop["groups"]] == ["blue", "green"]
    assert [w["id"] for w in shop["groups"][1]["workers"]] == ["acme.shop.green.1", "acme.shop.green.2"]
    assert shop["groups"][0]["workers"][0]["capacity"] == reading(3, 8)
    # a copy all the way down: changing the output changes nothing of the input
    shop["groups"][0]["workers"][0]["capacity"]["used"] = 99
    shop["groups"][0]["workers"].append(worker("x"))
    shop["groups"].clear()
    assert apps == before


def test_snapshot_bytes_do_not_depend_on_the_input_order() -> None:
    one: list[dict[str, Any]] = [{"tenant": "b", "app": "x", "groups": [{"group": "g2", "workers": []},
                                                  {"group": "g1", "workers": [worker("2"), worker("1")]}]},
           {"tenant": "a", "app": "y", "groups": []}]
    two: list[dict[str, Any]] = [{"tenant": "a", "app": "y", "groups": []},
           {"tenant": "b", "app": "x", "groups": [{"group": "g1", "workers": [worker("1"), worker("2")]},
                                                  {"group": "g2", "workers": []}]}]
    assert canonical(snapshot("h", NOW, 5.0, one)) == canonical(snapshot("h", NOW, 5.0, two))


def test_snapshot_takes_entries_without_groups_or_workers() -> None:
    apps: list[dict[str, Any]] = [{"tenant": "a", "app": "x"}, {"tenant": "a", "app": "w", "groups": [{"group": "g"}]}]
    out = snapshot("h", NOW, 5.0, apps)
    assert out["apps"] == [{"tenant": "a", "app": "w", "groups": [{"group": "g"}]}, {"tenant": "a", "app": "x"}]
    assert snapshot("h", NOW, 5.0, [])["apps"] == []


# -- node_load ------------------------------------------------------------------------------------------------


def app_snapshot(*groups: list[Any], tenant: str = "acme", app: str = "shop") -> dict[str, Any]:
    entry = {"tenant": tenant, "app": app,
             "groups": [{"group": f"g{i}", "workers": workers} for i, workers in enumerate(groups)]}
    return snapshot("h", NOW, 10.0, [entry, {"tenant": "other", "app": "shop", "groups": [
        {"group": "g", "workers": [worker("o.1", opened=100, limit=100)]}]}])


@pytest.mark.parametrize(("snap", "load"), [
    # per worker: used = max(open, capacity.used), limit = capacity.limit, else its own limit; summed
    (app_snapshot([worker("1", opened=3, limit=8)]), (3.0, 8.0)),
    (app_snapshot([worker("1", opened=3, limit=8, capacity=reading(5, 10))]), (5.0, 10.0)),
    (app_snapshot([worker("1", opened=6, limit=8, capacity=reading(5, 10))]), (6.0, 10.0)),  # open counts more
    (app_snapshot([worker("1", opened=1, limit=8), worker("2", opened=2, limit=8, capacity=reading(4, 6))],
                  [worker("3", opened=0, limit=4)]), (5.0, 18.0)),  # across groups
    (app_snapshot([worker("1", opened=1.5, limit=2.5)]), (1.5, 2.5)),
    # unhealthy workers are skipped; an app with none healthy says nothing
    (app_snapshot([worker("1", opened=3), worker("2", healthy=False, opened=7)]), (3.0, 8.0)),
    (app_snapshot([worker("1", healthy=False)]), None),
    (app_snapshot([worker("1", healthy="yes")]), None),  # healthy must be true, not truthy
    (app_snapshot([worker("1", healthy=1)]), None),
    (app_snapshot(), None),  # no group
    (app_snapshot([]), None),  # a group with no worker
    (app_snapshot([worker("1")], tenant="acme", app="blog"), None),  # the app is not in it
    # malformed workers are skipped, the others still counted
    (app_snapshot([worker("1", opened=2), worker("2", opened="3")]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", opened=None)]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", opened=True)]), (2.0, 8.0)),  # a bool is not a count
    (app_snapshot([worker("1", opened=2), worker("2", limit="8")]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", opened=-1)]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", opened=float("nan"))]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", limit=float("inf"))]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", opened=10**400)]), (2.0, 8.0)),  # past a float's range
    (app_snapshot([worker("1", opened=2), worker("2", capacity="full")]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", capacity=reading("5", 10))]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", capacity=reading(5, None))]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), worker("2", capacity={})]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), "not a worker", None, 7]), (2.0, 8.0)),
    (app_snapshot([worker("1", opened=2), {"id": "2"}]), (2.0, 8.0)),
    # malformed snapshots: nothing, never an exception
    ({}, None),
    ({"apps": None}, None),
    ({"apps": "acme/shop"}, None),
    ({"apps": [None, 3, "x"]}, None),
    ({"apps": [{"tenant": "acme", "app": "shop"}]}, None),
    ({"apps": [{"tenant": "acme", "app": "shop", "groups": {"g": []}}]}, None),
    ({"apps": [{"tenant": "acme", "app": "shop", "groups": [None, {"group": "g"}, {"workers": "x"}]}]}, None),
    ({"apps": [{"tenant": "acme", "app": "shop", "groups": [{"workers": [worker("1", opened=1)]}]}]}, (1.0, 8.0)),
])
def test_node_load(snap: dict[str, Any], load: tuple[float, float] | None) -> None:
    assert node_load(snap, "acme", "shop") == load


def test_node_load_reads_a_snapshot_as_the_reader_gets_it() -> None:
    snap = app_snapshot([worker("1", opened=3, limit=8, capacity=reading(5, 10))])
    raw = canonical(snap)
    accepted = check_snapshot(200, raw, signed(raw), SECRET, NOW + 1, None)
    assert isinstance(accepted, Accepted)
    assert node_load(accepted.snapshot, "acme", "shop") == (5.0, 10.0)
    assert node_load(accepted.snapshot, "other", "shop") == (100.0, 100.0)


# -- check_snapshot: one row per refusal, and the order they are checked in -----------------------------------

FUTURE_BODY = body(generated_at=NOW + 6)
STALE_BODY = body(generated_at=NOW - 10)  # generated_at + ttl == now: its ttl has run out
NOT_JSON = b"{not json"


@pytest.mark.parametrize(("status", "raw", "signature", "last", "state", "detail"), [
    # (a) unreachable: any answer that is not 2xx, whatever the rest says
    (500, body(), signed(body()), None, UNREACHABLE, "answered 500"),
    (404, NOT_JSON, None, None, UNREACHABLE, "answered 404"),  # not 2xx AND unsigned AND malformed
    (304, body(), signed(body()), None, UNREACHABLE, "answered 304"),
    (199, body(), signed(body()), None, UNREACHABLE, "answered 199"),
    # (b) bad signature: before the body is parsed
    (200, body(), None, None, BAD_SIGNATURE, "no signature header"),
    (200, body(), "", None, BAD_SIGNATURE, "the signature does not match the body"),
    (200, body(), sign(OTHER, body()), None, BAD_SIGNATURE, "the signature does not match the body"),
    (200, body(), signed(body()).upper(), None, BAD_SIGNATURE, "the signature does not match the body"),
    (200, body(), signed(body()).replace("sha256=", "SHA256="), None, BAD_SIGNATURE,
     "the signature does not match the body"),
    (200, body(), signed(body())[len("sha256="):], None, BAD_SIGNATURE, "the signature does not match the body"),
    (200, body(), signed(body()) + " ", None, BAD_SIGNATURE, "the signature does not match the body"),
    (200, body(), "sha256=ü" + signed(body())[8:], None, BAD_SIGNATURE, "the signature does not match the body"),
    (200, body() + b"\n", signed(body()), None, BAD_SIGNATURE, "the signature does not match the body"),  # raw bytes
    (200, NOT_JSON, signed(body()), None, BAD_SIGNATURE, "the signature does not match the body"),  # AND malformed
    (200, NOT_JSON, None, None, BAD_SIGNATURE, "no signature header"),
    (200, STALE_BODY, sign(OTHER, STALE_BODY), None, BAD_SIGNATURE, "the signature does not match the body"),
    # (c) malformed: signed, but not a snapshot
    (200, NOT_JSON, signed(NOT_JSON), None, MALFORMED, "the body is not JSON"),
    (200, b"", signed(b""), None, MALFORMED, "the body is not JSON"),
    (200, b"\xff\xfe{}", signed(b"\xff\xfe{}"), None, MALFORMED, "the body is not UTF-8"),
    (200, b"[1,2]", signed(b"[1,2]"), None, MALFORMED, "the body is a JSON list, not an object"),
    (200, b"null", signed(b"null"), None, MALFORMED, "the body is a JSON NoneType, not an object"),
    (200, b'{"version":1,"generated_at":NaN,"ttl":10}', signed(b'{"version":1,"generated_at":NaN,"ttl":10}'), None,
     MALFORMED, "the body is not JSON"),
    (200, body(version=None), signed(body(version=None)), None, MALFORMED, "version None, expected 1"),
    (200, body(version=2), signed(body(version=2)), None, MALFORMED, "version 2, expected 1"),
    (200, body(version=True), signed(body(version=True)), None, MALFORMED, "version True, expected 1"),
    (200, body(version="1"), signed(body(version="1")), None, MALFORMED, "version '1', expected 1"),
    (200, body(generated_at=None), signed(body(generated_at=None)), None, MALFORMED, "generated_at missing"),
    (200, body(generated_at="now"), signed(body(generated_at="now")), None, MALFORMED,
     "generated_at 'now', not a finite number"),
    (200, body(generated_at=True), signed(body(generated_at=True)), None, MALFORMED,
     "generated_at True, not a finite number"),
    (200, b'{"version":1,"generated_at":1e999,"ttl":10}', signed(b'{"version":1,"generated_at":1e999,"ttl":10}'),
     None, MALFORMED, "generated_at inf, not a finite number"),
    (200, body(ttl=None), signed(body(ttl=None)), None, MALFORMED, "ttl missing"),
    (200, body(ttl=0), signed(body(ttl=0)), None, MALFORMED, "ttl 0, not a positive number"),
    (200, body(ttl=-5), signed(body(ttl=-5)), None, MALFORMED, "ttl -5, not a positive number"),
    (200, body(ttl="10"), signed(body(ttl="10")), None, MALFORMED, "ttl '10', not a positive number"),
    (200, body(ttl=False), signed(body(ttl=False)), None, MALFORMED, "ttl False, not a positive number"),
    (200, body(generated_at=NOW + 60, ttl=0), signed(body(generated_at=NOW + 60, ttl=0)), None, MALFORMED,
     "ttl 0, not a positive number"),  # malformed AND from the future
    # (d) from the future: beyond max_skew (5 s) ahead of the reader's clock
    (200, FUTURE_BODY, signed(FUTURE_BODY), None, FUTURE, "generated 6.0s in the future, max skew 5s"),
    (200, FUTURE_BODY, signed(FUTURE_BODY), NOW + 100, FUTURE,
     "generated 6.0s in the future, max skew 5s"),  # from the future AND replayed
    # (e) stale: generated_at + ttl <= now
    (200, STALE_BODY, signed(STALE_BODY), None, STALE, "generated 10.0s ago, ttl 10s"),
    (200, body(generated_at=NOW - 12), signed(body(generated_at=NOW - 12)), None, STALE,
     "generated 12.0s ago, ttl 10s"),
    (200, STALE_BODY, signed(STALE_BODY), NOW, STALE, "generated 10.0s ago, ttl 10s"),  # stale AND replayed
    # (f) replayed: older than the last accepted
    (200, body(), signed(body()), NOW - 0.5, REPLAYED, "generated 0.5s before the last snapshot accepted"),
    (200, body(generated_at=NOW - 5), signed(body(generated_at=NOW - 5)), NOW - 1, REPLAYED,
     "generated 4.0s before the last snapshot accepted"),
])
def test_check_snapshot_refuses(status: int, raw: bytes, signature: str | None, last: float | None, state: str,
                                detail: str) -> None:
    assert check_snapshot(status, raw, signature, SECRET, NOW, last) == Refused(state, detail)


@pytest.mark.parametrize(("status", "generated_at", "ttl", "last", "max_skew"), [
    (200, NOW - 1, 10.0, None, 5.0),
    (204, NOW - 1, 10.0, None, 5.0),  # any 2xx
    (299, NOW - 1, 10.0, None, 5.0),
    (200, NOW - 1, 10.0, NOW - 1, 5.0),  # the same generated_at as the last accepted: the same snapshot again
    (200, NOW - 1, 10.0, NOW - 3, 5.0),  # newer than the last accepted
    (200, NOW + 5, 10.0, None, 5.0),  # ahead by exactly max_skew
    (200, NOW + 3, 10.0, None, 5.0),  # within max_skew
    (200, NOW + 8, 10.0, None, 10.0),  # a wider max_skew
    (200, NOW, 10.0, None, 0.0),  # no skew allowed, none there
    (200, NOW - 9.999, 10.0, None, 5.0),  # just inside its ttl
    (200, NOW - 0.25, 0.5, None, 5.0),  # a fractional ttl not run out yet
    (200, 999_999, 10, None, 5.0),  # integers
])
def test_check_snapshot_accepts(status: int, generated_at: float, ttl: float, last: float | None,
                                max_skew: float) -> None:
    raw = body(generated_at=generated_at, ttl=ttl)
    result = check_snapshot(status, raw, signed(raw), SECRET, NOW, last, max_skew=max_skew)
    assert result == Accepted(json.loads(raw), float(generated_at), generated_at + ttl)
    assert isinstance(result.generated_at, float) and isinstance(result.expires_at, float)


def test_max_skew_decides_from_the_future() -> None:
    raw = body(generated_at=NOW + 8)
    assert check_snapshot(200, raw, signed(raw), SECRET, NOW, None) == Refused(
        FUTURE, "generated 8.0s in the future, max skew 5s")
    assert isinstance(check_snapshot(200, raw, signed(raw), SECRET, NOW, None, max_skew=8.0), Accepted)


def test_a_body_signed_in_another_form_is_not_the_same_body() -> None:
    # the signature is over the bytes as received: the same object written with spaces is another body
    pretty = json.dumps(json.loads(body()), indent=1).encode()
    assert check_snapshot(200, pretty, signed(body()), SECRET, NOW, None) == Refused(
        BAD_SIGNATURE, "the signature does not match the body")
    assert isinstance(check_snapshot(200, pretty, signed(pretty), SECRET, NOW, None), Accepted)


def test_refusals_and_acceptances_are_frozen() -> None:
    refused = Refused(STALE, "x")
    with pytest.raises(AttributeError):
        refused.state = MALFORMED  # type: ignore[misc]
    accepted = Accepted({}, 1.0, 2.0)
    with pytest.raises(AttributeError):
        accepted.expires_at = 3.0  # type: ignore[misc]
    assert not hasattr(refused, "__dict__") and not hasattr(accepted, "__dict__")
