"""Manifest changes in the state journal: one object per line (not the whole manifest),
replayed at start-up to the same manifest, undone with a failed group."""

from __future__ import annotations

import json
from pathlib import Path

from messaging.broker.broker import Broker
from messaging.broker.state_log import NAME
from messaging.broker.topic_settings import (
    configure_command,
    expire_command,
    offload_command,
)
from messaging.tiered.manifest import SegmentObject
from tests.conftest import apply

SHA = "cd" * 32


def obj(first: int, last: int) -> SegmentObject:
    return SegmentObject(first, last, 1000, last - first + 1, SHA, None, 0, 5,
                         ((first + 1, 500, 1),))


def test_journal_lines_carry_one_change_and_replay_to_the_same_manifest(
        tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    apply(broker, configure_command(3, {"max-topic-size": 1 << 20}))
    for k in range(200):
        apply(broker, offload_command(3, obj(10 * k + 1, 10 * k + 10), after=10 * k))
    apply(broker, expire_command(3, 995))
    apply(broker, offload_command(3, obj(1, 5), after=0))  # stale: changes nothing
    manifest = broker.manifest(3)
    assert len(manifest.objects) == 101 and manifest.expired == 995
    lines = (tmp_path / NAME).read_text().splitlines()
    assert max(len(line) for line in lines) < 1000  # one object a line, not the manifest
    assert any("manifest_changes" in json.loads(line).get("changes", {}).get("topics", {})
               .get("3", {}) for line in lines)
    broker.close()
    # broker.json was saved on close: replay the journal on top of an older one instead
    reopened = Broker.open(tmp_path)
    assert reopened.manifest(3) == manifest
    assert reopened.settings(3).settings == {"max-topic-size": 1 << 20}
    reopened.close()


def test_replay_from_the_journal_alone(tmp_path: Path) -> None:
    broker = Broker.open(tmp_path)
    apply(broker, offload_command(4, obj(1, 10), after=0))
    apply(broker, offload_command(4, obj(11, 20), after=10))
    manifest = broker.manifest(4)
    journal = (tmp_path / NAME).read_bytes()
    broker.close()
    # the state as before those groups, with the journal that records them
    state = json.loads((tmp_path / "broker.json").read_text())
    state["catalog"]["topics"] = {}
    state["catalog_seq"] = 0
    (tmp_path / "broker.json").write_text(json.dumps(state))
    (tmp_path / NAME).write_bytes(journal)
    reopened = Broker.open(tmp_path)
    assert reopened.manifest(4) == manifest
    reopened.close()
