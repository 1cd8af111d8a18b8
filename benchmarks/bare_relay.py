"""The floor under any asyncio front: a relay that parses nothing, routes nothing and counts nothing.

    .venv/bin/python benchmarks/front_bench.py --uvloop \
        --front-command ".venv/bin/python benchmarks/bare_relay.py {port} {socket}"

Each client connection gets its own connection to the worker's Unix socket, opened as the client connects;
bytes are copied both ways as they come (one write per read on each side). It is what the front would cost
if HTTP, quotas, stickiness and the counters were free: the event loop, the transports and the syscalls.
Measured beside nginx in one run of front_bench.py, it says how much of the front's CPU per request is
Python of ours and how much no asyncio relay can lose. Loopback only; stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys


class _WorkerSide(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _ClientSide(asyncio.Protocol):
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.worker: asyncio.Transport | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        worker, _ = await loop.create_unix_connection(lambda: _WorkerSide(self.transport), self.socket_path)
        self.worker = worker
        for data in self.early:
            worker.write(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.worker is not None:
            self.worker.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.worker is not None:
            self.worker.close()


async def _main(port: int, socket_path: str) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _ClientSide(socket_path), "127.0.0.1", port, backlog=1024)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    import uvloop

    uvloop.install()
    asyncio.run(_main(int(sys.argv[1]), sys.argv[2]))
