"""Several hosts behind a real HAProxy (Debian's haproxy), weighted by each host's own room through its agent-check:
two elasticd daemons as two hosts — each in a network namespace of its own, made and removed here, reached over a
veth pair at an address of the benchmarking range (198.18.0.0/15); on two loopback addresses where namespaces
cannot be made — the same app on each. Users stay on their host; a
host whose app is saturated answers a weight of 0 % and new users land on the other; a host that is stopping
answers `drain` for server.stop_drain — new users go to the other host while its own users are still served — and
once it is gone they are redispatched: no request fails. This file's HAProxy configuration is the README's."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from harness import free_port

HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="no HAProxy here (apt install haproxy)")

APP = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{DEMO_GREETING: {host}}}
            concurrency: 2
            pool: {{min_workers: 1, max_workers: 1}}
            capacity: {{probe: prometheus, path: /metrics, interval: 100ms, max_age: 2s}}
"""

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_snippet() -> str:
    """The HAProxy lines of the README's "More than one host" (what an operator copies)."""
    section = README.read_text().split("The HAProxy side", 1)[1]
    return section.split("```\n", 2)[1]


def haproxy_config(stats: Path, port: int, a, b) -> str:
    """The README's snippet, with this test's addresses, ports, domain and shorter intervals: what the test runs is
    what the README says, line for line otherwise."""
    text = readme_snippet()
    for readme_address, host in (("10.0.0.5", a), ("10.0.0.6", b)):
        text = text.replace(f"{readme_address}:8080", f"{host.host}:{host.port}")
        text = text.replace(f"agent-addr {readme_address} agent-port 9465",
                            f"agent-addr {host.host} agent-port {host.agent_port}")
    text = text.replace("inter 2s", "inter 300ms").replace("shop.example.com", "shop.localhost")
    assert "10.0.0." not in text and "9465" not in text, text
    return (f"global\n    stats socket {stats} mode 600 level admin\n\n" + text
            + f"\nfrontend web\n    bind 127.0.0.1:{port}\n    default_backend shop\n")


class HAProxy:
    def __init__(self, tmp: Path, a, b) -> None:
        self.port, self.stats = free_port(), tmp / "haproxy.sock"
        config = tmp / "haproxy.cfg"
        config.write_text(haproxy_config(self.stats, self.port, a, b))
        check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = open(tmp / "haproxy.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=self.log, stderr=subprocess.STDOUT)

    def servers(self) -> dict[str, dict[str, str]]:
        """`show stat` of the backend: per server, its status (UP, DRAIN, DOWN...), weight and agent status."""
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(self.stats))
            conn.sendall(b"show stat\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {r["svname"]: r for r in rows if r["pxname"] == "shop" and r["svname"] in ("a", "b")}

    def wait(self, predicate, what: str, timeout: float = 20.0) -> dict[str, dict[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                servers = self.servers()
            except OSError:
                servers = {}
            if servers and predicate(servers):
                return servers
            assert time.monotonic() < deadline, f"{what}: {servers}"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class User:
    """A browser through HAProxy: it keeps HAProxy's SRV cookie and elasticd's elastic_uid; ``keep_alive``: and its
    connection, from one request to the next (HAProxy may then reuse its connection to the host, too)."""

    def __init__(self, port: int, keep_alive: bool = False) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30) if keep_alive else None

    def get(self, path: str = "/") -> tuple[int, str]:
        conn = self.conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            conn.request("GET", path, headers={"Host": "shop.localhost", **({"Cookie": cookie} if cookie else {})})
            response = conn.getresponse()
            body = response.read().decode(errors="replace")
            for header in response.msg.get_all("Set-Cookie") or []:
                name, _, rest = header.partition("=")
                self.cookies[name.strip()] = rest.split(";")[0]
            return response.status, body
        finally:
            if self.conn is None:
                conn.close()

    def host(self) -> str:
        status, body = self.get()
        assert status == 200, (status, body)
        return body.split("\n")[0]  # the demo's greeting: the host's name


def _sleep_on(host, port: int, ms: int) -> threading.Thread:
    """Work straight to a host's own front (not through HAProxy): it keeps that host's only worker busy."""
    def run() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", f"/sleep?ms={ms}", headers={"Host": "shop.localhost"})
        conn.getresponse().read()
        conn.close()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def networks():
    """Two hosts' (address, namespace): a namespace each, with a veth pair to this one (198.18.N.1 here, .2 there),
    removed at the end; two loopback addresses and no namespace where they cannot be made (not root, no ip)."""
    pid = os.getpid()
    tag = f"el{pid % 100000}"
    made: list[str] = []
    links: list[str] = []
    hosts: list[tuple[str, str | None]] = []

    def clean() -> None:
        for ns in made:  # its end of each veth pair goes with it, and so does this end
            _ip("netns", "del", ns)
        for link in links:  # (one left outside by a step that failed half-way)
            _ip("link", "del", link)

    try:
        for n in (1, 2):
            # A /30 of this run's own (from its pid): two runs at once, or one killed earlier, do not collide.
            third, fourth = pid % 256, 4 * n
            here, there = f"198.18.{third}.{fourth + 1}", f"198.18.{third}.{fourth + 2}"
            ns, outside, inside = f"{tag}h{n}", f"{tag}o{n}", f"{tag}i{n}"
            steps = [("netns", "add", ns), ("link", "add", outside, "type", "veth", "peer", "name", inside),
                     ("link", "set", inside, "netns", ns), ("addr", "add", f"{here}/30", "dev", outside),
                     ("link", "set", outside, "up"), ("-n", ns, "addr", "add", f"{there}/30", "dev", inside),
                     ("-n", ns, "link", "set", inside, "up"), ("-n", ns, "link", "set", "lo", "up")]
            for step in steps:
                if shutil.which("ip") is None or os.geteuid() != 0 or _ip(*step).returncode != 0:
                    raise OSError(f"ip {' '.join(step)}")
                if step[:2] == ("netns", "add"):
                    made.append(ns)
                elif step[:2] == ("link", "add"):
                    links.append(outside)
            hosts.append((there, ns))
    except OSError:
        clean()
        made, links, hosts = [], [], [("127.0.0.2", None), ("127.0.0.3", None)]
    yield hosts
    clean()  # (the daemons in them were stopped first: this fixture was set up before theirs)


def test_hosts_behind_haproxy_weighted_by_their_agents_and_drained_before_they_stop(networks, daemons, tmp_path):
    hosts = []
    for name, (address, netns) in zip(("host-a", "host-b"), networks, strict=True):
        agent_port = free_port()
        d = daemons(APP.format(root=tmp_path, host=name), host=address, netns=netns,
                    extra_server=f"  occupancy_interval: 200ms\n  hung_after: 3s\n"
                                 f"  agent_listen: {address}:{agent_port}\n  stop_drain: 6s\n")
        d.agent_port = agent_port
        d.start()
        hosts.append(d)
    a, b = hosts
    for d in hosts:
        d.wait_pool(lambda g: any(w["state"] == "running" for w in g["workers"]), 30, "a running worker")
    haproxy = HAProxy(tmp_path, a, b)
    try:
        servers = haproxy.wait(lambda s: all(s[n]["status"] == "UP" and s[n]["agent_status"] == "L7OK"
                                             for n in ("a", "b")), "both hosts up with their agents")
        assert "acme/shop: room" in servers["a"]["last_agt"], servers["a"]  # the agent's own words, in HAProxy

        users = [User(haproxy.port) for _ in range(8)]
        users += [User(haproxy.port, keep_alive=True) for _ in range(4)]  # (one connection each, kept)
        home = {id(u): u.host() for u in users}
        assert set(home.values()) == {"host-a", "host-b"}, home  # spread over both
        assert any(home[id(u)] == "host-a" for u in users if u.conn is not None), home
        for user in users:  # and each stays on its host
            for _ in range(2):
                assert user.host() == home[id(user)]

        # Host A saturated (its only worker busy with work HAProxy never sent): its agent says 0 %.
        busy = [_sleep_on(a.host, a.port, 8000) for _ in range(2)]
        haproxy.wait(lambda s: s["a"]["weight"] == "0", "host a's weight down to 0")
        newcomers = [User(haproxy.port) for _ in range(6)]
        assert [u.host() for u in newcomers] == ["host-b"] * 6
        for thread in busy:
            thread.join(30)
        haproxy.wait(lambda s: int(s["a"]["weight"]) > 0, "host a's weight back")

        # Host A stops: its agent answers drain for 3 s first, while it still serves its own users.
        a.signal(15)
        haproxy.wait(lambda s: s["a"]["status"].startswith("DRAIN"), "host a draining", timeout=5)
        on_a = [u for u in users if home[id(u)] == "host-a"]
        failures = []
        drained = [User(haproxy.port) for _ in range(4)]
        assert [u.host() for u in drained] == ["host-b"] * 4
        assert all(u.host() == "host-a" for u in on_a)  # still served where they are, during the drain
        deadline = time.monotonic() + 20
        while a.process.poll() is None:  # until host a is gone: its users keep asking, none may fail
            assert time.monotonic() < deadline
            for user in on_a:
                status, body = user.get()
                if status != 200:
                    failures.append((status, body[:200]))
            time.sleep(0.05)
        assert a.process.returncode == 0
        for user in [*users, *newcomers, *drained]:  # afterwards: everyone on b, redispatched, nothing failed
            status, body = user.get()
            if status != 200:
                failures.append((status, body[:200]))
            else:
                assert body.split("\n")[0] == "host-b"
        assert failures == []
        assert "stopping: the agent answers drain for 6s first" in a.log_text()
    finally:
        haproxy.stop()


def test_the_readmes_haproxy_snippet_is_valid_haproxy(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("The HAProxy side", 1)[1]
    snippet = section.split("```\n", 2)[1]
    assert "agent-check" in snippet and "cookie SRV insert indirect nocache" in snippet
    config = tmp_path / "readme.cfg"
    config.write_text(snippet + f"\nfrontend web\n    bind 127.0.0.1:{free_port()}\n    default_backend shop\n")
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
