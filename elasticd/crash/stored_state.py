"""The memfd that holds the running state in systemd's file-descriptor store (``FDNAME=state``): made, or taken from
the store, at start; read once by the instance that starts after a crash; rewritten as the state changes.

The layout (two slots, each record with its digest) is ``record``'s. This is the shell: the descriptor, ``pread`` and
``pwrite``, and the one message that hands the descriptor to systemd. A write is a single ``pwrite`` of header and
body together into the other slot; its cost is the body's size (about 150 bytes a user, 300 a worker).
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

from elasticd.crash.record import HEADER_SIZE, SLOT_A, SLOT_B, Chosen, choose, frame, parse_header, slot_for

__all__ = ["STORE_NAME", "StoredState"]

STORE_NAME: Final = "state"
_SLOTS: Final = (("A", SLOT_A), ("B", SLOT_B))


class StoredState:
    __slots__ = ("fd", "sequence", "written")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.sequence = 0  # the last record's, written or read
        self.written = 0  # bytes of the last record written

    @classmethod
    def made(cls) -> StoredState:
        """A new, empty memfd (close-on-exec: a re-exec passes the state its own way, a worker never sees it)."""
        return cls(os.memfd_create("elasticd-state", os.MFD_CLOEXEC))

    def read(self) -> Chosen:
        """The newest whole record, and what each slot held. Later writes go past it."""
        size = os.fstat(self.fd).st_size
        slots = {}
        for name, offset in _SLOTS:
            header = parse_header(os.pread(self.fd, HEADER_SIZE, offset)) if size >= offset + HEADER_SIZE else None
            body = None
            if header is not None and offset + HEADER_SIZE + header.length <= size:
                body = _pread_all(self.fd, header.length, offset + HEADER_SIZE)
            slots[name] = (header, body)
        chosen = choose(slots)
        # The next record goes past every sequence seen (a torn one's too), and never into the slot of the record
        # just taken: after a torn write that slot holds the only whole one.
        following = max((header.sequence for header, _ in slots.values() if header is not None), default=0) + 1
        if chosen.body is not None and slot_for(following) == slot_for(chosen.sequence):
            following += 1
        self.sequence = following - 1
        return chosen

    def write(self, body: bytes) -> None:
        """The next record, into the slot the newest is not in (ValueError: over the bound; OSError: memory)."""
        sequence = self.sequence + 1
        record = frame(sequence, body)
        offset = slot_for(sequence)
        done = 0
        while done < len(record):
            done += os.pwrite(self.fd, memoryview(record)[done:], offset + done)
        self.sequence = sequence
        self.written = len(record)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    parts = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 24), offset)
        if not chunk:
            break
        parts.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)
