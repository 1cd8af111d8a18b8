"""The state one image hands the next (elasticd/upgrade): its writing and reading as a round trip, the refusals,
and the partial adoption as a table."""

from __future__ import annotations

import json

import pytest

from elasticd.upgrade.adoption import Verdict, plan_adoption
from elasticd.upgrade.state import (
    FORMAT,
    SavedRequest,
    SavedState,
    SavedUnsent,
    SavedUser,
    SavedWorker,
    StateError,
    digest,
    dump,
    load,
)

SPEC = digest(("python", "-m", "elasticd.demo"))
W1 = SavedWorker("acme.shop.green.1", "acme", "shop", "green", 4242, 1000, "/run/w1.sock", "t" * 32, SPEC)
W2 = SavedWorker("acme.shop.green.2", "acme", "shop", "green", 4243, 1001, "/run/w2.sock", "u" * 32, SPEC,
                 restarts=2)
STATE = SavedState(workers=(W1, W2),
                   users=(SavedUser("a" * 32, W1.id, "green", "acme/shop", "ann", 12.5, 3, 0.25),
                          SavedUser("b" * 32, W2.id, "green", "acme/shop", None, 13.0)),
                   overrides={"acme": {"cpu": "40%"}}, buckets={"acme": (4.5, 12.0)},
                   next_ids={"acme/shop/green": 3}, written_at=99.5,
                   requests=(SavedRequest(7, 8, W1.id, "a" * 32, "acme", "shop", "green", "shop.localhost", "GET",
                                          "/slow?ms=9000", True, True, False, "", 98.25),),
                   unsent=(SavedUnsent(9, "R0VUIC8gSFRUUC8xLjENCg0K"),))


def test_the_state_is_read_back_as_it_was_written():
    assert load(dump(STATE)) == STATE
    assert json.loads(dump(STATE))["format"] == FORMAT


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda d: d.update(format=FORMAT + 1), f"format {FORMAT + 1}: this elasticd reads formats 1, 2"),
    (lambda d: d.update(format=True), "format True"),
    (lambda d: d.pop("format"), "format None"),
    (lambda d: d["workers"][1].pop("pid"), "workers[1].pid: missing"),
    (lambda d: d["workers"][0].update(pid="4242"), "workers[0].pid: '4242' is not of the right kind"),
    (lambda d: d["workers"][0].update(pid=True), "workers[0].pid: True is not of the right kind"),
    (lambda d: d["workers"][0].update(extra=1), "workers[0]: unknown field 'extra'"),
    (lambda d: d["users"][0].update(login=7), "users[0].login: 7 is not of the right kind"),
    (lambda d: d.update(overrides={"acme": {"cpu": [40]}}), "overrides.acme.cpu: [40] is not of the right kind"),
    (lambda d: d.update(buckets={"acme": [1.0]}), "buckets.acme: not a pair"),
    (lambda d: d.update(workers={}), "workers: not a list"),
    (lambda d: d["requests"][0].update(keep_alive="yes"), "requests[0].keep_alive: 'yes' is not of the right kind"),
    (lambda d: d["requests"][0].pop("upstream"), "requests[0].upstream: missing"),
    (lambda d: d["unsent"][0].update(data=None), "unsent[0].data: None is not of the right kind"),
])
def test_a_document_of_another_format_or_malformed_is_refused_naming_why(change, refusal):
    document = json.loads(dump(STATE))
    change(document)
    with pytest.raises(StateError) as refused:
        load(json.dumps(document).encode())
    assert str(refused.value).startswith(refusal)


def test_a_format_1_document_is_read_with_no_request_awaiting_its_answer():
    """The image before format 2 wrote no ``requests``: an upgrade from it reads the rest as it was."""
    document = json.loads(dump(STATE))
    document.update(format=1)
    del document["requests"], document["unsent"]
    assert load(json.dumps(document).encode()) == SavedState(**{**{f: getattr(STATE, f) for f in STATE.__slots__},
                                                                "requests": (), "unsent": (), "format": 1})


def test_not_json_is_refused():
    with pytest.raises(StateError, match="not JSON"):
        load(b"\x00garbage")
    with pytest.raises(StateError, match="not a JSON object"):
        load(b"[]")


GROUPS = {"acme/shop/green": SPEC}
BOTH = {4242: 1000, 4243: 1001}

# (name, the new configuration's groups, what lives now (pid → start time), each worker's verdict, users kept)
ADOPTION = [
    ("nothing changed: both adopted", GROUPS, BOTH, [Verdict.ADOPT, Verdict.ADOPT], 2),
    ("a worker gone", GROUPS, {4243: 1001}, [Verdict.GONE, Verdict.ADOPT], 1),
    ("a pid reused by a stranger", GROUPS, {4242: 5000, 4243: 1001}, [Verdict.GONE, Verdict.ADOPT], 1),
    ("the group's definition changed", {"acme/shop/green": digest("other")}, BOTH, [Verdict.CHANGED] * 2, 0),
    ("the group removed", {"acme/shop/blue": SPEC}, BOTH, [Verdict.REMOVED] * 2, 0),
    ("gone and changed: gone first (nothing to stop)", {"acme/shop/green": digest("other")}, {4243: 1001},
     [Verdict.GONE, Verdict.CHANGED], 0),
]


@pytest.mark.parametrize(("name", "groups", "alive", "verdicts", "kept"), ADOPTION, ids=[row[0] for row in ADOPTION])
def test_partial_adoption(name, groups, alive, verdicts, kept):
    adoption = plan_adoption(STATE, groups, alive)
    assert [verdict for _, verdict, _ in adoption.workers] == verdicts
    assert len(adoption.users) == kept and adoption.dropped_users == 2 - kept
    assert all(why for _, _, why in adoption.workers)  # each verdict says why, for the journal
    assert [w.id for w in adoption.of(Verdict.ADOPT)] == [w.id for w, v, _ in adoption.workers if v is Verdict.ADOPT]


def test_a_worker_of_a_build_before_the_keeper_is_replaced_once_and_said_so():
    """It lives, but as the previous elasticd's own child, not the keeper's: not adopted, and not called gone."""
    adoption = plan_adoption(STATE, GROUPS, {4243: 1001}, foreign={4242})
    (first, verdict, why), (_, second, _) = adoption.workers
    assert (first.pid, verdict, second) == (4242, Verdict.GONE, Verdict.ADOPT)
    assert why == "started before the keeper (the previous elasticd's own child): replaced once"
