"""What an operator is told about a valid configuration (config/notices.py), as tables."""

from __future__ import annotations

import pwd

import pytest

from elasticd.config import parse_config
from elasticd.config.notices import RESTART_ONLY_KEYS, isolation_warnings, restart_only_changes

APP = "apps: {{a{n}: {{domains: [a{n}.localhost], root: /nonexistent/a{n}, groups: {{g: {{command: [x]}}}}}}}}"


def _tenants(*users: str | None) -> str:
    lines = ["tenants:"]
    for n, user in enumerate(users):
        lines.append(f"  t{n}:")
        if user is not None:
            lines.append(f"    user: {user}")
        lines.append("    " + APP.format(n=n))
    return "\n".join(lines)


NOBODY = "nobody"


@pytest.mark.parametrize(("users", "expected"), [
    ((NOBODY,), []),
    ((None,), ["tenant t0 runs as root: its workers can undo their own limits (give it a user:)"]),
    (("root",), ["tenant t0 runs as root: its workers can undo their own limits (give it a user:)"]),
    ((NOBODY, NOBODY), [f"tenants t0, t1 share the user nobody (uid {pwd.getpwnam(NOBODY).pw_uid}): they can signal "
                        "each other's workers and read each other's files"]),
])
def test_isolation_warnings(users, expected):
    assert isolation_warnings(parse_config(_tenants(*users))) == expected


def test_a_condition_many_tenants_meet_is_one_line_with_a_count_and_a_few_names():
    warnings = isolation_warnings(parse_config(_tenants(*[None] * 1000)))
    assert warnings == ["1000 tenants run as root: t0, t1, t2, t3, t4 and 995 more: their workers can undo their own "
                        "limits (give each a user:)"]
    warnings = isolation_warnings(parse_config(_tenants(None, None)))
    assert warnings == ["2 tenants run as root: t0, t1: their workers can undo their own limits (give each a user:)"]


def test_server_keys_a_reload_cannot_take_over_are_named_once():
    old = parse_config("server: {listen: 127.0.0.1:8080, request_timeout: 60s}")
    new = parse_config("server: {listen: 127.0.0.1:8081, request_timeout: 30s, sample_interval: 2s}")
    assert restart_only_changes(old, new) == ["server.listen changed: it takes effect when elasticd restarts",
                                              "server.sample_interval changed: it takes effect when elasticd restarts"]
    assert restart_only_changes(old, old) == []
    assert "request_timeout" not in RESTART_ONLY_KEYS  # reloadable: the front takes it over in place
