"""Groups as runtime versions, the pure parts as tables: which group a user goes to (default, canary share,
sticky, a removed group), the config of canaries and scale to zero, the front's decision for a group at zero
workers, and when a group goes down to zero."""

from __future__ import annotations

import pytest

from elasticd.config.load import parse_config
from elasticd.config.walk import ConfigError
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.dispatch import Refuse, Target, Wake, decide
from elasticd.front.core.groups import CANARY, DEFAULT, STICKY, canary_point, choose_group
from elasticd.front.core.http1 import RequestHead
from elasticd.front.core.routing import AppRoute
from elasticd.front.core.sticky import Surface, place
from elasticd.pool.idle import COLD_BOUNDS, ColdStarts, idle_stop

LOW = "00000000" + "0" * 24  # canary_point 0.0
MID = "80000000" + "0" * 24  # 0.5
HIGH = "ffffffff" + "f" * 24  # just under 1.0
TENTH = "19999999" + "0" * 24  # just under 0.1


def _route(share: float = 0.1, canary: str | None = "blue", groups: tuple[str, ...] = ("green", "blue")) -> AppRoute:
    return AppRoute("acme", "shop", "green", canary, share, frozenset(groups))


def test_canary_point_is_the_ids_first_32_bits():
    assert (canary_point(LOW), canary_point(MID), canary_point(TENTH)) == (0.0, 0.5, pytest.approx(0.1, abs=1e-9))
    assert 0.999 < canary_point(HIGH) < 1.0


@pytest.mark.parametrize(("route", "user", "placed", "chosen"), [
    (_route(0.1), MID, "", ("green", DEFAULT)),  # outside the share: the default
    (_route(0.1), LOW, "", ("blue", CANARY)),  # inside it: the canary
    (_route(0.1), TENTH, "", ("blue", CANARY)),
    (_route(0.0), LOW, "", ("green", DEFAULT)),  # a share of 0 %: nobody
    (_route(1.0), HIGH, "", ("blue", CANARY)),  # 100 %: everybody new
    (_route(0.1, canary=None, groups=("green",)), LOW, "", ("green", DEFAULT)),  # no canary
    # placed users stay where they are, whatever the share says now
    (_route(0.0), LOW, "blue", ("blue", STICKY)),  # the share went to 0: a canary user stays, kept (sticky)
    (_route(1.0), MID, "green", ("green", STICKY)),  # the share went to 100 %: a default user stays
    (_route(0.1), LOW, "blue", ("blue", CANARY)),  # where it would go anyway: not a sticky case
    (_route(0.1), MID, "green", ("green", DEFAULT)),
    # a blue/green switch: the default is now blue; a user placed on green stays on green
    (AppRoute("acme", "shop", "blue", None, 0.0, frozenset({"green", "blue"})), MID, "green", ("green", STICKY)),
    (AppRoute("acme", "shop", "blue", None, 0.0, frozenset({"green", "blue"})), MID, "", ("blue", DEFAULT)),
    # a removed group: chosen for again
    (_route(0.1, groups=("green", "blue")), MID, "red", ("green", DEFAULT)),
    (_route(0.1, groups=("green", "blue")), LOW, "red", ("blue", CANARY)),
])
def test_the_group_choice(route, user, placed, chosen):
    assert choose_group(route, user, placed) == chosen


def test_a_share_is_a_stable_hash_that_lands_near_its_share():
    import os
    users = [os.urandom(16).hex() for _ in range(20_000)]
    canaries = sum(1 for u in users if choose_group(_route(0.1), u)[0] == "blue")
    assert 1_800 < canaries < 2_200  # 10 % of 20,000 ± 5 sigma
    # stable: a user's place in [0, 1) is its id's, so a larger share keeps every user the smaller one had
    small = {u for u in users if choose_group(_route(0.05), u)[0] == "blue"}
    assert small and small <= {u for u in users if choose_group(_route(0.1), u)[0] == "blue"}


# ---------------------------------------------------------------------- the config

APP = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        default_group: green
{canary}        groups:
          green: {{command: [x]}}
          blue: {{command: [x], pool: {{min_workers: 0, idle_timeout: 30s}}}}
          old: {{command: [x], pool: {{min_workers: 2}}}}
"""


def test_a_canary_and_scale_to_zero_in_the_config(tmp_path):
    app = parse_config(APP.format(root=tmp_path, canary="        canary: {group: blue, share: 12.5%}\n")
                       ).tenants["acme"].apps["shop"]
    assert app.canary is not None and (app.canary.group, app.canary.share) == ("blue", 0.125)
    assert app.active_groups == {"green", "blue"}
    assert (app.floor("green"), app.floor("blue"), app.floor("old")) == (1, 0, 0)  # old: nobody new goes there
    assert app.groups["blue"].pool.idle_timeout == 30.0 and app.groups["green"].pool.idle_timeout == 600.0


@pytest.mark.parametrize(("canary", "error"), [
    ("canary: {group: red, share: 10%}", 'canary.group (line 8): "red" is not one of its groups (green, blue, old)'),
    ("canary: {group: green, share: 10%}", 'canary.group (line 8): "green" is the default_group'),
    ("canary: {group: blue, share: 101%}", 'canary.share (line 8): "101%" is not between 0% and 100%'),
    ("canary: {group: blue, share: ten}", "canary.share (line 8): \"ten\" is not a number"),
    ("canary: {group: blue}", "canary.share (line 8): missing: a canary needs a group and a share"),
    ("canary: {share: 5%}", "canary.group (line 8): missing: a canary needs a group and a share"),
    ("canary: blue", "canary (line 8): must be a mapping"),
    ("canary: {group: blue, share: 5%, sticky: true}", "canary.sticky (line 8): unknown key"),
])
def test_a_bad_canary_is_refused_naming_the_key_and_line(tmp_path, canary, error):
    with pytest.raises(ConfigError) as info:
        parse_config(APP.format(root=tmp_path, canary=f"        {canary}\n"))
    assert f"tenants.acme.apps.shop.{error}" in str(info.value)


def test_min_workers_may_be_zero_but_not_negative(tmp_path):
    with pytest.raises(ConfigError, match="min_workers"):
        parse_config(APP.format(root=tmp_path, canary="").replace("min_workers: 0", "min_workers: -1"))


# ---------------------------------------------------------------------- the front's decision at zero workers


def _head(cookie: str | None) -> RequestHead:
    head = RequestHead()
    head.cookie = f"elastic_uid={cookie}".encode() if cookie else None
    return head


class _W:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id


def test_a_request_for_a_group_at_zero_waits_for_its_cold_start_or_is_refused():
    surface, forwards = Surface(60.0), ForwardCounters()
    target = Target(_route(0.0), forwards.route("acme", "shop"), None)
    nobody = lambda tenant, app, group: []  # noqa: E731
    woken: list[tuple[str, str, str]] = []

    def wake(key: tuple[str, str, str]) -> bool:
        woken.append(key)
        return True

    assert decide(target, _head(None), 1.0, nobody, (), surface, place, forwards, None, wake) == Wake(
        ("acme", "shop", "green"))
    assert woken == [("acme", "shop", "green")]
    refused = decide(target, _head(None), 1.0, nobody, (), surface, place, forwards, None, lambda key: False)
    assert isinstance(refused, Refuse) and refused.status == 503 and refused.retry_after == 1
    assert decide(target, _head(None), 1.0, nobody, (), surface, place, forwards).status == 503  # no wake: as before


def test_each_request_is_routed_to_its_users_group_and_counted():
    surface, forwards = Surface(60.0), ForwardCounters()
    target = Target(_route(0.1), forwards.route("acme", "shop"), None)
    workers = {"green": [_W("acme.shop.green.1")], "blue": [_W("acme.shop.blue.1")]}
    by_group = lambda tenant, app, group: workers[group]  # noqa: E731
    canary = decide(target, _head(LOW), 1.0, by_group, (), surface, place, forwards)
    default = decide(target, _head(MID), 1.0, by_group, (), surface, place, forwards)
    assert canary[0].worker_id == "acme.shop.blue.1" and canary[5] == "blue"
    assert default[0].worker_id == "acme.shop.green.1" and default[5] == "green"
    assert surface.users[LOW].group == "blue" and surface.users[MID].group == "green"
    # The canary's share goes to 0 on a reload: the canary user stays; counted as kept (sticky)
    target = Target(_route(0.0), forwards.route("acme", "shop"), None)
    again = decide(target, _head(LOW), 2.0, by_group, (), surface, place, forwards)
    assert again[0].worker_id == "acme.shop.blue.1"
    assert forwards.routing_counts() == {("acme", "shop", "blue", CANARY): 1, ("acme", "shop", "green", DEFAULT): 1,
                                         ("acme", "shop", "blue", STICKY): 1}


def test_a_user_who_logs_out_is_chosen_a_group_again():
    surface = Surface(60.0)
    surface.assign(MID, "acme.shop.green.1", 1.0, "green")
    surface.login(MID, "alice", "acme.shop.green.1", 2.0, "green")
    assert surface.users[MID].group == "green"
    surface.login(MID, None, "acme.shop.green.1", 3.0, "green")
    assert surface.users[MID].group == ""


# ---------------------------------------------------------------------- down to zero


@pytest.mark.parametrize(("kwargs", "stop"), [
    ({}, "no user and no request for 700s"),
    ({"floor": 1}, None),  # min_workers 1 on an active group: never zero
    ({"workers": 0}, None),  # at zero already
    ({"users": 1}, None),  # a user on the surface still
    ({"open_requests": 1}, None),
    ({"last_active": 500.0}, None),  # 200 s ago: under the idle_timeout
    ({"active": False, "last_active": 999.0}, "no user left on a group new users no longer go to"),  # no wait
    ({"active": False, "users": 2}, None),  # its users finish there first
])
def test_when_a_group_goes_down_to_zero(kwargs, stop):
    args = {"now": 700.0, "floor": 0, "active": True, "workers": 1, "users": 0, "open_requests": 0,
            "last_active": 0.0, "idle_timeout": 600.0, **kwargs}
    why = idle_stop(**args)
    assert (why is None) if stop is None else (why is not None and why.startswith(stop)), why


def test_cold_starts_are_counted_in_a_histogram():
    cold = ColdStarts()
    for seconds in (0.3, 0.4, 7.0):
        cold.observe(seconds)
    assert (cold.count, cold.last, cold.sum) == (3, 7.0, pytest.approx(7.7))
    assert cold.buckets[COLD_BOUNDS.index(0.5)] == 2 and cold.buckets[COLD_BOUNDS.index(10.0)] == 1


def test_a_user_who_logs_out_and_in_again_is_placed_in_its_new_group_for_good():
    """After a logout the user's group is chosen again; once chosen it is recorded, so a later switch keeps it."""
    surface, forwards = Surface(60.0), ForwardCounters()
    workers = {"green": [_W("acme.shop.green.1")], "blue": [_W("acme.shop.blue.1")]}
    by_group = lambda tenant, app, group: workers[group]  # noqa: E731
    stats = forwards.route("acme", "shop")
    green = Target(AppRoute("acme", "shop", "green", None, 0.0, frozenset(workers), "acme/shop"), stats, None)
    decide(green, _head(MID), 1.0, by_group, (), surface, place, forwards)
    surface.login(MID, "alice", "acme.shop.green.1", 1.0, "green", "acme/shop")
    surface.login(MID, None, "acme.shop.green.1", 2.0, "green", "acme/shop")  # logged out
    assert surface.users[MID].group == ""
    again = decide(green, _head(MID), 3.0, by_group, (), surface, place, forwards)
    assert again[0].worker_id == "acme.shop.green.1" and surface.users[MID].group == "green"  # recorded again
    surface.login(MID, "alice", "acme.shop.green.1", 3.0, "green", "acme/shop")
    blue = Target(AppRoute("acme", "shop", "blue", None, 0.0, frozenset(workers), "acme/shop"), stats, None)
    kept = decide(blue, _head(MID), 4.0, by_group, (), surface, place, forwards)
    assert kept[0].worker_id == "acme.shop.green.1"  # a switch afterwards keeps it where it is
    assert surface.count_by_group() == {("acme/shop", "green"): 1}
    assert forwards.routing_counts() == {("acme", "shop", "green", DEFAULT): 2, ("acme", "shop", "green", STICKY): 1}


def test_a_request_that_waits_for_a_cold_start_is_counted_once_when_it_goes():
    surface, forwards = Surface(60.0), ForwardCounters()
    target = Target(_route(0.0), forwards.route("acme", "shop"), None)
    workers: list[_W] = []
    decide(target, _head(MID), 1.0, lambda *key: workers, (), surface, place, forwards, None, lambda key: True)
    assert forwards.routing_counts() == {}  # waiting: not routed yet
    workers.append(_W("acme.shop.green.1"))
    decide(target, _head(MID), 2.0, lambda *key: workers, (), surface, place, forwards, None, lambda key: True)
    assert forwards.routing_counts() == {("acme", "shop", "green", DEFAULT): 1}


# (name, the group's workers, a sticky user's worker (None: a new user), which are full, wake's answer, what comes)
GIVE_BACK = [
    ("forwarded: the slot is the request's", ["w1"], None, [], None, "forward"),
    ("no worker, none coming: 503", [], None, [], False, "Refuse"),
    ("no worker, one starting: it waits", [], None, [], True, "Wake"),
    ("a new user, every worker full", ["w1", "w2"], None, ["w1", "w2"], None, "NoRoom"),
    ("a sticky user on a full worker", ["w1", "w2"], "w2", ["w2"], None, "NoRoom"),
    ("a sticky user whose worker went, the rest full", ["w1"], "gone", ["w1"], None, "NoRoom"),
    ("a sticky user whose worker went, one has room", ["w1", "w2"], "gone", ["w1"], None, "forward"),
]


@pytest.mark.parametrize(("name", "ids", "sticky", "full", "woken", "outcome"), GIVE_BACK,
                         ids=[row[0] for row in GIVE_BACK])
def test_every_answer_but_a_forward_gives_its_quota_slot_back(name, ids, sticky, full, woken, outcome):
    from elasticd.config.model import Quotas
    from elasticd.front.core.quota import TenantQuota

    surface, forwards = Surface(60.0), ForwardCounters()
    quota = TenantQuota(Quotas(max_concurrent_requests=1), 0.0)
    target = Target(_route(0.0), forwards.route("acme", "shop"), quota)
    cookie = None
    if sticky is not None:
        cookie = MID
        surface.assign(MID, sticky, 0.0, "green", "acme/shop")
    workers = [_W(i) for i in ids]
    answer = decide(target, _head(cookie), 1.0, lambda t, a, g: workers, (), surface, place, forwards, None,
                    (lambda key: woken) if woken is not None else None, {w: (9.0, 2, 0.5) for w in full})
    kind = "forward" if type(answer) is tuple else type(answer).__name__
    assert kind == outcome
    assert quota.gate.in_flight == (1 if outcome == "forward" else 0)
