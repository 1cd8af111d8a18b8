"""Who the front lets say where a request came from (``proxy_trust``): the table, then the shell over a guard that
answers as the kernel would."""

from __future__ import annotations

import pytest

from elasticd.listener_guard.verdict import PeerVerdict
from elasticd.proxy_trust import ProxyTrust, TrustedProxies

TRUST = TrustedProxies.of(["10.0.0.7/32", "192.168.1.0/24", "2001:db8::/32"], [115])


@pytest.mark.parametrize(("address", "trusted"), [
    ("10.0.0.7", True), ("10.0.0.8", False), ("192.168.1.200", True), ("::ffff:192.168.1.9", True),
    ("2001:db8::1", True), ("2001:db9::1", False), ("fe80::1%eth0", False), ("not an address", False),
])
def test_another_host_by_its_address(address: str, trusted: bool) -> None:
    assert TRUST.by_address(address) is trusted


@pytest.mark.parametrize(("verdict", "trusted"), [
    (PeerVerdict(True, uid=115), True),  # the proxy's user, in no tenant's cgroup
    (PeerVerdict(True, uid=0), False),  # root is not named
    (PeerVerdict(False, "tenant-cgroup", "acme", 115), False),  # the proxy's uid, from a tenant's cgroup
    (PeerVerdict(False, "peer-gone"), False),
    (PeerVerdict(False, "lookup-failed"), False),  # fail closed
])
def test_a_local_peer_by_the_kernels_word_on_its_socket(verdict: PeerVerdict, trusted: bool) -> None:
    assert TRUST.by_socket(verdict) is trusted


class Guard:
    """What the listener guard answers: local for 127.0.0.1 and 10.0.0.7 (this host's own address), and the socket's
    owner as given."""

    def __init__(self, verdict: PeerVerdict) -> None:
        self.verdict = verdict
        self.asked: list[str] = []

    def local(self, peer: tuple[str, int], own: tuple[str, int]) -> bool:
        return peer[0] in ("127.0.0.1", "10.0.0.7")

    def identify(self, peer: tuple[str, int], own: tuple[str, int]) -> PeerVerdict:
        self.asked.append(peer[0])
        return self.verdict


@pytest.mark.parametrize(("peer", "uids", "verdict", "trusted", "asked"), [
    ("192.168.1.9", [115], PeerVerdict(True, uid=115), True, []),  # another host: its address, nothing asked
    ("10.0.0.7", [115], PeerVerdict(True, uid=0), False, ["10.0.0.7"]),  # in a trusted network, but this host's
    ("127.0.0.1", [115], PeerVerdict(True, uid=115), True, ["127.0.0.1"]),
    ("127.0.0.1", [], PeerVerdict(True, uid=115), False, []),  # no trusted user: the kernel is not asked
])
def test_the_shell_asks_the_kernel_only_for_a_local_peer_and_a_trusted_user(
        peer: str, uids: list[int], verdict: PeerVerdict, trusted: bool, asked: list[str]) -> None:
    guard = Guard(verdict)
    trust = ProxyTrust(TrustedProxies.of(["10.0.0.0/8", "192.168.1.0/24"], uids), guard)  # type: ignore[arg-type]
    assert trust((peer, 40000), ("127.0.0.1", 8080)) is trusted
    assert guard.asked == asked


def test_nobody_configured_is_nobody_trusted() -> None:
    assert not TrustedProxies.of([], []).anyone
    assert TrustedProxies.of([], [115]).anyone and TrustedProxies.of(["10.0.0.0/8"], []).anyone
