"""The live move as tables (seed 000, "Moving a live user"): every step, every abort, the book's refusals."""

from __future__ import annotations

import pytest

from elasticd.pool.move_machine import (
    ASK_SNAPSHOT,
    RELEASE,
    REPLACE,
    SEND_INSTALL,
    SWITCH,
    TRANSITIONS,
    Move,
    MoveBook,
    MoveError,
    MoveEvent,
    Outcome,
    Step,
)

A, B, C = "acme.shop.green.2", "acme.shop.green.1", "acme.shop.green.3"


def flagged(*, stateful: bool = True, now: float = 100.0, timeout: float = 10.0) -> Move:
    return Move(1, "alice", A, B, now, timeout, stateful=stateful)


def installing() -> Move:
    move = flagged()
    move.quiesced(100.1)
    move.snapshot(b"x" * 1000, 100.2)
    return move


def test_a_stateful_move_goes_flag_quiesce_snapshot_install_switch():
    move = flagged()
    assert move.step is Step.QUIESCING and move.deadline == 110.0 and not move.over
    assert move.quiesced(100.1) == ASK_SNAPSHOT and move.step is Step.SNAPSHOTTING
    assert move.snapshot(b"x" * 1000, 100.2) == SEND_INSTALL and move.step is Step.INSTALLING
    assert move.sent() == b"x" * 1000 and move.package is None  # handed over, not kept
    assert move.installed(100.3) == SWITCH | RELEASE
    assert move.step is Step.SWITCHED and move.over and move.release_to == B
    summary = move.summary()
    assert (summary.outcome, summary.package_bytes, summary.why) == (Outcome.MOVED, 1000, "")
    assert summary.seconds == pytest.approx(0.3)


def test_a_move_without_the_library_is_re_pointed_after_the_quiesce():
    move = flagged(stateful=False)
    assert move.quiesced(101.0) == SWITCH | RELEASE
    assert move.step is Step.SWITCHED and move.release_to == B
    assert move.summary().package_bytes is None and move.summary().outcome is Outcome.MOVED


@pytest.mark.parametrize(("reach", "event", "outcome", "effects", "release_to"), [
    # (how far the move got, what happened, what it is called, the effects, where the held requests go)
    ("quiescing", "timeout", Outcome.QUIESCE_TIMEOUT, RELEASE, A),
    ("snapshotting", "timeout", Outcome.SOURCE_TIMEOUT, RELEASE, A),
    ("installing", "timeout", Outcome.TARGET_TIMEOUT, RELEASE, A),
    ("snapshotting", "refused", Outcome.SOURCE_REFUSED, RELEASE, A),
    ("installing", "refused", Outcome.TARGET_REFUSED, RELEASE, A),
    ("quiescing", "target-died", Outcome.TARGET_DIED, RELEASE, A),
    ("snapshotting", "target-died", Outcome.TARGET_DIED, RELEASE, A),
    ("installing", "target-died", Outcome.TARGET_DIED, RELEASE, A),
    # A dying is a normal worker death: U's state died with it, U is placed anew.
    ("quiescing", "source-died", Outcome.SOURCE_DIED, RELEASE | REPLACE, None),
    ("snapshotting", "source-died", Outcome.SOURCE_DIED, RELEASE | REPLACE, None),
    ("installing", "source-died", Outcome.SOURCE_DIED, RELEASE | REPLACE, None),
])
def test_every_abort_leaves_the_user_where_it_was(reach, event, outcome, effects, release_to):
    move = flagged()
    if reach in ("snapshotting", "installing"):
        move.quiesced(100.1)
    if reach == "installing":
        move.snapshot(b"state", 100.2)
    now = 111.0 if event == "timeout" else 105.0
    got = {"timeout": lambda: move.tick(now), "refused": lambda: move.refused("no such user", now),
           "target-died": lambda: move.worker_died(B, now), "source-died": lambda: move.worker_died(A, now)}[event]()
    assert got == effects
    assert move.step is Step.ABORTED and move.over and move.release_to == release_to
    assert move.summary().outcome is outcome and move.package is None
    assert move.summary().seconds == pytest.approx(now - 100.0)


def test_the_deadline_is_hard_and_counted_from_the_flag():
    move = flagged(timeout=10.0)
    assert move.tick(109.99) == 0 and move.step is Step.QUIESCING
    assert move.tick(110.0) == RELEASE
    assert move.summary().why == "alice still had a request open after 10s"


def test_a_timeout_names_who_did_not_answer():
    move = installing()
    move.tick(200.0)
    assert move.summary().why == f"{B} did not answer the install after 10s"


def test_another_workers_death_does_not_touch_the_move():
    move = installing()
    assert move.worker_died(C, 101.0) == 0 and move.step is Step.INSTALLING


@pytest.mark.parametrize(("reach", "call"), [
    ("quiescing", "snapshot"), ("quiescing", "installed"), ("quiescing", "refused"),
    ("snapshotting", "quiesced"), ("snapshotting", "installed"),
    ("installing", "quiesced"), ("installing", "snapshot"),
    ("switched", "quiesced"), ("switched", "installed"), ("switched", "refused"), ("switched", "source-died"),
    ("aborted", "snapshot"), ("aborted", "installed"), ("aborted", "target-died"),
])
def test_an_input_not_legal_in_the_step_is_an_error_not_ignored(reach, call):
    move = flagged()
    if reach != "quiescing":
        move.quiesced(100.1)
    if reach in ("installing", "switched"):
        move.snapshot(b"s", 100.2)
    if reach == "switched":
        move.installed(100.3)
    if reach == "aborted":
        move.refused("no", 100.3)
    with pytest.raises(MoveError):
        {"quiesced": lambda: move.quiesced(101.0), "snapshot": lambda: move.snapshot(b"s", 101.0),
         "installed": lambda: move.installed(101.0), "refused": lambda: move.refused("no", 101.0),
         "source-died": lambda: move.worker_died(A, 101.0), "target-died": lambda: move.worker_died(B, 101.0)}[call]()


def test_failing_closed_aborts_to_the_source_once():
    move = installing()
    assert move.abort(MoveError("forced"), 101.0) == RELEASE
    assert move.release_to == A and move.summary().outcome is Outcome.FAILED and move.summary().why == "forced"
    assert move.abort(MoveError("again"), 102.0) == 0  # over already: nothing more to release


def test_a_package_is_sent_once_and_only_while_installing():
    move = flagged()
    with pytest.raises(MoveError):
        move.sent()
    move.quiesced(100.1)
    move.snapshot(b"state", 100.2)
    move.sent()
    with pytest.raises(MoveError):
        move.sent()


def test_the_table_has_a_row_for_each_legal_step_and_none_out_of_an_ended_move():
    assert all(step not in (Step.SWITCHED, Step.ABORTED) for step, _ in TRANSITIONS)
    assert (Step.QUIESCING, MoveEvent.REFUSED) not in TRANSITIONS  # nobody was asked anything yet
    assert len(TRANSITIONS) == 3 + 3 * 4 - 1


def test_a_move_to_the_same_worker_or_without_time_cannot_be_built():
    with pytest.raises(ValueError):
        Move(1, "alice", A, A, 0.0, 10.0, stateful=True)
    with pytest.raises(ValueError):
        Move(1, "alice", A, B, 0.0, 0.0, stateful=True)


def test_the_book_refuses_a_second_move_of_a_user_already_moving():
    book = MoveBook()
    first = book.begin("alice", A, B, 100.0, 10.0, stateful=True)
    assert isinstance(first, Move) and book.moving("alice") is first and book.get(first.move_id) is first
    assert book.begin("alice", A, C, 100.5, 10.0, stateful=True) == (
        f"alice is already being moved ({A} to {B})")
    assert book.begin("bob", B, B, 100.5, 10.0, stateful=True) == f"bob is on {B} already"
    second = book.begin("bob", B, C, 100.5, 10.0, stateful=False)
    assert isinstance(second, Move) and second.move_id != first.move_id and len(book) == 2
    assert book.involving(B) == [first, second] and book.involving(C) == [second]


def test_the_book_finds_what_is_due_and_forgets_only_what_is_over():
    book = MoveBook()
    move = book.begin("alice", A, B, 100.0, 10.0, stateful=True)
    assert isinstance(move, Move)
    assert book.due(109.0) == [] and book.due(110.0) == [move]
    with pytest.raises(MoveError):
        book.end(move)  # still quiescing
    move.tick(110.0)
    book.end(move)
    assert book.moving("alice") is None and book.get(move.move_id) is None and len(book) == 0
    again = book.begin("alice", A, B, 120.0, 10.0, stateful=True)  # the next ledger check may retry
    assert isinstance(again, Move) and again.move_id != move.move_id
