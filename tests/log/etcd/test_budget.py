"""Where a cluster publish's time goes (messaging.log.etcd.budget)."""

from __future__ import annotations

from messaging.log.etcd.budget import PHASES, Budget


def test_phases_add_up_and_percentiles_cover_a_window() -> None:
    now = [1000.0]
    budget = Budget(clock=lambda: now[0])
    for k in range(100):  # queued k ms, etcd put 2 ms, apply 1 ms; an old clock skew counts 0
        budget.record(queued=k / 1000, put=0.002, watch=-0.0005, apply_wait=0.0, apply=0.001,
                      answer=0.0)
    report = budget.report(window=10)
    assert report["publishes"] == 100
    assert set(PHASES) <= report.keys()
    assert report["put"] == {"p50_ms": 2.0, "p90_ms": 2.0, "p99_ms": 2.0}
    assert report["watch"] == {"p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0}
    assert report["queued"] == {"p50_ms": 50.0, "p90_ms": 90.0, "p99_ms": 99.0}
    assert report["total"] == {"p50_ms": 53.0, "p90_ms": 93.0, "p99_ms": 102.0}
    now[0] += 11  # outside the window now; a newer publish is in it
    budget.record(queued=0.0, put=0.004, watch=0.0, apply_wait=0.0, apply=0.0, answer=0.0)
    recent = budget.report(window=10)
    assert recent["publishes"] == 1 and recent["put"] == {"p50_ms": 4.0, "p90_ms": 4.0,
                                                          "p99_ms": 4.0}
    assert budget.report(window=60)["publishes"] == 101
    now[0] += 100
    assert budget.report(window=10) == {"window_s": 10, "publishes": 0}
