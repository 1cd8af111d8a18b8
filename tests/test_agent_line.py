"""HAProxy's agent-check line (agent/line.py): tables for every state, and the hint HAProxy sends."""

from __future__ import annotations

import pytest

from elasticd.agent.line import MAX_HINT, AppRoom, GroupRoom, Hint, app_line, host_line, parse_hint, weight_of


def group(*occupancies: float, counted_workers: int | None = None, max_workers: int | None = 4, held: bool = False,
          rt: float = 0.5, at: float = 0.8, failed: bool = False, share: float = 1.0) -> GroupRoom:
    return GroupRoom(tuple(occupancies), len(occupancies) if counted_workers is None else counted_workers, max_workers,
                     rt, at, held, failed, share)


# potential at max 4: 0.5 + 3 * 0.8 = 2.9
@pytest.mark.parametrize(("groups", "weight"), [
    ([group(0.0)], 100),  # one idle worker, three more to start: all the room there is (0.5 + 3 * 0.8) / 2.9
    ([group(0.5)], 82),  # the reception at its threshold: 2.4 / 2.9
    ([group(0.5, 0.8, 0.8, 0.8)], 0),  # at max_workers, every worker at its threshold: full
    ([group(0.5, 0.4, 0.8, 0.8)], 13),  # near full: 0.4 of 2.9
    ([group(1.0, 1.0)], 55),  # over its thresholds (no negative headroom) but two more may start: 1.6 / 2.9
    ([group(0.0, held=True)], 0),  # a scale-up held by a cgroup limit: full, whatever its workers say
    ([group(0.0, counted_workers=4)], 17),  # four held (starting, draining): only the routable one's headroom
    ([group(0.0, max_workers=None)], 100),  # unbounded: it can always start another
    ([group(0.0, max_workers=None, held=True)], 0),
    ([group(0.5, 0.8, 0.8, 0.8, share=0.9), group(0.0, share=0.1)], 10),  # a full default, an idle 10 % canary
    ([group(0.5, 0.8, 0.8, 0.8, share=0.5), group(0.0, share=0.5)], 50),  # … a 50 % one
    ([group(counted_workers=0)], 100),  # at zero (min_workers 0): a cold start can give it everything
    ([group(counted_workers=0, max_workers=1, rt=0.9, at=0.5)], 100),  # the first to start is the reception (0.9)
    ([group(counted_workers=0, failed=True)], 0),  # its workers failed, none serves: it takes no one
    ([group(0.0, failed=True, share=0.9), group(0.0, share=0.1)], 10),  # a dead default is no room
    ([], 0),
])
def test_the_weight_is_the_room_over_what_the_groups_could_hold(groups, weight):
    assert weight_of(groups) == weight


SHOP = AppRoom("acme/shop", (group(0.5),))


@pytest.mark.parametrize(("app", "stopping", "line"), [
    (SHOP, False, "up ready 82% maxconn:0 #acme/shop: room 2.40 of 2.90\n"),
    (AppRoom("acme/shop", (group(0.5),), maxconn=64), False, "up ready 82% maxconn:64 #acme/shop: room 2.40 of 2.90\n"),
    (AppRoom("acme/shop", (group(0.1, held=True),)), False,
     "up ready 0% maxconn:0 #acme/shop: room 0.00 of 2.90 (held by a cgroup limit)\n"),
    (SHOP, True, "drain #acme/shop: elasticd is stopping\n"),
    (AppRoom("acme/shop", (group(0.0),), draining=True), False, "drain #acme/shop: its workers are being emptied\n"),
    (AppRoom("acme/shop", (), removed=True), False, "maint #acme/shop: removed from this host\n"),
    (AppRoom("acme/shop", (), removed=True), True, "maint #acme/shop: removed from this host\n"),
    (AppRoom("acme/shop", (), remote=True, maxconn=8), False,
     "up ready 100% maxconn:8 #acme/shop: served by nodes (their own agents say their room)\n"),
    (AppRoom("acme/shop", (group(),), failed=True), False, "maint #acme/shop: its workers failed\n"),
    (AppRoom("acme/shop", (group(),), failed=True), True, "drain #acme/shop: elasticd is stopping\n"),
    (None, False, "down #no app shop.example here\n"),
])
def test_the_line_for_an_app(app, stopping, line):
    assert app_line(app, "shop.example", stopping) == line


def test_every_answer_names_both_states_so_a_recovery_undoes_a_drain_or_a_maint():
    for line in (app_line(SHOP, "x"), host_line([SHOP])):
        words = line.split("#")[0].split()
        assert words[:2] == ["up", "ready"] and words[2].endswith("%")


@pytest.mark.parametrize(("apps", "stopping", "line"), [
    ([SHOP, AppRoom("globex/blog", (group(0.0),))], False, "up ready 91% #2 apps: room 5.30 of 5.80\n"),
    ([SHOP, AppRoom("globex/blog", (group(),), failed=True)], False, "up ready 82% #1 app: room 2.40 of 2.90\n"),
    ([AppRoom("globex/blog", (group(),), failed=True)], False, "maint #no app can serve\n"),
    ([], False, "up ready 100% #no app configured\n"),
    ([SHOP], True, "drain #elasticd is stopping\n"),
])
def test_the_line_for_the_whole_host(apps, stopping, line):
    assert host_line(apps, stopping) == line


@pytest.mark.parametrize(("sent", "hint"), [
    (b"", Hint("")),
    (b"\n", Hint("")),
    (b"shop.example\n", Hint("shop.example")),
    (b"Shop.Example.:8080\r\n", Hint("shop.example")),  # case, a trailing dot and a port: the front's own rule
    (b"shop.example", Hint("shop.example")),  # no newline (agent-send "shop.example")
    (b"acme/shop\n", Hint("acme/shop")),
    (b"acme/shop\nmore\n", Hint("acme/shop")),  # the first line only
    (b"two words\n", Hint("", "a hint that is not one word of printable ASCII")),
    (b"caf\xc3\xa9\n", Hint("", "a hint that is not one word of printable ASCII")),
    (b"x" * (MAX_HINT + 1), Hint("", f"a hint of over {MAX_HINT} bytes")),
])
def test_what_haproxy_sends(sent, hint):
    assert parse_hint(sent) == hint


def test_a_hint_cannot_inject_into_the_line():
    assert app_line(None, "evil#up\r\n100%") == "down #no app evilup100% here\n"
