"""elasticctl's client of the admin API: one request per call, on the Unix socket, and the one way a command
says a refusal (``CommandRefused``: main prints it and exits 1)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

__all__ = ["DEFAULT_SOCKET", "AdminClient", "ApiError", "CommandRefused", "error_of"]

DEFAULT_SOCKET = "/run/elasticd/admin.sock"


class ApiError(Exception):
    """elasticd could not be asked (no socket, no answer): printed as "elasticctl: …"."""


class CommandRefused(Exception):
    """elasticd answered, and not with what the command wanted: printed as "<what>: <why>"."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")
        self.what = what
        self.why = why


class AdminClient:
    """One request per call: elasticctl is short-lived, so no session outlives a command."""

    __slots__ = ("socket_path", "timeout")

    def __init__(self, socket_path: str, timeout: float = 120.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    async def request(self, method: str, path: str, body: Any = None, *, data: bytes | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """``body`` is sent as JSON; ``data`` as it is (with its Content-Type in ``headers``)."""
        connector = aiohttp.UnixConnector(path=self.socket_path)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        sent: dict[str, Any] = {"data": data, "headers": headers} if data is not None else {"json": body}
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
                    session.request(method, f"http://elasticd{path}", **sent) as response:
                try:
                    answer = await response.json(content_type=None)
                except (json.JSONDecodeError, aiohttp.ContentTypeError):
                    answer = {"error": (await response.text()).strip()}
                return response.status, answer
        except aiohttp.ClientConnectorError as exc:
            # aiohttp's own text ("Cannot connect to unix socket … ssl:default [Errno 2] …") says more about aiohttp
            # than about elasticd: the OS's reason, and what to do about it.
            reason = exc.os_error.strerror or str(exc.os_error)
            raise ApiError(f"cannot reach elasticd on {self.socket_path}: {reason} ({_hint(exc.os_error)})") from None
        except (aiohttp.ClientConnectionError, FileNotFoundError, PermissionError) as exc:
            raise ApiError(f"cannot reach elasticd on {self.socket_path}: {exc}") from None
        except TimeoutError:
            raise ApiError(f"elasticd on {self.socket_path} did not answer within {self.timeout:g}s") from None

    async def expect(self, method: str, path: str, what: str, body: Any = None) -> Any:
        """The answer's JSON when elasticd says 200; else CommandRefused(what, its error)."""
        code, data = await self.request(method, path, body)
        if code != 200:
            raise CommandRefused(what, error_of(data, code))
        return data


def error_of(data: Any, code: int) -> str:
    """What elasticd said went wrong: its ``error``, or the HTTP status when it said nothing."""
    return str(data.get("error") or f"HTTP {code}") if isinstance(data, dict) else f"HTTP {code}"


def _hint(error: OSError) -> str:
    if isinstance(error, PermissionError):
        return "the socket is root's, or server.admin_group's: run as root or as a member"
    return "is elasticd running? --socket PATH or $ELASTIC_ADMIN_SOCKET names another socket"

