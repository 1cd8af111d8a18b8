from __future__ import annotations

import pytest

from elasticd.config import ConfigError, Resources
from elasticd.limits.overrides import (
    clear_overrides,
    describe,
    effective,
    parse_clear_request,
    parse_limit_request,
)


@pytest.mark.parametrize(("body", "values", "persist"), [
    ({"cpu": "50%"}, {"cpu": 50.0}, False),
    ({"cpu": "max", "persist": True}, {"cpu": None}, True),
    ({"memory": "512M"}, {"memory": 512 * 1024**2}, False),
    ({"memory": 1024}, {"memory": 1024}, False),
    ({"io_weight": 300}, {"io_weight": 300}, False),
    ({"io_bandwidth": {"read": "50M", "write": "max"}}, {"io_read": 50 * 1024**2, "io_write": None}, False),
    ({"io_bandwidth": {"write": "1M"}}, {"io_write": 1024**2}, False),
])
def test_valid_requests(body, values, persist):
    request = parse_limit_request(body)
    assert dict(request.values) == values
    assert request.persist is persist


@pytest.mark.parametrize(("body", "expected"), [
    ([], "body: must be a JSON object"),
    ({}, "body: names no limit"),
    ({"persist": True}, "body: names no limit"),
    ({"cpu": "fifty"}, 'cpu: "fifty" is not a percentage'),
    ({"cpu": None}, 'cpu: needs a value (write "max" for no limit)'),
    ({"memory": "1GB"}, 'memory: "1GB" is not a size'),
    ({"memory": 0}, 'memory: "0" must be more than 0'),
    ({"io_weight": 0}, "io_weight: 0 is out of range"),
    ({"io_weight": "heavy"}, 'io_weight: "heavy" is not a whole number'),
    ({"io_bandwidth": "50M"}, "io_bandwidth: must be an object"),
    ({"io_bandwidth": {"reed": "5M"}}, "io_bandwidth.reed: unknown field"),
    ({"io_bandwidth": {"write": "fast"}}, 'io_bandwidth.write: "fast" is not a size'),
    ({"pids": 10}, "pids: unknown field"),
    ({"cpu": "50%", "persist": "yes"}, "persist: must be true or false"),
])
def test_refusals_name_the_field(body, expected):
    with pytest.raises(ConfigError) as info:
        parse_limit_request(body)
    assert expected in str(info.value)


def test_all_problems_at_once_and_nothing_half_applied():
    with pytest.raises(ConfigError) as info:
        parse_limit_request({"cpu": "50%", "memory": "lots", "io_weight": -1})
    assert len(info.value.issues) == 2  # cpu was fine, but the request as a whole is refused


def test_effective_and_describe():
    config = Resources(cpu=150.0, memory=1024**3, io_weight=None)
    override = {"cpu": 10.0, "io_write": 1024**2}
    merged = effective(config, override)
    assert (merged.cpu, merged.memory, merged.io_write) == (10.0, 1024**3, 1024**2)
    shown = describe(config, override)
    assert shown["cpu"] == {"value": "10%", "source": "override", "config": "150%"}
    assert shown["memory"] == {"value": "1G", "source": "config"}
    assert shown["io_weight"] == {"value": "default 100", "source": "config"}
    assert shown["io_bandwidth.write"] == {"value": "1M", "source": "override", "config": "max"}
    assert shown["swap"] == {"value": "0", "source": "config"}


@pytest.mark.parametrize(("query", "names"), [
    (None, None),
    ("", None),
    ("  ", None),
    ("cpu", {"cpu"}),
    ("cpu,memory", {"cpu", "memory"}),
    ("io-read, io_write", {"io_read", "io_write"}),  # elasticctl's spelling and the API's
    ("io_weight,io_weight", {"io_weight"}),
])
def test_the_clear_query_names_overridable_limits(query, names):
    assert parse_clear_request(query) == (None if names is None else frozenset(names))


@pytest.mark.parametrize(("query", "expected"), [
    ("swap", 'limits: "swap" is not a limit an override can set (expected any of: cpu, memory, io_weight, io_read, '
             "io_write)"),
    ("cpu,,memory", 'limits: "" is not a limit an override can set'),
    ("cpu,bogus", 'limits: "bogus" is not a limit'),
])
def test_an_unknown_name_to_clear_is_refused_naming_it(query, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        parse_clear_request(query)


OVERRIDE = {"cpu": 10.0, "memory": 512, "io_read": 1024}


@pytest.mark.parametrize(("names", "remaining", "cleared"), [
    (None, {}, ["cpu", "memory", "io_read"]),  # all, in the table's order
    (frozenset({"cpu"}), {"memory": 512, "io_read": 1024}, ["cpu"]),
    (frozenset({"memory", "io_read"}), {"cpu": 10.0}, ["memory", "io_read"]),
    (frozenset({"io_write"}), OVERRIDE, []),  # no override there: nothing to clear, no error
])
def test_clearing_takes_away_exactly_the_named_overrides(names, remaining, cleared):
    assert clear_overrides(OVERRIDE, names) == (remaining, cleared)
    assert clear_overrides({}, names) == ({}, [])
