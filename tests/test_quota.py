"""Request quotas as tables: the token bucket, the concurrency gate, a tenant's admission and a reload."""

from __future__ import annotations

import pytest

from elasticd.config.model import Quotas
from elasticd.front.core.quota import (
    ConcurrencyGate,
    QuotaBook,
    QuotaRefusal,
    TenantQuota,
    TokenBucket,
    retry_after,
)


@pytest.mark.parametrize(("wait", "seconds"), [
    (0.0, 1), (1e-9, 1), (0.2, 1), (0.999, 1), (1.0, 1), (1.0000001, 2), (1.5, 2), (2.0, 2), (2.0000000001, 2),
    (9.2, 10),
])
def test_retry_after_is_whole_seconds_rounded_up_never_zero(wait: float, seconds: int) -> None:
    assert retry_after(wait) == seconds


# (rate, burst, [(time, expected result of take)]): 0.0 = a token was taken, else seconds until one is due
BUCKET_CASES = {
    "a full burst, then empty": (5.0, 5, [(0.0, 0.0)] * 5 + [(0.0, 0.2), (0.0, 0.2)]),
    "refill of one token at 1/rate": (5.0, 5, [(0.0, 0.0)] * 5 + [(0.1, 0.1), (0.2, 0.0), (0.2, 0.2)]),
    "refill never exceeds burst": (10.0, 2, [(0.0, 0.0), (0.0, 0.0), (100.0, 0.0), (100.0, 0.0), (100.0, 0.1)]),
    "slow rate: the wait is long": (0.5, 1, [(0.0, 0.0), (0.0, 2.0), (1.0, 1.0), (2.0, 0.0)]),
    "a refused take costs nothing": (1.0, 1, [(0.0, 0.0), (0.5, 0.5), (0.5, 0.5), (1.0, 0.0)]),
    "a clock stepping back refills nothing": (1.0, 1, [(10.0, 0.0), (5.0, 1.0), (10.5, 0.5), (11.0, 0.0)]),
    "fractional rate and tokens": (2.5, 3, [(0.0, 0.0)] * 3 + [(0.0, 0.4), (0.2, 0.2), (0.4, 0.0)]),
}


@pytest.mark.parametrize("case", BUCKET_CASES)
def test_token_bucket(case: str) -> None:
    rate, burst, steps = BUCKET_CASES[case]
    bucket = TokenBucket(rate, burst, now=0.0)
    assert [pytest.approx(bucket.take(now), abs=1e-9) for now, _ in steps] == [want for _, want in steps]


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_token_bucket_refuses_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst, 0.0)


# (old rate, old burst, takes at t=0, new rate, new burst, reconfigured at, [(time, take result)])
RECONFIGURE_CASES = {
    "a bigger burst is earned, not handed out": (1.0, 2, 2, 1.0, 10, 0.0, [(0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]),
    "a smaller burst clamps what was held": (1.0, 10, 0, 1.0, 2, 0.0, [(0.0, 0.0), (0.0, 0.0), (0.0, 1.0)]),
    "tokens accrued before the change at the old rate": (
        1.0, 5, 5, 10.0, 5, 2.0, [(2.0, 0.0), (2.0, 0.0), (2.0, 0.1), (2.1, 0.0)]),
    "a slower rate applies from the change on": (10.0, 1, 1, 0.5, 1, 0.0, [(0.0, 2.0), (1.0, 1.0), (2.0, 0.0)]),
}


@pytest.mark.parametrize("case", RECONFIGURE_CASES)
def test_token_bucket_reconfigure(case: str) -> None:
    rate, burst, takes, new_rate, new_burst, at, steps = RECONFIGURE_CASES[case]
    bucket = TokenBucket(rate, burst, 0.0)
    for _ in range(takes):
        assert bucket.take(0.0) == 0.0
    bucket.reconfigure(new_rate, new_burst, at)
    assert [pytest.approx(bucket.take(now), abs=1e-9) for now, _ in steps] == [want for _, want in steps]


# limit, then a sequence of "enter"/"leave"/("limit", n) with the expected enter() result
GATE_CASES = {
    "up to the limit": (2, ["enter", True, "enter", True, "enter", False, "enter", False]),
    "a leave frees a slot": (2, ["enter", True, "enter", True, "leave", None, "enter", True, "enter", False]),
    "unlimited still counts": (None, ["enter", True] * 5),
    "leave never goes below zero": (1, ["leave", None, "leave", None, "enter", True, "enter", False]),
    "a lower limit leaves in-flight counted": (
        3, ["enter", True, "enter", True, ("limit", 1), None, "enter", False, "leave", None, "enter", False,
            "leave", None, "enter", True]),
    "a higher limit admits at once": (1, ["enter", True, "enter", False, ("limit", 2), None, "enter", True]),
}


@pytest.mark.parametrize("case", GATE_CASES)
def test_concurrency_gate(case: str) -> None:
    limit, script = GATE_CASES[case]
    gate = ConcurrencyGate(limit)
    got = []
    for step in script[0::2]:
        if step == "enter":
            got.append(gate.enter())
        elif step == "leave":
            gate.leave()
            got.append(None)
        else:
            gate.limit = step[1]
            got.append(None)
    assert got == script[1::2]
    assert gate.in_flight >= 0


BUSY = QuotaRefusal(503, 1, "concurrency")


def rate(seconds: int) -> QuotaRefusal:
    return QuotaRefusal(429, seconds, "rate")


@pytest.mark.parametrize(("quotas", "script"), [
    # concurrency: refused over the limit, with Retry-After 1; a leave admits again
    (Quotas(max_concurrent_requests=2), [("admit", 0.0, None), ("admit", 0.0, None), ("admit", 0.0, BUSY),
                                         ("leave",), ("admit", 0.0, None), ("admit", 0.0, BUSY)]),
    # rate: burst 5 at 5/s → 5 pass, then 429 with Retry-After 1 until a token is due
    (Quotas(requests_per_second=5, burst=5), [("admit", 0.0, None)] * 5 + [("admit", 0.0, rate(1))] * 3
     + [("admit", 0.2, None), ("admit", 0.2, rate(1))]),
    # a slow rate says how many whole seconds
    (Quotas(requests_per_second=0.25, burst=1), [("admit", 0.0, None), ("admit", 0.0, rate(4)),
                                                 ("admit", 1.5, rate(3)), ("admit", 4.0, None)]),
    # the gate is asked first: a request refused for concurrency takes no token
    (Quotas(max_concurrent_requests=1, requests_per_second=1, burst=2),
     [("admit", 0.0, None), ("admit", 0.0, BUSY), ("admit", 0.0, BUSY), ("leave",), ("admit", 0.0, None),
      ("leave",), ("admit", 0.0, rate(1))]),
    # a rate refusal holds no slot
    (Quotas(max_concurrent_requests=1, requests_per_second=1, burst=1),
     [("admit", 0.0, None), ("leave",), ("admit", 0.0, rate(1)), ("admit", 1.0, None)]),
    # no quotas: everything passes
    (Quotas(), [("admit", 0.0, None)] * 100),
])
def test_tenant_quota(quotas: Quotas, script: list[tuple]) -> None:
    tenant = TenantQuota(quotas, 0.0)
    for step in script:
        if step[0] == "leave":
            tenant.leave()
        else:
            assert tenant.admit(step[1]) == step[2], step


def test_burst_defaults_to_one_second_of_rate() -> None:
    tenant = TenantQuota(Quotas(requests_per_second=2.5), 0.0)
    assert [tenant.admit(0.0) for _ in range(4)] == [None, None, None, rate(1)]


def test_reload_keeps_in_flight_and_tokens_and_applies_new_limits() -> None:
    book = QuotaBook({"acme": Quotas(max_concurrent_requests=3, requests_per_second=10, burst=4),
                      "gone": Quotas(max_concurrent_requests=1)}, now=0.0)
    acme = book.get("acme")
    assert acme is not None
    for _ in range(3):
        assert acme.admit(0.0) is None  # 3 in flight, 1 token left
    gone = book.get("gone")
    assert gone is not None and gone.admit(0.0) is None

    book.update({"acme": Quotas(max_concurrent_requests=2, requests_per_second=1, burst=1),
                 "new": Quotas(requests_per_second=1, burst=1)}, now=0.0)
    assert book.get("acme") is acme  # the same state, re-limited
    assert acme.gate.in_flight == 3
    assert acme.admit(0.0) == BUSY  # 3 in flight > the new limit of 2
    acme.leave()
    acme.leave()
    assert acme.admit(0.0) is None  # 1 in flight; the token held before the reload is kept
    assert acme.admit(0.0) == BUSY
    acme.leave()
    assert acme.admit(0.0) == rate(1)  # now the new rate (1/s) applies
    assert book.get("gone") is None  # removed tenant: its in-flight request finishes on its own object
    gone.leave()
    new = book.get("new")
    assert new is not None and new.admit(0.0) is None and new.admit(0.0) == rate(1)
    assert set(book.tenants) == {"acme", "new"}


@pytest.mark.parametrize(("before", "after", "expected"), [
    (Quotas(requests_per_second=1, burst=1), Quotas(), [None] * 5),  # the rate limit removed
    (Quotas(), Quotas(requests_per_second=1, burst=2), [None, None, rate(1)]),  # added: starts full
    (Quotas(max_concurrent_requests=1), Quotas(), [None] * 5),
])
def test_reload_adding_and_removing_limits(before: Quotas, after: Quotas, expected: list) -> None:
    book = QuotaBook({"t": before}, 0.0)
    book.update({"t": after}, 1.0)
    tenant = book.get("t")
    assert tenant is not None
    assert [tenant.admit(1.0) for _ in expected] == expected


def test_memory_is_bounded_by_the_configuration() -> None:
    book = QuotaBook({f"t{i}": Quotas(max_concurrent_requests=5, requests_per_second=5) for i in range(10)}, 0.0)
    for i in range(10):
        tenant = book.get(f"t{i}")
        assert tenant is not None
        for step in range(1000):
            tenant.admit(step / 1000)
    assert len(book.tenants) == 10
    assert book.get("unknown") is None
