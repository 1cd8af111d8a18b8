"""``server.trusted_proxies``, ``server.trusted_proxy_users``, ``server.underscored_headers``: their values, and each
refusal naming the key, the item and its line. The users are ``nobody`` and ``daemon`` (on every Debian host)."""

from __future__ import annotations

import pwd

import pytest

from elasticd.config import ConfigError, parse_config

NOBODY = pwd.getpwnam("nobody")
DAEMON = pwd.getpwnam("daemon")

CONFIG = """\
server:
{server}
tenants:
  acme:
{who}
    apps:
      shop:
        domains: [shop.localhost]
        root: /srv/shop
        groups:
          green: {{command: [app]}}
"""


def _config(server: str, who: str = "") -> str:
    return CONFIG.format(server=server, who=who)


def _errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return [str(issue) for issue in info.value.issues]


def test_nobody_is_trusted_by_default() -> None:
    server = parse_config(_config("  listen: 127.0.0.1:8080")).server
    assert (server.trusted_proxies, server.trusted_proxy_users, server.underscored_headers) == ((), (), "drop")


def test_networks_and_users_are_read_and_normalised() -> None:
    server = parse_config(_config(
        "  trusted_proxies: [10.0.0.7, 192.168.1.0/24, '2001:db8::/32']\n"
        f"  trusted_proxy_users: [nobody, {DAEMON.pw_uid}]\n  underscored_headers: keep")).server
    assert server.trusted_proxies == ("10.0.0.7/32", "192.168.1.0/24", "2001:db8::/32")
    assert server.trusted_proxy_users == (("nobody", NOBODY.pw_uid), ("daemon", DAEMON.pw_uid))
    assert server.underscored_headers == "keep"


@pytest.mark.parametrize(("server", "expected"), [
    ("  trusted_proxies: [10.0.0.0/8, 10.0.0.300]",
     'server.trusted_proxies.1 (line 2): "10.0.0.300" is not an address or network (CIDR)'),
    ("  trusted_proxies: [10.0.0.1/8]",  # host bits set: which network was meant is the operator's to say
     'server.trusted_proxies.0 (line 2): "10.0.0.1/8" is not an address or network (CIDR): 10.0.0.1/8 has host bits'),
    ("  trusted_proxies:\n    - 10.0.0.0/8\n    - 127.0.0.1",
     'server.trusted_proxies.1 (line 4): "127.0.0.1" is loopback, where every tenant\'s process connects from too: '
     "trust a proxy on this host by its user (server.trusted_proxy_users)"),
    ("  trusted_proxies: ['::1']", 'server.trusted_proxies.0 (line 2): "::1" is loopback'),
    ("  trusted_proxies: 10.0.0.0/8", 'server.trusted_proxies (line 2): "10.0.0.0/8" is not a list'),
    ("  trusted_proxies: [{a: 1}]", "server.trusted_proxies.0 (line 2): a mapping is not an address or network"),
    ("  trusted_proxy_users: [nobody, no-such-user-here]",
     'server.trusted_proxy_users.1 (line 2): "no-such-user-here" is not a user on this host (see getent passwd)'),
    ("  trusted_proxy_users: [true]", "server.trusted_proxy_users.0 (line 2): a boolean is not a user on this host"),
    ("  trusted_proxy_users: [4294967296]",
     "server.trusted_proxy_users.0 (line 2): the number 4294967296 is not a user on this host"),
    ("  underscored_headers: allow", 'server.underscored_headers (line 2): "allow" is not drop or keep'),
])
def test_refusals_name_the_key_the_item_and_its_line(server: str, expected: str) -> None:
    errors = _errors(_config(server))
    assert any(error.startswith(expected) for error in errors), errors


def test_a_tenants_user_is_no_trusted_proxy() -> None:
    errors = _errors(_config("  trusted_proxy_users:\n    - daemon\n    - nobody", who="    user: nobody"))
    assert errors == ["server.trusted_proxy_users.1 (line 4): nobody is tenant acme's user: its processes would be "
                      "trusted to say where a request came from; run the proxy as a user of its own"]
