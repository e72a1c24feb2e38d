"""When the apply side judges its watch of etcd's log stuck (messaging.log.etcd.log)."""

from __future__ import annotations

from messaging.log.etcd.log import WATCH_STUCK, watch_stuck


def test_an_idle_watch_is_not_stuck_when_the_log_moves_on() -> None:
    """The last event was long ago (nothing was written): the watch gets WATCH_STUCK from the
    moment the log was seen ahead, not from its last event."""
    now = 1000.0
    assert not watch_stuck(now, behind_since=now, last_event=now - 60, attempt_started=now - 90)
    assert not watch_stuck(now + WATCH_STUCK - 0.1, now, now - 60, now - 90)
    assert watch_stuck(now + WATCH_STUCK + 0.1, now, now - 60, now - 90)


def test_a_new_attempt_gets_its_own_deadline() -> None:
    """After a restart the new attempt is judged from its own start, not by the previous
    attempt's last event: restarting cannot cascade from endpoint to endpoint."""
    behind, event = 1000.0, 990.0
    restarted = behind + WATCH_STUCK + 0.5
    assert watch_stuck(restarted, behind, event, attempt_started=behind - 5)
    assert not watch_stuck(restarted + 0.5, behind, event, attempt_started=restarted)
    assert not watch_stuck(restarted + WATCH_STUCK, behind, event, attempt_started=restarted)
    assert watch_stuck(restarted + WATCH_STUCK + 0.1, behind, event, attempt_started=restarted)


def test_events_keep_a_lagging_watch_alive() -> None:
    """A watch that delivers, even behind the log, is not stuck."""
    behind = 1000.0
    assert not watch_stuck(behind + 10, behind, last_event=behind + 9, attempt_started=behind)
