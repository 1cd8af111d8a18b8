"""Basic auth for the monitor page (``server.monitor: {user, password_file}``): it shows user names.

The password is the first line of ``password_file`` (a file only root should read: elasticd says so when
others can). It is read when elasticd starts and at each reload, so a new password takes effect with
``systemctl reload elasticd``; a file that cannot be read refuses the start or the reload (the running
credentials stay), with the key and the reason. Checking a request's ``Authorization`` header is pure.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import stat
from dataclasses import dataclass

from elasticd.config.model import MonitorAuth

__all__ = ["CHALLENGE", "Credentials", "authorized", "read_credentials"]

log = logging.getLogger("elasticd.monitor")

CHALLENGE = 'Basic realm="elasticd monitor", charset="UTF-8"'


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never a password in a log line or a traceback
        return f"Credentials(user={self.user!r}, password=<hidden>)"


def read_credentials(settings: MonitorAuth | None) -> Credentials | None:
    """The credentials ``server.monitor`` names (None: no auth). ValueError names the key and what is wrong."""
    if settings is None:
        return None
    path = settings.password_file
    try:
        with open(path, encoding="utf-8") as f:
            password = f.readline().rstrip("\r\n")
            mode = os.fstat(f.fileno()).st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"server.monitor.password_file: cannot read {path}: {exc}") from None
    if not password:
        raise ValueError(f"server.monitor.password_file: {path} is empty (its first line is the password)")
    if mode & stat.S_IROTH:
        log.warning("server.monitor.password_file: %s can be read by every user of this host (chmod 600 it)", path)
    return Credentials(settings.user, password)


def authorized(header: str | None, credentials: Credentials | None) -> bool:
    """Whether an ``Authorization`` header value carries these credentials (always, without credentials)."""
    if credentials is None:
        return True
    if header is None:
        return False
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(encoded.strip().encode("ascii"), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeError):  # not base64, not ASCII (a header's bytes are the client's), not UTF-8
        return False
    user, sep, password = decoded.partition(":")
    # Both compared, in constant time, whatever the first one gave: the answer's timing says nothing.
    user_ok = hmac.compare_digest(user.encode(), credentials.user.encode())
    password_ok = hmac.compare_digest(password.encode(), credentials.password.encode())
    return bool(sep) and user_ok and password_ok
