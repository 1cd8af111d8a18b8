"""The HTTP/1.1 rules of the proxy as tables (http1: pure), and the accounting and its metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from elasticd.front.core import http1
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.http1 import CHUNK, EOF, LENGTH, NONE, read_request, read_response, upstream_head
from elasticd.front.request_metrics import FrontCollector

USER = b"0123456789abcdef0123456789abcdef"


def test_request_drops_hop_by_hop_and_our_own_headers() -> None:
    incoming = [
        (b"Host", b"shop.localhost:8080"), (b"Connection", b"keep-alive, X-Secret"), (b"X-Secret", b"1"),
        (b"Keep-Alive", b"timeout=5"), (b"TE", b"trailers"), (b"Upgrade", b"h2c"),
        (b"Proxy-Authorization", b"Basic eA=="), (b"Proxy-Connection", b"keep-alive"), (b"Trailer", b"X-Sum"),
        (b"Expect", b"100-continue"), (b"Cookie", b"a=1"), (b"Cookie", b"b=2"), (b"X-Forwarded-For", b"10.0.0.1"),
        (b"Content-Length", b"12"), (b"X-Elastic-User-Id", b"forged"), (b"x-elastic-user-id", b"forged too"),
    ]
    head = read_request(incoming, http11=True, upgrade=False)
    sent = b"".join(upstream_head(b"POST", b"/a?b=%20c", head, b"127.0.0.1", USER))
    assert sent == (
        b"POST /a?b=%20c HTTP/1.1\r\nHost: shop.localhost:8080\r\nCookie: a=1\r\nCookie: b=2\r\n"
        b"Content-Length: 12\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\n"
        b"X-Forwarded-Host: shop.localhost:8080\r\nX-Elastic-User-Id: " + USER + b"\r\n\r\n")
    assert (head.expect, head.keep_alive, head.cookie, head.has_body) == (True, True, b"a=1; b=2", True)


@pytest.mark.parametrize(("incoming", "peer", "expected"), [
    ([], b"127.0.0.1", b"X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\n"),
    ([], None, b"X-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\n"),  # no peer (a Unix-socket listener)
    ([(b"X-Forwarded-For", b"a"), (b"X-Forwarded-For", b"b")], b"c",
     b"X-Forwarded-For: a, b, c\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\n"),
    ([(b"X-Forwarded-Proto", b"https"), (b"X-Forwarded-Host", b"shop.example")], b"::1",
     b"X-Forwarded-Proto: https\r\nX-Forwarded-Host: shop.example\r\nX-Forwarded-For: ::1\r\n"),
])
def test_forwarded_headers_from_a_trusted_proxy(incoming: list[tuple[bytes, bytes]], peer: bytes | None,
                                                expected: bytes) -> None:
    head = read_request([(b"Host", b"h"), *incoming], http11=True, upgrade=False, trusted=True)
    sent = b"".join(upstream_head(b"GET", b"/", head, peer, USER))
    assert sent == b"GET / HTTP/1.1\r\nHost: h\r\n" + expected + b"X-Elastic-User-Id: " + USER + b"\r\n\r\n"


SAID_BY_A_CLIENT = [(b"X-Forwarded-For", b"6.6.6.6"), (b"x-forwarded-proto", b"https"), (b"X-Forwarded-Host", b"evil"),
                    (b"X-Forwarded-Port", b"443"), (b"X-Forwarded-Prefix", b"/admin"), (b"Forwarded", b"for=6.6.6.6"),
                    (b"X-Real-IP", b"6.6.6.6")]


@pytest.mark.parametrize(("trusted", "expected"), [
    # anyone else: every claim dropped, the front's own said
    (False, b"X-Forwarded-For: 10.1.2.3\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: h\r\n"),
    # a trusted proxy: passed on as it said them, its address added to the chain
    (True, b"X-Forwarded-Proto: https\r\nX-Forwarded-Host: evil\r\nX-Forwarded-Port: 443\r\n"
           b"X-Forwarded-Prefix: /admin\r\nForwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\n"
           b"X-Forwarded-For: 6.6.6.6, 10.1.2.3\r\n"),
])
def test_what_a_peer_says_of_where_a_request_came_from_passes_only_from_a_trusted_one(trusted: bool,
                                                                                      expected: bytes) -> None:
    head = read_request([(b"Host", b"h"), *SAID_BY_A_CLIENT], http11=True, upgrade=False, trusted=trusted)
    sent = b"".join(upstream_head(b"GET", b"/", head, b"10.1.2.3", USER))
    assert sent.replace(b"x-forwarded-proto", b"X-Forwarded-Proto") == (
        b"GET / HTTP/1.1\r\nHost: h\r\n" + expected + b"X-Elastic-User-Id: " + USER + b"\r\n\r\n")
    assert head.secure is trusted


@pytest.mark.parametrize(("keep", "passed"), [(False, [b"X-Plain"]), (True, [b"X_Plain", b"X-Plain"])])
def test_underscored_names_are_dropped_unless_kept(keep: bool, passed: list[bytes]) -> None:
    """CGI-style readers (HTTP_TRANSFER_ENCODING) see "Transfer_Encoding" as the real one: nginx's default too. Kept,
    a name that reads as one the front frames by or says itself is still dropped."""
    head = read_request([(b"Transfer_Encoding", b"chunked"), (b"Content_Length", b"5"), (b"X_Plain", b"2"),
                         (b"X-Plain", b"1"), (b"x_forwarded_for", b"6.6.6.6"), (b"X_Elastic_User_Id", b"forged"),
                         (b"Forwarded", b"for=x"), (b"X_Forwarded_Proto", b"https")], True, False,
                        keep_underscored=keep)
    assert head.lines[::4] == passed
    assert head.chunked is None and head.length is None and head.forwarded_for is None


@pytest.mark.parametrize(("headers", "http11", "keep_alive"), [
    ([], True, True),
    ([(b"Connection", b"close")], True, False),
    ([(b"Connection", b"Keep-Alive, close")], True, False),
    ([], False, False),
    ([(b"Connection", b"keep-alive")], False, True),
    ([(b"Connection", b"x"), (b"Connection", b"Keep-Alive")], False, True),
])
def test_request_keep_alive(headers: list[tuple[bytes, bytes]], http11: bool, keep_alive: bool) -> None:
    assert read_request(headers, http11, upgrade=False).keep_alive is keep_alive


@pytest.mark.parametrize(("headers", "upgrade", "expected"), [
    # a real upgrade request: Upgrade and Connection: upgrade are sent on
    ([(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade")], True,
     b"Connection: upgrade\r\nUpgrade: websocket\r\n"),
    # Upgrade without Connection: upgrade is just a hop-by-hop header
    ([(b"Upgrade", b"websocket")], False, b""),
    # chunked bodies stay chunked (re-framed by us), other codings said as they were
    ([(b"Transfer-Encoding", b"chunked")], False, b"Transfer-Encoding: chunked\r\n"),
    ([(b"Transfer-Encoding", b"gzip, chunked")], False, b"Transfer-Encoding: gzip, chunked\r\n"),
    # on two lines, one list (RFC 9110 §5.3): the gzip coding is not lost
    ([(b"Transfer-Encoding", b"gzip"), (b"Transfer-Encoding", b"chunked")], False,
     b"Transfer-Encoding: gzip, chunked\r\n"),
])
def test_upgrade_and_chunked_requests(headers: list[tuple[bytes, bytes]], upgrade: bool, expected: bytes) -> None:
    head = read_request([(b"Host", b"h"), (b"X-Forwarded-Proto", b"http"), (b"X-Forwarded-Host", b"h"), *headers],
                        http11=True, upgrade=upgrade, trusted=True)
    sent = b"".join(upstream_head(b"GET", b"/", head, None, USER))
    assert sent.endswith(b"X-Elastic-User-Id: " + USER + b"\r\n" + expected + b"\r\n")


@pytest.mark.parametrize(("proto", "secure"), [
    (None, False), (b"http", False), (b"https", True), (b"HTTPS", True), (b"https, http", True),
    (b"http, https", False),
])
def test_secure_per_forwarded_proto(proto: bytes | None, secure: bool) -> None:
    headers = [(b"X-Forwarded-Proto", proto)] if proto is not None else []
    assert read_request(headers, True, False, trusted=True).secure is secure
    assert read_request(headers, True, False).secure is False  # a client's own word is not taken


def test_connection_naming_the_cookie_drops_it() -> None:
    head = read_request([(b"Cookie", b"elastic_uid=x"), (b"Connection", b"cookie")], True, False)
    assert head.cookie is None and head.lines == []


RESPONSE = [(b"Content-Type", b"text/plain"), (b"Content-Length", b"5"), (b"Set-Cookie", b"a=1"),
            (b"Set-Cookie", b"b=2")]


@pytest.mark.parametrize(("status", "headers", "options", "framing", "close", "reusable", "tail"), [
    # plain answers keep their length and repeated headers
    (200, RESPONSE, {}, LENGTH, False, True, b""),
    # hop-by-hop dropped, also what Connection names; X-Elastic-Login stripped (and read)
    (200, [*RESPONSE, (b"Connection", b"close, X-Hop"), (b"X-Hop", b"x"), (b"Keep-Alive", b"timeout=5"),
           (b"Proxy-Authenticate", b"Basic"), (b"Trailer", b"x"), (b"X-Elastic-Login", b" alice ")],
     {}, LENGTH, False, False, b""),
    # a chunked answer is re-chunked for HTTP/1.1, delimited by closing for HTTP/1.0
    (200, [(b"Transfer-Encoding", b"chunked")], {}, CHUNK, False, True, b"Transfer-Encoding: chunked\r\n"),
    (200, [(b"Transfer-Encoding", b"chunked")], {"client11": False, "client_keep_alive": True}, EOF, True, True,
     b"Connection: close\r\n"),
    # an answer the worker ends by closing: chunked toward the client, and the worker's connection not reused
    (200, [], {}, CHUNK, False, False, b"Transfer-Encoding: chunked\r\n"),
    # bodiless answers: nothing added, the length kept as said
    (204, [], {}, NONE, False, True, b""),
    (304, [(b"Content-Length", b"5")], {}, NONE, False, True, b""),
    (200, RESPONSE, {"head_request": True}, NONE, False, True, b""),
    # the client said close, or is HTTP/1.0 with keep-alive
    (200, RESPONSE, {"client_keep_alive": False}, LENGTH, True, True, b"Connection: close\r\n"),
    (200, RESPONSE, {"client11": False, "client_keep_alive": True}, LENGTH, False, True,
     b"Connection: keep-alive\r\n"),
    # a new user's cookie
    (200, RESPONSE, {"extra": b"Set-Cookie: elastic_uid=x\r\n"}, LENGTH, False, True,
     b"Set-Cookie: elastic_uid=x\r\n"),
])
def test_response_heads(status: int, headers: list[tuple[bytes, bytes]], options: dict, framing: int, close: bool,
                        reusable: bool, tail: bytes) -> None:
    settings = {"head_request": False, "client11": True, "client_keep_alive": True, **options}
    answer = read_response(status, None, headers, True, **settings)
    assert (answer.framing, answer.close, answer.reusable) == (framing, close, reusable)
    kept = b"".join(b"%s: %s\r\n" % (n, v) for n, v in headers
                    if n.lower() in (b"content-type", b"content-length", b"set-cookie"))
    assert answer.head == http1.status_line(status, None) + kept + tail + b"\r\n"


@pytest.mark.parametrize(("value", "login"), [(b"alice", b"alice"), (b"  bob ", b"bob"), (b"-", b"-")])
def test_login_header_is_read_and_stripped(value: bytes, login: bytes) -> None:
    answer = read_response(200, b"OK", [(b"X-Elastic-Login", value), (b"Content-Length", b"0")], True,
                           head_request=False, client11=True, client_keep_alive=True)
    assert answer.login == login
    assert b"elastic-login" not in answer.head.lower()
    assert read_response(200, b"OK", [], True, head_request=True, client11=True, client_keep_alive=True).login is None


def test_switching_protocols_crosses_whole() -> None:
    answer = read_response(101, b"Switching Protocols",
                           [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"),
                            (b"Sec-WebSocket-Accept", b"abc")], True, head_request=False, client11=True,
                           client_keep_alive=True)
    assert answer.head == (b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: abc\r\n"
                           b"Connection: upgrade\r\nUpgrade: websocket\r\n\r\n")
    assert (answer.framing, answer.reusable, answer.upstream_eof) == (EOF, False, True)


@pytest.mark.parametrize(("upstream11", "headers", "reusable"), [
    (True, [(b"Content-Length", b"0")], True),
    (True, [(b"Content-Length", b"0"), (b"Connection", b"close")], False),
    (False, [(b"Content-Length", b"0")], False),
    (False, [(b"Content-Length", b"0"), (b"Connection", b"keep-alive")], True),
])
def test_worker_connection_reuse(upstream11: bool, headers: list[tuple[bytes, bytes]], reusable: bool) -> None:
    answer = read_response(200, b"OK", headers, upstream11, head_request=False, client11=True,
                           client_keep_alive=True)
    assert answer.reusable is reusable


@pytest.mark.parametrize(("status", "kwargs", "expected"), [
    (404, {}, b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 5\r\n\r\nnope\n"),
    (429, {"retry_after": 1}, b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\n"
                              b"Content-Length: 5\r\nRetry-After: 1\r\n\r\nnope\n"),
    (431, {"close": True}, b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; "
                           b"charset=utf-8\r\nContent-Length: 5\r\nConnection: close\r\n\r\nnope\n"),
    (503, {"head_request": True, "retry_after": 2},
     b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 5\r\n"
     b"Retry-After: 2\r\n\r\n"),
])
def test_own_answers(status: int, kwargs: dict, expected: bytes) -> None:
    assert http1.plain(status, "nope", **kwargs) == expected


def test_chunk_and_status_lines() -> None:
    assert b"".join(http1.chunk(b"x" * 26)) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    assert http1.status_line(200, b"Fine") == b"HTTP/1.1 200 Fine\r\n"
    assert http1.status_line(200, None) == b"HTTP/1.1 200 OK\r\n"
    assert http1.status_line(599, b"") == b"HTTP/1.1 599 Unknown\r\n"


# ------------------------------------------------------------------------------------------ accounting


class Req:
    __slots__ = ("live", "started", "ts", "user", "worker")

    def __init__(self, user: str | None, worker: str | None, ts: float) -> None:
        self.user, self.worker, self.ts = user, worker, ts
        self.live = self.started = False


def test_forward_accounting() -> None:
    acct = ForwardCounters()
    w1, w2 = acct.worker("w1"), acct.worker("w2")
    shop = acct.route("acme", "shop")
    a, b, c = Req("alice", "w1", 1.0), Req("bob", "w2", 2.0), Req("alice", "w1", 3.0)
    ra, rb, rc = acct.opened(a), acct.opened(b), acct.opened(c)
    assert len({ra, rb, rc}) == 3
    assert acct.open_of("alice") == [a, c] and acct.open_by_worker() == {"w1": 2, "w2": 1}
    acct.closed(ra, 200, 0.004, w1, shop)
    acct.closed(rb, 502, 0.3, w2, shop)
    assert acct.open_of("alice") == [c]
    acct.closed(acct.opened(Req("alice", "w1", 4.0)), 200, 0.004, w1, shop)
    assert (w1.requests, w1.errors, w1.seconds) == (2, 0, pytest.approx(0.008))
    assert (w2.requests, w2.errors, w2.seconds) == (1, 1, pytest.approx(0.3))
    assert shop.codes == {200: 2, 502: 1} and shop.count == 3 and shop.sum == pytest.approx(0.308)
    assert shop.buckets[0] == 2 and shop.buckets[7] == 1  # ≤ 5 ms twice, 0.3 s in the ≤ 0.5 s bucket
    acct.refused("acme", "rate")
    acct.refused("acme", "rate")
    assert acct.rejections == {("acme", "rate"): 2}
    assert acct.sweep(horizon=2.5) == []  # c (ts 3.0) is younger
    assert acct.sweep(horizon=10.0) == [c] and acct.open == {}


def test_collector_exposes_the_three_families() -> None:
    acct = ForwardCounters()
    shop = acct.route("acme", "shop")
    counters = acct.worker("w1")
    for seconds in (0.001, 0.02, 3.0):
        acct.closed(acct.opened(Req(None, "w1", 0.0)), 200, seconds, counters, shop)
    shop.answered(429)
    acct.refused("acme", "rate")
    registry = CollectorRegistry()
    registry.register(FrontCollector(acct, lambda: ["acme", "globex"]))
    text = generate_latest(registry).decode()
    for line in (
        'elasticd_requests_total{app="shop",code="200",tenant="acme"} 3.0',
        'elasticd_requests_total{app="shop",code="429",tenant="acme"} 1.0',
        'elasticd_request_duration_seconds_bucket{app="shop",le="0.005",tenant="acme"} 1.0',
        'elasticd_request_duration_seconds_bucket{app="shop",le="0.025",tenant="acme"} 2.0',
        'elasticd_request_duration_seconds_bucket{app="shop",le="2.5",tenant="acme"} 2.0',
        'elasticd_request_duration_seconds_bucket{app="shop",le="+Inf",tenant="acme"} 3.0',
        'elasticd_request_duration_seconds_count{app="shop",tenant="acme"} 3.0',
        'elasticd_quota_rejections_total{reason="rate",tenant="acme"} 1.0',
        'elasticd_quota_rejections_total{reason="concurrency",tenant="acme"} 0.0',
        'elasticd_quota_rejections_total{reason="concurrency",tenant="globex"} 0.0',
    ):
        assert line in text, line
    assert "# TYPE elasticd_request_duration_seconds histogram" in text
    assert "# TYPE elasticd_requests_total counter" in text


def test_the_sweep_spares_live_requests_and_the_oldest_open_is_per_worker() -> None:
    class Live:
        def __init__(self, user, worker, ts, live, started=False):
            self.user, self.worker, self.ts, self.live, self.started = user, worker, ts, live, started

    acct = ForwardCounters()
    streaming = Live("a", "w1", 1.0, True, started=True)  # a long download still relaying: live however old
    lost = Live("b", "w1", 2.0, False)  # a bug left it: swept by its timestamp
    young = Live("c", "w2", 50.0, False)
    ids = [acct.opened(r) for r in (streaming, lost, young)]
    # The download's answer has started: it is no evidence of silence; the oldest waiting one is b's.
    assert acct.oldest_open_by_worker() == {"w1": 2.0, "w2": 50.0}
    assert acct.sweep(horizon=10.0) == [lost] and list(acct.open) == [ids[0], ids[2]]
    assert set(acct.open) == {ids[0], ids[2]}
    acct.worker("gone").requests = 3
    acct.forget_worker("gone")
    assert "gone" not in acct.workers  # a retired worker's forward counters end with it


def test_the_front_sweeps_past_the_request_timeout_not_hours() -> None:
    from elasticd.config.model import Address
    from elasticd.front import Front, RouteTable
    from elasticd.front.server import STALE_MARGIN

    front = Front(Address("127.0.0.1", 0), RouteTable([]), lambda t, a, g: [], request_timeout=60.0)
    assert front.stale_after == 60.0 + STALE_MARGIN
    front.configure(request_timeout=5.0, user_ttl=60.0)
    assert front.stale_after == 5.0 + STALE_MARGIN


# ------------------------------------------------------------------ what RFC 9112 refuses (the head, pure)

def _head(*headers: tuple[bytes, bytes], http11: bool = True) -> http1.RequestHead:
    return http1.read_request(list(headers), http11, False)


@pytest.mark.parametrize(("headers", "method", "url", "http11", "version", "expected"), [
    ([(b"Host", b"a.test")], b"GET", b"/x", True, None, (0, b"/x", b"a.test")),
    ([], b"GET", b"/x", True, None, (400, b"/x", None)),  # HTTP/1.1 without Host
    ([(b"Host", b"a.test"), (b"Host", b"b.test")], b"GET", b"/", True, None, (400, b"/", None)),  # two Hosts
    ([], b"GET", b"/x", False, "1.0", (0, b"/x", None)),  # 1.0 may omit it (routed to the catch-all or 404)
    ([], b"GET", b"/", False, "0.9", (400, b"/", None)),  # HTTP/0.9's bare request line
    ([(b"Host", b"a.test")], b"GET", b"/", False, "2.0", (400, b"/", b"a.test")),
    ([(b"Host", b"a.test")], b"GET", b"/", True, "1.2", (400, b"/", b"a.test")),  # what http-parser calls 1.x
    ([(b"Host", b"a.test")], b"GET", b"/", True, "1.1", (0, b"/", b"a.test")),
    # absolute-form: the target's authority wins over Host, and the worker gets the origin form
    ([(b"Host", b"a.test")], b"GET", b"http://b.test/x?y=1", True, None, (0, b"/x?y=1", b"b.test")),
    ([(b"Host", b"a.test")], b"GET", b"HTTPS://b.test:8443", True, None, (0, b"/", b"b.test:8443")),
    ([], b"GET", b"http://b.test?q", True, None, (0, b"/?q", b"b.test")),  # no Host: the authority is the host
    ([(b"Host", b"a.test")], b"GET", b"http://u:p@b.test/", True, None, (400, b"http://u:p@b.test/", b"a.test")),
    ([(b"Host", b"a.test")], b"GET", b"http:///x", True, None, (400, b"http:///x", b"a.test")),
    ([(b"Host", b"a.test")], b"GET", b"ftp://b.test/", True, None, (400, b"ftp://b.test/", b"a.test")),
    ([(b"Host", b"a.test")], b"GET", b"a.test:443", True, None, (400, b"a.test:443", b"a.test")),
    ([(b"Host", b"a.test")], b"CONNECT", b"a.test:443", True, None, (501, b"a.test:443", b"a.test")),
    ([(b"Host", b"a.test")], b"OPTIONS", b"*", True, None, (0, b"*", b"a.test")),  # OPTIONS *
    ([(b"Host", b"a.test")], b"GET", b"*", True, None, (400, b"*", b"a.test")),
    # Transfer-Encoding: in HTTP/1.0 the framing is faulty (RFC 9112 §6.1); chunked must be the last coding (§6.3)
    ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"chunked")], b"POST", b"/", False, "1.0", (400, b"/", b"a.test")),
    ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"chunked")], b"POST", b"/", True, None, (0, b"/", b"a.test")),
    ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"gzip"), (b"Transfer-Encoding", b"chunked")], b"POST", b"/", True,
     None, (0, b"/", b"a.test")),
    ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"chunked, gzip")], b"POST", b"/", True, None,
     (400, b"/", b"a.test")),
    ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"gzip")], b"POST", b"/", True, None, (400, b"/", b"a.test")),
])
def test_head_refusal(headers, method, url, http11, version, expected):
    head = _head(*headers, http11=http11)
    status, why, target = http1.head_refusal(head, method, url, http11, version)
    assert (status, target, head.host) == expected
    assert bool(why) == bool(status)


def test_an_absolute_form_target_replaces_every_host_line_the_worker_would_see():
    head = _head((b"Host", b"a.test"), (b"X-Other", b"1"))
    assert http1.head_refusal(head, b"GET", b"http://b.test/p", True, None)[0] == 0
    sent = b"".join(http1.upstream_head(b"GET", b"/p", head, b"127.0.0.1", b"u"))
    assert b"Host: b.test\r\n" in sent and b"a.test" not in sent.replace(b"X-Forwarded-Host: b.test", b"")
    assert b"X-Forwarded-Host: b.test\r\n" in sent


@pytest.mark.parametrize(("url_bytes", "header_bytes", "expected"), [
    (70_000, 0, 414), (70_000, 20, 414), (40_000, 30_000, 414), (10, 0, 431),  # a first big header still arriving
    (10, 70_000, 431), (0, 70_000, 431), (0, 0, 431)])
def test_oversize_status(url_bytes, header_bytes, expected):
    assert http1.oversize_status(url_bytes, header_bytes, 65_536)[0] == expected


@pytest.mark.parametrize(("seconds", "expected"), [
    (0.0, 0), (0.004, 0), (0.005, 0),  # a bound is its own bucket's (le: less than or equal)
    (0.0051, 1), (0.3, 7), (1.0, 9), (10.0, 13), (10.01, 14), (1e9, 14),  # over the last bound: +Inf
])
def test_a_latency_falls_in_the_first_bucket_whose_bound_it_does_not_exceed(seconds: float, expected: int) -> None:
    from bisect import bisect_left

    from elasticd.front.core.counters import BOUNDS, bucket
    assert bucket(seconds) == expected == bisect_left(BOUNDS, seconds)



def test_the_decisions_kept_for_unlisted_names_are_bounded_and_right_past_the_bound() -> None:
    """A client's own field names are decided once and kept in the table (the next request's are one lookup); a
    hostile client's random names stop being kept at the bound, and are still decided."""
    from elasticd.front.core import request_head

    for i in range(request_head._DECIDED + 500):
        read_request([(b"X-Random-%d" % i, b"1")], True, False)
    assert len(request_head._REQUEST_KINDS) <= request_head._DECIDED
    late = read_request([(b"X-Forwarded-Late", b"1"), (b"X-Late-Plain", b"2"), (b"X-Late ", b"3")], True, False)
    assert late.lines == [b"X-Late-Plain", b": ", b"2", b"\r\n"] and late.malformed is not None


def test_a_long_field_name_is_decided_each_time_and_never_kept() -> None:
    """Only names of up to _KEPT_NAME bytes are kept: a client's 4,096 names of a head's size each would otherwise
    stay in the front's memory for its life."""
    from elasticd.front.core import request_head

    long_name = b"X-Long-" + b"a" * request_head._KEPT_NAME
    for _ in range(2):
        head = read_request([(long_name, b"1")], True, False)
        assert head.lines == [long_name, b": ", b"1", b"\r\n"]
    assert long_name.lower() not in request_head._REQUEST_KINDS
    forwarded = b"X-Forwarded-" + b"b" * request_head._KEPT_NAME  # decided as what it is all the same
    assert read_request([(forwarded, b"1")], False, False).lines == []


def test_the_answers_field_kinds_are_kept_by_spelling_bounded_and_right_past_the_bound() -> None:
    """A worker's header names are decided once per spelling (no lowering per header of every answer); a hostile
    worker's random or long names stop being kept at the bounds, and are still decided."""
    from elasticd.front.core import response_head

    def framing(headers: list[tuple[bytes, bytes]]) -> int:
        return read_response(200, None, headers, True, head_request=False, client11=True,
                             client_keep_alive=True).framing

    for spelling in (b"Content-Length", b"CONTENT-LENGTH", b"content-length", b"cOnTeNt-LeNgTh"):
        assert framing([(spelling, b"3")]) == LENGTH
        assert framing([(spelling, b"3")]) == LENGTH  # (the second time from the kept spelling)
    long_name = b"X-Long-" + b"a" * response_head._KEPT_NAME
    assert long_name + b": 1\r\n" in read_response(200, None, [(long_name, b"1")], True, head_request=False,
                                                   client11=True, client_keep_alive=True).head
    assert long_name not in response_head._KINDS_AS_SENT
    for i in range(response_head._SPELLINGS + 100):
        read_response(200, None, [(b"X-Random-%d" % i, b"1")], True, head_request=False, client11=True,
                      client_keep_alive=True)
    assert len(response_head._KINDS_AS_SENT) <= response_head._SPELLINGS
    assert framing([(b"TRANSFER-encoding", b"chunked")]) == CHUNK  # decided past the bound
    answer = read_response(200, None, [(b"CONNECTION", b"close"), (b"Keep-ALIVE", b"5"), (b"Content-Length", b"0")],
                           True, head_request=False, client11=True, client_keep_alive=True)
    assert answer.reusable is False and b"keep-alive" not in answer.head.lower()
