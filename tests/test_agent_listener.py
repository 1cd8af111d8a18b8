"""The agent-check listener (agent/listener.py) over real TCP on loopback: a check with a hint, with one that has
no newline, with none at all, with garbage; a stop answers drain; a failure of ours is a `down` and is said."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from elasticd.agent.line import AppRoom, GroupRoom
from elasticd.agent.listener import HINT_WAIT, AgentListener
from elasticd.config.model import Address

SHOP = AppRoom("acme/shop", (GroupRoom((0.0,), 1, 2, 0.5, 0.8),))


class Rooms:
    def __init__(self) -> None:
        self.broken = False

    def resolve(self, hint: str) -> AppRoom | None:
        if self.broken:
            raise RuntimeError("a bug")
        return SHOP if hint in ("shop.example", "acme/shop") else None

    def apps(self) -> list[AppRoom]:
        return [SHOP]


async def check(port: int, send: bytes | None) -> tuple[str, float]:
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if send is not None:
        writer.write(send)
        await writer.drain()
    line = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return line.decode(), time.monotonic() - started


@pytest.mark.parametrize(("send", "line", "waits"), [
    (b"shop.example\n", "up ready 100% maxconn:0 #acme/shop: room 1.30 of 1.30\n", False),  # answered at once
    (b"acme/shop", "up ready 100% maxconn:0 #acme/shop: room 1.30 of 1.30\n", True),  # none: once the wait is over
    (None, "up ready 100% #1 app: room 1.30 of 1.30\n", True),  # nothing sent: the whole host
    (b"other.example\n", "down #no app other.example here\n", False),
    (b"\x00\x01garbage\n", "down #a hint that is not one word of printable ASCII\n", False),
    (b"x" * 300, "down #a hint of over 256 bytes\n", False),
])
async def test_one_line_per_check(send, line, waits):
    listener = AgentListener(Address("127.0.0.1", 0), Rooms())  # type: ignore[arg-type]
    await listener.start()
    try:
        assert listener.port is not None
        answer, took = await check(listener.port, send)
        assert answer == line
        assert (took >= HINT_WAIT * 0.9) == waits, took
    finally:
        await listener.stop()


async def test_stopping_answers_drain_and_a_failure_of_ours_is_a_down(caplog):
    rooms = Rooms()
    listener = AgentListener(Address("127.0.0.1", 0), rooms)  # type: ignore[arg-type]
    await listener.start()
    try:
        assert listener.port is not None
        listener.stopping = True
        assert (await check(listener.port, b"shop.example\n"))[0] == "drain #acme/shop: elasticd is stopping\n"
        assert (await check(listener.port, None))[0] == "drain #elasticd is stopping\n"
        listener.stopping = False
        rooms.broken = True
        with caplog.at_level(logging.ERROR, logger="elasticd.agent"):
            assert (await check(listener.port, b"shop.example\n"))[0] == \
                "down #elasticd could not work out its answer\n"
        assert "agent: answering b'shop.example\\n' failed" in caplog.text
        # A checker that connects and leaves at once costs nothing and breaks nothing.
        _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.close()
        rooms.broken = False
        assert (await check(listener.port, b"acme/shop\n"))[0].startswith("up ready 100%")
    finally:
        await listener.stop()
