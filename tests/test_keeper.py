"""The keeper, a real process (``python -m elasticd.keeper``) on a real socket: it spawns what it is asked, tells each
exit with its status, keeps its children and their output pipes while nobody is connected and lists them to the
next connection, refuses what it cannot run or read, and stops its children when no elasticd came back within its
bound, or when told to stop."""

from __future__ import annotations

import array
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENV = {"PATH": os.environ["PATH"]}


class Link:
    """elasticd's side of the wire, synchronous, for the test."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(10)
        self.sock.connect(str(path))

    def send(self, message: dict, fds: list[int] | None = None) -> None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.sock.sendmsg([json.dumps(message).encode()], ancillary)

    def receive(self) -> tuple[dict, list[int]]:
        data, ancdata, _, _ = self.sock.recvmsg(1 << 18, socket.CMSG_SPACE(16))
        fds = array.array("i")
        for _, _, payload in ancdata:
            fds.frombytes(payload)
        return (json.loads(data) if data else {}), list(fds)

    def until(self, op: str) -> tuple[dict, list[int]]:
        while True:
            message, fds = self.receive()
            assert message, f"the keeper closed the connection before {op}"
            if message["op"] == op:
                return message, fds
            for fd in fds:
                os.close(fd)

    def spawn(self, argv: list[str], label: str, *, seq: int = 1) -> tuple[dict, int]:
        """Spawned with its output to a pipe whose read end the keeper holds too: (the answer, our read end)."""
        read_end, write_end = os.pipe()
        with open(os.devnull, "rb") as devnull:
            self.send({"op": "spawn", "seq": seq, "argv": argv, "env": {"PATH": os.environ["PATH"]}, "cwd": "/",
                       "label": label, "hold": True}, [devnull.fileno(), write_end, write_end, read_end])
        os.close(write_end)
        answer, _ = self.receive()
        return answer, read_end

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def keeper(tmp_path):
    started = []

    def start(*extra: str) -> tuple[subprocess.Popen, Path]:
        path = tmp_path / "keeper" / "keeper.sock"
        process = subprocess.Popen([sys.executable, "-m", "elasticd.keeper", "--socket", str(path), *extra],
                                   env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
        started.append(process)
        deadline = time.monotonic() + 10
        while not path.exists():
            assert time.monotonic() < deadline and process.poll() is None, "the keeper did not listen"
            time.sleep(0.02)
        return process, path

    yield start
    for process in started:  # SIGTERM first: the keeper stops its children (a test that failed leaves some)
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_child_is_spawned_and_its_exit_status_and_output_come_back(keeper):
    process, path = keeper()
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    link = Link(path)
    answer, output = link.spawn(["sh", "-c", "echo hello from $$; exit 3"], "acme.shop.green.1")
    assert answer["op"] == "spawned" and answer["seq"] == 1 and answer["pid"] > 0
    exited, _ = link.until("exited")
    assert exited == {"op": "exited", "pid": answer["pid"], "code": 3}
    assert os.read(output, 100) == f"hello from {answer['pid']}\n".encode()  # the child ran as itself: sh's $$
    os.close(output)
    _, output = link.spawn(["sh", "-c", "kill -9 $$"], "acme.shop.green.2", seq=2)
    assert link.until("exited")[0]["code"] == -9  # a signal, as subprocess writes it
    os.close(output)
    # Nothing of the keeper's reaches a child: no listening socket, no connection, no other child's pipe.
    _, output = link.spawn(["sh", "-c", "exec ls /proc/self/fd"], "acme.shop.green.4", seq=4)
    link.until("exited")
    assert os.read(output, 100).split() == [b"0", b"1", b"2", b"3"]  # (3: ls's own listing of the directory)
    os.close(output)
    refused, output = link.spawn(["/nonexistent/program"], "acme.shop.green.3", seq=3)
    assert refused["op"] == "refused" and refused["seq"] == 3 and "No such file or directory" in refused["error"]
    os.close(output)
    link.send({"op": "stop"})
    assert process.wait(10) == 0


def test_children_and_their_pipes_outlive_the_connection_and_are_listed_to_the_next(keeper):
    process, path = keeper("--orphan-bound", "30")
    link = Link(path)
    # A worker that writes every 50 ms: while nobody reads, its pipe would break (SIGPIPE) without the held end.
    answer, output = link.spawn(["sh", "-c", "while :; do echo tick; sleep 0.05; done"], "acme.shop.green.1")
    ended, stale = link.spawn(["sh", "-c", "exit 7"], "acme.shop.green.2", seq=2)
    os.close(stale)
    assert link.until("exited")[0] == {"op": "exited", "pid": ended["pid"], "code": 7}
    os.close(output)
    link.close()  # elasticd dies: its connection and its read ends go with it
    time.sleep(1.0)
    assert alive(answer["pid"])
    again = Link(path)
    again.send({"op": "hello"})
    rows = []
    while True:
        message, fds = again.receive()
        if message["op"] == "ready":
            break
        rows.append((message, fds))
    assert message["pid"] == process.pid and message["base"] is None
    (live, live_fds), (gone, gone_fds) = rows
    assert live == {"op": "child", "pid": answer["pid"], "label": "acme.shop.green.1", "started": answer["started"],
                    "code": None, "output": True}
    assert gone == {"op": "child", "pid": ended["pid"], "label": "acme.shop.green.2", "started": ended["started"],
                    "code": 7, "output": True}
    assert b"tick\n" in os.read(live_fds[0], 4096)  # what it wrote while elasticd was away waited in its pipe
    again.send({"op": "forget", "pid": ended["pid"]})
    for fd in live_fds + gone_fds:
        os.close(fd)
    # A newer connection replaces the older (the older elasticd is gone or re-executed itself).
    newer = Link(path)
    newer.send({"op": "hello"})
    labels = []
    while (message := newer.receive())[0]["op"] != "ready":
        labels.append(message[0]["label"])
        for fd in message[1]:
            os.close(fd)
    assert labels == ["acme.shop.green.1"]  # the ended one was forgotten
    assert again.receive()[0] == {}  # closed by the keeper
    newer.send({"op": "stop"})
    assert process.wait(15) == 0
    assert not alive(answer["pid"])


def test_what_the_keeper_cannot_take_ends_that_connection_only(keeper):
    process, path = keeper()
    for bad in (b"not json", b'{"no": "op"}', b'{"op": "spawn", "argv": "sh"}', b'{"op": "launch"}'):
        link = Link(path)
        link.sock.sendmsg([bad])
        assert link.receive()[0] == {}, bad  # closed
        link.close()
    link = Link(path)  # and the keeper serves on
    link.send({"op": "hello"})
    assert link.until("ready")[0]["pid"] == process.pid
    assert "elasticd sent what the keeper cannot take (spawn: argv is not a list)" in _stop(process, link)


def test_orphans_are_stopped_when_no_elasticd_comes_back_within_the_bound(keeper):
    process, path = keeper("--orphan-bound", "1.5")
    link = Link(path)
    answer, output = link.spawn(["sleep", "60"], "acme.shop.green.1")
    link.close()
    os.close(output)
    began = time.monotonic()
    assert process.wait(15) == 0
    assert 1.4 < time.monotonic() - began < 12
    assert not alive(answer["pid"])
    assert "no elasticd came back within 1.5s: stopping its 1 workers" in process.stderr.read()


def _stop(process: subprocess.Popen, link: Link) -> str:
    link.send({"op": "stop"})
    assert process.wait(10) == 0
    return process.stderr.read()


def test_elasticds_link_spawns_watches_and_adopts_through_the_keeper(keeper):
    from elasticd.keeper.link import KeeperLink

    process, path = keeper("--orphan-bound", "30")

    async def first() -> tuple[int, int]:
        link, rows = await KeeperLink.connect(str(path))
        assert rows == [] and link.keeper_pid == process.pid and link.base is None
        read_end, write_end = os.pipe()
        with open(os.devnull, "rb") as devnull:
            quick = await link.spawn(["true"], ENV, "/", "acme.shop.green.1", (devnull.fileno(), write_end, write_end))
            assert await asyncio.wait_for(quick.wait(), 10) == 0  # (its exit may come before spawn() returns)
            kept = await link.spawn(["sh", "-c", "echo up; exec sleep 60"], ENV, "/", "acme.shop.green.2",
                                    (devnull.fileno(), write_end, write_end), hold=read_end)
        os.close(write_end)
        assert os.read(read_end, 10) == b"up\n"
        os.close(read_end)
        with pytest.raises(OSError, match=r"the keeper could not start it: .*No such file"):
            await link.spawn(["/nonexistent"], ENV, "/", "acme.shop.green.3", (0, 1, 2))
        # As a crash would: the connection goes with the process, and nothing is said (close() would stop the children
        # it watches, as a clean end does).
        asyncio.get_running_loop().remove_reader(link._sock.fileno())
        link._sock.close()
        return kept.pid, process.pid

    pid, _ = asyncio.run(first())
    assert alive(pid)

    async def second() -> int:
        link, rows = await KeeperLink.connect(str(path))
        (row,) = rows
        assert (row.pid, row.label, row.code) == (pid, "acme.shop.green.2", None) and row.output is not None
        os.close(row.output)
        adopted = link.watch(row.pid, row.started)
        adopted.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(adopted.wait(), 10)
        link.stop()
        return code

    assert asyncio.run(second()) == -signal.SIGTERM  # the status, read by the keeper, its parent
    assert process.wait(10) == 0


def test_under_socket_activation_the_keeper_takes_systemds_socket_and_a_waiting_connect_is_answered(tmp_path):
    """elasticd-keeper.socket: systemd listens, elasticd's connect waits in the backlog while the keeper starts, and
    the keeper takes the socket as descriptor 3 (LISTEN_PID/LISTEN_FDS) rather than binding its own; it leaves the
    file in place (systemd's)."""
    path = tmp_path / "run" / "keeper.sock"
    path.parent.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen(4)
    inode = path.stat().st_ino
    link = Link(path)  # (before any keeper runs: it waits in the backlog, as under systemd)
    # sd_listen_fds(3) wants LISTEN_PID to be the keeper's own pid: a shell sets it to its own, then execs.
    launcher = ('import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ["LISTEN_PID"] = str(os.getpid()); '
                'os.environ["LISTEN_FDS"] = "1"; os.environ["LISTEN_FDNAMES"] = "keeper.sock"; '
                'os.execv(sys.executable, [sys.executable, "-m", "elasticd.keeper", *sys.argv[2:]])')
    process = subprocess.Popen([sys.executable, "-c", launcher, str(listener.fileno()), "--socket", str(path)],
                               pass_fds=[listener.fileno()], env={**os.environ, "PYTHONPATH": str(REPO)},
                               stderr=subprocess.PIPE, text=True)
    listener.close()
    try:
        link.send({"op": "hello"})
        ready, _ = link.until("ready")
        assert ready["pid"] == process.pid
        answer, output = link.spawn(["sh", "-c", "echo spawned"], "a.b.c.1")
        assert answer["op"] == "spawned"
        assert os.read(output, 100) == b"spawned\n"
        os.close(output)
        assert path.stat().st_ino == inode  # (not unlinked and bound anew)
        assert "listening on" in _stop(process, link)
    finally:
        link.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)
