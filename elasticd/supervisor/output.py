"""How much of a worker's output elasticd relays, when it must relay it (no journald: a terminal, ./dev run,
tests): a rate bound per worker, so that a worker writing flat out costs elasticd next to nothing.

Under journald none of this runs: each worker writes to a journald stream of its own (spawn.py, systemd-cat)
and elasticd never touches those bytes.

Pure: the time is a parameter, nothing here reads a clock or a file. ``OutputBound`` decides how long to pause
reading after each read (reads are spaced, and bounded in bytes a second: meanwhile the pipe fills and the
kernel blocks the writer, which is the tenant's own problem), how many of the lines read may be logged now (the
rest are dropped, counted) and when to say how many were dropped (one note line, never one per line).
``LineSplitter`` cuts what was read into lines, splitting no further than the lines that will be logged.
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["BYTES_PER_SECOND", "BYTE_BURST", "LINES_PER_SECOND", "LINE_BURST", "MAX_LINE", "NOTE_INTERVAL",
           "READ_CHUNK", "READ_INTERVAL", "Admitted", "LineSplitter", "OutputBound"]

# Lines logged per second per worker, sustained, and the burst above it: a chatty worker (an access log line
# per request, a startup banner, a traceback of a few hundred lines, a crash loop's restarts) is relayed whole;
# one that prints flat out is not — at 100 lines a second elasticd's own log, and its neighbours' lines in it,
# stay readable, and logging them costs the daemon a few milliseconds a second.
LINES_PER_SECOND: Final = 100.0
LINE_BURST: Final = 1000

# Bytes read per second per worker, sustained, and the burst: more than any worker's legitimate logging, and a
# cost (copying and counting newlines) the daemon does not notice. Beyond it elasticd stops reading; the pipe
# fills and the worker's writes block.
BYTES_PER_SECOND: Final = 1024.0 * 1024
BYTE_BURST: Final = 1024 * 1024

# The shortest pause between two reads of one worker's pipe: at most 20 wake-ups a second per worker, however
# small its writes (a worker writing one byte at a time would otherwise wake the event loop per write). What it
# writes meanwhile waits in the pipe (64 KiB on Linux); output is at most this late.
READ_INTERVAL: Final = 0.05

# The most read at once, and the longest line logged as one: a longer one is logged in pieces rather than
# buffered without end.
READ_CHUNK: Final = 65536
MAX_LINE: Final = 65536

# While lines are being dropped, a note says how many at least this often; it comes at once when the worker's
# rate falls back under the bound.
NOTE_INTERVAL: Final = 5.0


class Admitted(NamedTuple):
    """What to do with the complete lines of one read."""

    lines: int  # how many of them, the first ones, to log
    suppressed_before: int  # lines dropped earlier, to note before logging them (0: no note now)


class _Bucket:
    """``rate`` tokens a second, at most ``burst`` held. Spending may overdraw it: the debt is repaid at the rate."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = now

    def refill(self, now: float) -> None:
        if now > self.updated:  # (a clock that went back refills nothing)
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now


class OutputBound:
    """One worker's relay budget, kept across its restarts (a crash loop does not get a fresh burst each time)."""

    __slots__ = ("_bytes", "_lines", "_note_interval", "_read_interval", "_since", "_suppressed")

    def __init__(self, now: float, *, lines_per_second: float = LINES_PER_SECOND, line_burst: int = LINE_BURST,
                 bytes_per_second: float = BYTES_PER_SECOND, byte_burst: int = BYTE_BURST,
                 read_interval: float = READ_INTERVAL, note_interval: float = NOTE_INTERVAL) -> None:
        self._lines = _Bucket(lines_per_second, line_burst, now)
        self._bytes = _Bucket(bytes_per_second, byte_burst, now)
        self._read_interval = read_interval
        self._note_interval = note_interval
        self._suppressed = 0  # lines dropped and not yet noted
        self._since = now  # when the drops now counted began, or the last note

    @property
    def suppressed(self) -> int:
        return self._suppressed

    def pause_after_read(self, nbytes: int, now: float) -> float:
        """``nbytes`` were just read: the seconds to wait before reading again."""
        spent = self._bytes
        spent.refill(now)
        spent.tokens -= nbytes
        debt = -spent.tokens / spent.rate if spent.tokens < 0 else 0.0
        return max(self._read_interval, debt)

    def admit(self, lines: int, now: float) -> Admitted:
        """``lines`` complete lines were just read: log the first ``lines`` of the answer, drop the rest.

        The note of earlier drops comes before them when all of these fit (the worker's rate fell back under the
        bound), or every ``note_interval`` while the drops go on: so a note always counts lines that came before
        the ones logged after it."""
        bucket = self._lines
        bucket.refill(now)
        note = 0
        if self._suppressed and ((0 < lines <= bucket.tokens) or now - self._since >= self._note_interval):
            note, self._suppressed, self._since = self._suppressed, 0, now
        logged = min(lines, int(bucket.tokens))
        bucket.tokens -= logged
        dropped = lines - logged
        if dropped:
            if not self._suppressed:
                self._since = now  # a new run of drops: its first note at most note_interval from now
            self._suppressed += dropped
        return Admitted(logged, note)

    def note_due_in(self, now: float) -> float | None:
        """Seconds until the dropped lines must be noted even if the worker writes nothing more (None: nothing
        to note). The reader waits for output no longer than this, then calls ``flush``."""
        if not self._suppressed:
            return None
        return max(0.0, self._since + self._note_interval - now)

    def flush(self, now: float) -> int:
        """The lines dropped and not yet noted, to note now (the worker went quiet, or its output ended)."""
        dropped, self._suppressed, self._since = self._suppressed, 0, now
        return dropped


class LineSplitter:
    """Bytes read → complete lines, without their newlines. A line longer than ``max_line`` is cut: logged in
    pieces rather than buffered without end."""

    __slots__ = ("_max_line", "_pending")

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._max_line = max_line
        self._pending = b""

    def feed(self, chunk: bytes) -> tuple[bytes, int]:
        """The complete lines so far, joined by newlines, and how many there are. Split them only as far as
        needed (``block.split(b"\\n", n)[:n]``): counting the lines of a flood costs far less than splitting it."""
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(b"\n")
        if end < 0:
            block, count, rest = b"", 0, data
        else:
            block, count, rest = data[:end], data.count(b"\n", 0, end) + 1, data[end + 1:]
        if len(rest) > self._max_line:
            block, count, rest = (block + b"\n" + rest if count else rest), count + 1, b""
        self._pending = rest
        return block, count

    def rest(self) -> bytes:
        """What is left after the last newline (the output ended in the middle of a line)."""
        rest, self._pending = self._pending, b""
        return rest
