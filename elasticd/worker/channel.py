"""TRANSPORT, the worker side: announce on ``ELASTIC_CHANNEL`` and push the report every interval.

Newline-delimited JSON over the Unix socket: one object per line, easy to read in any language and to
refuse line by line. If elasticd is not there (restarting), the client retries with a capped backoff; a
report is never queued for later (an old reading is confidently wrong, a missing one merely imprecise).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ChannelClient"]

log = logging.getLogger("elasticd.worker.channel")

CAPABILITIES = ["occupancy"]


class ChannelClient:
    __slots__ = ("_report", "_task", "interval", "path", "token", "worker_id")

    def __init__(self, report: Callable[[float], dict[str, Any]], *, path: str | None = None,
                 worker_id: str | None = None, token: str | None = None, interval: float | None = None) -> None:
        channel = path or os.environ.get("ELASTIC_CHANNEL", "")
        self.path = channel.removeprefix("unix:")
        self.worker_id = worker_id or os.environ.get("ELASTIC_WORKER_ID", "")
        self.token = token or os.environ.get("ELASTIC_TOKEN", "")
        self.interval = interval or float(os.environ.get("ELASTIC_OCCUPANCY_INTERVAL", "5"))
        self._report = report
        self._task: asyncio.Task[None] | None = None

    @property
    def configured(self) -> bool:
        return bool(self.path and self.worker_id and self.token)

    def start(self) -> None:
        if self.configured and self._task is None:
            self._task = asyncio.create_task(self._run(), name="elastic channel")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                await self._session()
                delay = 0.1
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                log.debug("channel %s: %s; retrying in %.1fs", self.path, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.interval)

    async def _session(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.path)
        try:
            await self._send(writer, {"type": "announce", "worker": self.worker_id, "token": self.token,
                                      "pid": os.getpid(), "capabilities": CAPABILITIES})
            reply = json.loads(await reader.readline() or b"{}")
            if reply.get("type") != "ok":
                raise ValueError(f"announce refused: {reply.get('reason', reply)}")
            listener = asyncio.create_task(self._listen(reader))
            try:
                while not listener.done():
                    await self._send(writer, {"type": "occupancy", "report": self._report(time.monotonic())})
                    await asyncio.wait({listener}, timeout=self.interval)
            finally:
                listener.cancel()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _listen(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            message = json.loads(line)
            if message.get("type") == "error":
                log.warning("elasticd refused a message: %s", message.get("reason"))

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        await writer.drain()
