from __future__ import annotations

import logging
import os
import socket

import pytest

from elasticd.systemd import Notifier, _JournalFormatter, watchdog_interval


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
