from __future__ import annotations

import logging
import os
import socket

import pytest

from elasticd.systemd import Notifier, _JournalFormatter, notify_address, watchdog_interval


@pytest.mark.parametrize(("env", "pid", "expected"), [
    ({}, 100, None),
    ({"WATCHDOG_USEC": "30000000"}, 100, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "100"}, 100, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "101"}, 100, None),  # meant for another process
    ({"WATCHDOG_USEC": "0"}, 100, None),
    ({"WATCHDOG_USEC": "soon"}, 100, None),
])
def test_watchdog_interval_is_half_of_watchdog_usec(env, pid, expected):
    assert watchdog_interval(env, pid) == expected


@pytest.mark.parametrize(("level", "prefix"), [
    (logging.ERROR, "<3>"), (logging.WARNING, "<4>"), (logging.INFO, "<6>"), (logging.DEBUG, "<7>"),
])
def test_journal_lines_carry_priorities_and_no_timestamps(level, prefix):
    record = logging.LogRecord("elasticd", level, __file__, 1, "first\nsecond", (), None)
    text = _JournalFormatter("%(name)s: %(message)s").format(record)
    assert text == f"{prefix}elasticd: first\n{prefix}second"


def test_notifier_sends_datagrams_and_is_silent_without_socket(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    Notifier.send("READY=1")  # no socket: a no-op, no error
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    notifier = Notifier()
    notifier.reloading()
    message = sock.recv(4096).decode()
    assert "RELOADING=1" in message and "MONOTONIC_USEC=" in message
    usec = int(message.split("MONOTONIC_USEC=")[1].split()[0])
    assert abs(usec / 1e6 - _monotonic()) < 60
    notifier.ready("2 groups")
    assert sock.recv(4096).decode().splitlines() == ["READY=1", "STATUS=2 groups"]
    sock.close()
    assert os.environ["NOTIFY_SOCKET"] == str(path)  # not unset: later notifications still go out


def _monotonic() -> float:
    import time
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@pytest.mark.parametrize(("value", "address"), [
    (None, None), ("", None), ("/run/systemd/notify", "/run/systemd/notify"), ("@abstract", "\0abstract"),
    ("vsock:2:9999", None),  # not a Unix socket: nothing is sent
])
def test_notify_address(value, address):
    assert notify_address(value) == address


async def test_a_notify_socket_nobody_reads_never_blocks_and_nothing_that_matters_is_lost(tmp_path, monkeypatch):
    """libsystemd's sd_notify blocks once the receiver's queue is full (10 datagrams by default), and pystemd
    holds the GIL meanwhile: the daemon froze there. Here the sends return at once; the latest STATUS and every
    READY/RELOADING/STOPPING reach the reader, in order, once it reads."""
    import asyncio
    import time

    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    notifier = Notifier()
    started = time.monotonic()
    for i in range(200):
        notifier.status(f"step {i}")
    notifier.ready("up")
    for i in range(200, 400):
        notifier.status(f"step {i}")
    notifier.stopping()
    assert time.monotonic() - started < 1.0  # nothing blocked
    assert 0 < Notifier.pending() <= 4  # superseded STATUS messages were dropped, not queued
    received = []
    sock.setblocking(False)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (not received or received[-1] != "STOPPING=1"):
        try:
            received.append(sock.recv(4096).decode())
        except BlockingIOError:
            await asyncio.sleep(0.01)
    sock.close()
    assert received[-1] == "STOPPING=1" and Notifier.pending() == 0
    ready = received.index("READY=1\nSTATUS=up")
    assert "STATUS=step 399" in received[ready + 1:]  # the latest status after READY arrived
    assert len(received) < 30  # 400 statuses were not all queued


async def test_a_full_queue_arms_one_retry_timer_not_one_per_send(tmp_path, monkeypatch):
    from elasticd import systemd

    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    timers = []
    real = systemd._Datagrams._schedule

    def counting(self):
        armed = self.timer is not None
        real(self)
        if not armed and self.timer is not None:
            timers.append(self.timer)

    monkeypatch.setattr(systemd._Datagrams, "_schedule", counting)
    notifier = Notifier()
    for i in range(300):
        notifier.status(f"{i}")
    live = [t for t in timers if not t.cancelled()]
    assert len(live) == 1  # one retry armed, however many sends found the queue full
    sock.close()
    systemd._datagrams.pending.clear()
