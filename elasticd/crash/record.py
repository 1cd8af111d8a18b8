"""The running state as it lies in systemd's file-descriptor store for the next instance after a crash (pure: bytes in,
bytes out; the memfd and the store are ``keeping``'s).

One memfd (``FDNAME=state``) holds two slots, and each write goes to the slot the newest whole record is not in: a
crash in the middle of a write (SIGKILL, the OOM killer, a watchdog abort: a write is not atomic against any of
them) tears only the record being written, and the other slot still holds the one before it, whole. Each record
is a header and a body (``upgrade.state``'s document): the header has a magic, the record's sequence number, the
body's length and its BLAKE2b digest, so a reader tells a torn record (a digest that differs, a length past the
end) from a whole one, and takes the whole one with the highest sequence. Slot B lies at ``SLOT_B`` (1 GiB): a
memfd is sparse, so the gap costs no memory, and a body may grow to ``MAX_BODY`` without the slots ever meeting.

Why not a new memfd per write: the store keeps every descriptor sent under a name, and removing by name removes them
all; a crash between sending the new one and removing the old would leave two, and the unit's
``FileDescriptorStoreMax`` is shared with the listening sockets. One descriptor, sent once, rewritten in place.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Final

__all__ = ["HEADER_SIZE", "MAX_BODY", "SLOT_A", "SLOT_B", "Chosen", "Header", "choose", "frame", "parse_header",
           "slot_for"]

MAGIC: Final = b"elasticd-state/1"  # 16 bytes: the layout's version too
_HEADER: Final = struct.Struct("<16sQQ32s")  # magic, sequence, body length, BLAKE2b-256 of the body
HEADER_SIZE: Final = _HEADER.size
SLOT_A: Final = 0
SLOT_B: Final = 1 << 30
MAX_BODY: Final = SLOT_B - HEADER_SIZE


@dataclass(frozen=True, slots=True)
class Header:
    sequence: int
    length: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class Chosen:
    """What a reader takes: the body of the newest whole record (None: none is whole), and what it saw, for the
    journal ("slot B: sequence 41, torn (its digest differs); slot A: sequence 40, taken")."""

    body: bytes | None
    sequence: int
    seen: tuple[str, ...]
    torn: bool = False  # a slot held a record that is not whole (a crash in the middle of its write)


def _digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=32).digest()


def frame(sequence: int, body: bytes) -> bytes:
    """A record: its header, then the body. ValueError when the body is over ``MAX_BODY``."""
    if len(body) > MAX_BODY:
        raise ValueError(f"a state of {len(body)} bytes is over the store's {MAX_BODY}")
    return _HEADER.pack(MAGIC, sequence, len(body), _digest(body)) + body


def slot_for(sequence: int) -> int:
    """Where record ``sequence`` is written: slots alternate, so the one before it is never overwritten by it."""
    return SLOT_B if sequence % 2 else SLOT_A


def parse_header(raw: bytes) -> Header | None:
    """A slot's header, or None when the slot holds none (never written: zeros; or not a record of this layout)."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, sequence, length, digest = _HEADER.unpack_from(raw)
    if magic != MAGIC or sequence == 0:
        return None
    return Header(sequence, length, digest)


def choose(slots: dict[str, tuple[Header | None, bytes | None]]) -> Chosen:
    """``slots``: name → (its header, the body bytes read for it; None when not read). The whole record with the
    highest sequence wins; a header whose body is short or whose digest differs is torn."""
    seen = []
    torn = False
    best: tuple[int, bytes] | None = None
    for name, (header, body) in sorted(slots.items(), key=lambda item: -(item[1][0].sequence if item[1][0] else 0)):
        if header is None:
            seen.append(f"slot {name}: empty")
            continue
        if header.length > MAX_BODY or body is None or len(body) != header.length:
            torn = True
            seen.append(f"slot {name}: sequence {header.sequence}, torn (its body is shorter than its header says)")
        elif _digest(body) != header.digest:
            torn = True
            seen.append(f"slot {name}: sequence {header.sequence}, torn (its digest differs)")
        elif best is None:
            best = (header.sequence, body)
            seen.append(f"slot {name}: sequence {header.sequence}, taken")
        else:
            seen.append(f"slot {name}: sequence {header.sequence}, older")
    if best is None:
        return Chosen(None, 0, tuple(seen), torn)
    return Chosen(best[1], best[0], tuple(seen), torn)
