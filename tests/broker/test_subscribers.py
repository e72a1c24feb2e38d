"""Subscriber positions: they only move forward, time out of the retention floor, are saved and
restored, and a failed group's heartbeats are undone."""

from __future__ import annotations

import json
import time

from messaging.broker.subscribers import NO_FLOOR, Subscribers


def test_a_position_never_moves_backwards() -> None:
    subscribers = Subscribers(timeout=60)
    subscribers.record(1, 10, "a")
    seen = subscribers.last_seen(1, "a")
    assert seen is not None
    subscribers.record(1, 5, "a")  # a lower heartbeat only says "still alive"
    assert subscribers.positions(1) == {"a": 10}
    later = subscribers.last_seen(1, "a")
    assert later is not None and later >= seen
    subscribers.record(1, 12, "a")
    assert subscribers.positions(1) == {"a": 12}
    assert subscribers.positions(2) == {} and subscribers.last_seen(2, "a") is None


def test_the_floor_is_the_lowest_live_position() -> None:
    subscribers = Subscribers(timeout=60)
    assert subscribers.floor(1) == NO_FLOOR
    subscribers.record(1, 5, "slow")
    time.sleep(0.01)  # the clock must move between the two heartbeats
    subscribers.record(1, 15, "fast")
    subscribers.record(2, 3, "other")
    assert subscribers.floor(1) == 5
    slow, fast = subscribers.last_seen(1, "slow"), subscribers.last_seen(1, "fast")
    assert slow is not None and fast is not None and fast - slow >= 0.01
    # "slow" has been silent for longer than the timeout, "fast" has not.
    assert subscribers.floor(1, now=fast + 60 - 0.005) == 15
    assert subscribers.floor(1, now=fast + 61) == NO_FLOOR
    # Timed out, a subscriber still keeps its position.
    assert subscribers.positions(1) == {"slow": 5, "fast": 15}
    assert subscribers.floor(2, now=fast + 60 - 0.005) == 3


def test_saved_positions_restore_the_same() -> None:
    subscribers = Subscribers(timeout=60)
    subscribers.record(1, 5, "a")
    subscribers.record(1, 9, "b")
    subscribers.record(2**40, 7, "a")
    saved = subscribers.saved()
    assert saved == {"1": {"a": 5, "b": 9}, str(2**40): {"a": 7}}
    restored = Subscribers(timeout=60)
    restored.record(3, 1, "gone")  # restore replaces everything
    restored.restore(json.loads(json.dumps(saved)))  # as broker.json holds it
    assert restored.saved() == saved
    assert restored.rows() == subscribers.rows() == [(1, "a", 5), (1, "b", 9), (2**40, "a", 7)]
    assert restored.floor(1) == 5 and restored.positions(3) == {}


def test_undo_puts_back_what_a_failed_group_recorded() -> None:
    subscribers = Subscribers(timeout=60)
    subscribers.record(1, 5, "a")
    before = subscribers.record_all([(1, 9, "a"), (1, 3, "new"), (2, 4, "b")])
    assert subscribers.positions(1) == {"a": 9, "new": 3}
    assert subscribers.positions(2) == {"b": 4}
    subscribers.undo(before)
    assert subscribers.positions(1) == {"a": 5}
    assert subscribers.positions(2) == {}
    assert subscribers.rows() == [(1, "a", 5)]
    assert subscribers.floor(1) == 5 and subscribers.floor(2) == NO_FLOOR


def test_resets_and_deletes_move_positions_anywhere_and_undo() -> None:
    from messaging.broker.subscribers import (
        DELETE,
        RESET,
        PositionChange,
        consumer_command,
        parse_consumer_command,
    )
    from messaging.frames import decode

    subscribers = Subscribers(timeout=60)
    subscribers.record(1, 9, "a")
    subscribers.record(2, 4, "a")
    subscribers.record(1, 5, "b")
    before = subscribers.record_all([
        PositionChange(1, 3, "a", RESET),  # backwards: only explicitly
        PositionChange(None, 0, "b", DELETE),  # every topic
        (1, 2, "a"),  # a lower heartbeat after the reset: ignored
        PositionChange(3, 7, "c", RESET),
    ])
    assert subscribers.rows() == [(1, "a", 3), (2, "a", 4), (3, "c", 7)]
    subscribers.undo(before)
    assert subscribers.rows() == [(1, "a", 9), (1, "b", 5), (2, "a", 4)]
    # The commands through the log say the same.
    for kind, topic, index in [(RESET, 1, 3), (DELETE, 2, 0), (DELETE, None, 0)]:
        frame = decode(consumer_command(kind, topic, "a", index))[0][0]
        assert parse_consumer_command(frame.topic, frame.data) == PositionChange(
            topic, index, "a", kind)
