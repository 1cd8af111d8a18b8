"""The state record of systemd's store: two slots, each record with its digest; a torn record is told from a whole
one, and the reader takes the newest whole one (the table), then the same through a real memfd."""

from __future__ import annotations

import os

import pytest

from elasticd.crash.record import HEADER_SIZE, MAX_BODY, SLOT_A, SLOT_B, choose, frame, parse_header, slot_for
from elasticd.crash.stored_state import StoredState


def slot(sequence: int, body: bytes, *, cut: int = 0, flip: bool = False):
    record = frame(sequence, body)
    header = parse_header(record)
    read = record[HEADER_SIZE:len(record) - cut]
    if flip:
        read = bytes([read[0] ^ 1]) + read[1:]
    return header, read


@pytest.mark.parametrize(("slots", "body", "sequence", "seen"), [
    ({"A": (None, None), "B": (None, None)}, None, 0, ("slot A: empty", "slot B: empty")),
    ({"A": slot(2, b"two"), "B": slot(1, b"one")}, b"two", 2,
     ("slot A: sequence 2, taken", "slot B: sequence 1, older")),
    ({"A": slot(2, b"two"), "B": slot(3, b"three", flip=True)}, b"two", 2,
     ("slot B: sequence 3, torn (its digest differs)", "slot A: sequence 2, taken")),
    ({"A": slot(4, b"four", cut=1), "B": slot(3, b"three")}, b"three", 3,
     ("slot A: sequence 4, torn (its body is shorter than its header says)", "slot B: sequence 3, taken")),
    ({"A": slot(4, b"four", cut=1), "B": slot(3, b"three", flip=True)}, None, 0,
     ("slot A: sequence 4, torn (its body is shorter than its header says)",
      "slot B: sequence 3, torn (its digest differs)")),
    ({"A": (None, None), "B": slot(1, b"")}, b"", 1, ("slot B: sequence 1, taken", "slot A: empty")),
])
def test_the_newest_whole_record_is_taken(slots, body, sequence, seen):
    chosen = choose(slots)
    assert (chosen.body, chosen.sequence, chosen.seen) == (body, sequence, seen)


def test_records_alternate_and_a_header_of_zeros_or_another_layout_is_no_record():
    assert [slot_for(n) for n in (1, 2, 3, 4)] == [SLOT_B, SLOT_A, SLOT_B, SLOT_A]
    assert parse_header(bytes(HEADER_SIZE)) is None
    assert parse_header(b"elasticd-state/9" + bytes(HEADER_SIZE - 16)) is None
    assert parse_header(frame(1, b"x")[:HEADER_SIZE - 1]) is None
    with pytest.raises(ValueError, match="over the store's"):
        frame(1, bytes(MAX_BODY + 1))


def test_a_memfd_keeps_the_newest_whole_record_through_a_torn_write():
    state = StoredState.made()
    try:
        assert state.read().body is None  # a new memfd: nothing to take, and nothing refused
        for n in range(1, 5):
            state.write(b'{"n": %d}' % n)
        assert state.sequence == 4
        # The next instance gets a descriptor of the same memfd from the store.
        again = StoredState(os.dup(state.fd))
        chosen = again.read()
        assert (chosen.body, chosen.sequence) == (b'{"n": 4}', 4)
        again.write(b'{"n": 5}')  # (into slot B, over record 3)
        # A crash in the middle of record 6 (slot A, over record 4): its header written, its body not whole.
        torn = frame(6, b'{"n": 6, "users": []}')
        os.pwrite(state.fd, torn[:HEADER_SIZE + 5], SLOT_A)
        chosen = StoredState(os.dup(state.fd)).read()
        assert (chosen.body, chosen.sequence) == (b'{"n": 5}', 5)
        assert chosen.seen[0] == "slot A: sequence 6, torn (its digest differs)"
        again.close()
        # A reader after that writes past the torn sequence, and not over record 5, the only whole one: record 8
        # (slot A), not 7 (slot B).
        reader = StoredState(os.dup(state.fd))
        reader.read()
        reader.write(b'{"n": 8}')
        assert reader.sequence == 8
        chosen = StoredState(os.dup(state.fd)).read()
        assert (chosen.body, chosen.seen) == (b'{"n": 8}', ("slot A: sequence 8, taken", "slot B: sequence 5, older"))
        reader.close()
        # The memfd is sparse: slot B's offset costs no memory (what is allocated is about the records' size).
        assert os.fstat(state.fd).st_blocks * 512 < 1 << 20
    finally:
        state.close()
