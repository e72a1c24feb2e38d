"""Per-topic settings and topic deletion: the request body, the command and the table.

A topic may override four broker-wide limits: ``max-topic-size`` and ``retention-age``
(retention by size and by the append time of a segment's newest message, in ms in the
command, 0 meaning off; a request gives it as a duration with its unit),
``max-segment-size`` (when a new segment starts) and ``max-message-size`` (the largest
message data a publish to it may hold). Settings and deletions are commands of the log (a
broker-internal frame of type :data:`TOPIC_OP` whose topic field names the topic, data =
JSON), applied by the broker's state machine, so they are replicated, journaled, in
snapshots and in a cluster's checkpoint exactly as the catalog is (:class:`TopicTable` lives
in :class:`messaging.broker.catalog.Catalog`).

A deletion takes a broker index of its own, as a message would, and records it
(``deleted_at``): the topic's files, settings and subscriber positions go; a publish to the
same id later creates it again with indexes above ``deleted_at``, and reads of it from
``deleted_at`` or below answer 410: every read that began before the deletion, including one
resuming right after the old topic's last message, so nothing deleted is ever served again
and nothing new is served as its continuation.

A topic a Kafka client created (:mod:`messaging.kafka`) carries a label in its entry, the
Kafka topic's name and the partition it is (``kafka``): set by the configure command that
creates it, kept by later settings, dropped with the topic's deletion. A label is given only
to a topic that holds nothing yet and has no other label, so two creations racing for one
id cannot both win.

With an object store, a topic's entry also holds its manifest (which closed segments are in
the store, :mod:`messaging.tiered.manifest`), changed by two more topic commands: ``offload``
records one uploaded and verified segment, ``expire`` drops everything up to an index (total
retention). Like settings they go through the log, so every node and snapshot agree.

Pure: no I/O.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from messaging.config import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_SEGMENT_SIZE,
    DEFAULT_MAX_TOPIC_SIZE,
    duration_of,
    size_of,
)
from messaging.errors import BadRequestError, CorruptFrameError
from messaging.frames import INTERNAL_TYPE, encode
from messaging.objects.errors import ObjectNameError
from messaging.tiered.manifest import Manifest, SegmentObject

#: Internal command: JSON ``{"op": "configure", "settings": {KEY: size or null}, "create":
#: bool[, "kafka": [NAME, PARTITION]]}``, ``{"op": "delete"}``, ``{"op": "offload",
#: "object": [...], "after": index}`` or
#: ``{"op": "expire", "through": index}``; the frame's topic field names the topic. Always a
#: command of its own (one frame).
TOPIC_OP = INTERNAL_TYPE | 4
CONFIGURE = "configure"
DELETE = "delete"
OFFLOAD = "offload"
EXPIRE = "expire"

MAX_TOPIC_SIZE = "max-topic-size"
MAX_SEGMENT_SIZE = "max-segment-size"
MAX_MESSAGE_SIZE = "max-message-size"
RETENTION_AGE = "retention-age"
#: The settings a topic may have, in the order they are shown.
KEYS = (MAX_TOPIC_SIZE, RETENTION_AGE, MAX_SEGMENT_SIZE, MAX_MESSAGE_SIZE)
#: Each setting's built-in default (what the broker uses without a flag; None: off).
DEFAULTS: dict[str, int | None] = {
    MAX_TOPIC_SIZE: DEFAULT_MAX_TOPIC_SIZE, RETENTION_AGE: None,
    MAX_SEGMENT_SIZE: DEFAULT_MAX_SEGMENT_SIZE, MAX_MESSAGE_SIZE: DEFAULT_MAX_MESSAGE_SIZE}
#: Where an effective setting came from.
SOURCE_TOPIC, SOURCE_BROKER, SOURCE_DEFAULT = "topic", "broker", "default"
#: The largest size any setting takes (sizes are kept as signed 64-bit numbers elsewhere).
_MAX_SIZE = (1 << 63) - 1

Settings = dict[str, int | None]  # a change: None resets a key to the broker's value


# -- the request body -----------------------------------------------------------------------


def parse_settings(body: Any, max_message_size: int) -> Settings:
    """The settings a ``PUT /messaging/topics/{id}`` body asks for (400 with the reason).

    ``body`` is the decoded JSON: an object whose keys are :data:`KEYS`, each read as the
    broker's flags read it (:mod:`messaging.config`), or null to go back to the broker's
    value. Sizes are a byte count or a size text (``10M``, ``1G``); ``retention-age`` is a
    duration text with its unit (``7d``, ``12h``, ``500ms``), or 0 to turn it off for the
    topic: a bare number is refused, as it is on the command line. ``max-message-size``
    may not exceed ``max_message_size``, the broker's own maximum (no request could carry
    more).
    """
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object of settings, e.g. "
                              '{"max-topic-size": "1G"}')
    unknown = sorted(set(body) - set(KEYS))
    if unknown:
        raise BadRequestError(f"unknown setting {unknown[0]!r}: expected "
                              f"{', '.join(KEYS)}")
    settings: Settings = {}
    for key, value in body.items():
        if value is None:
            settings[key] = None
        elif key == RETENTION_AGE:
            settings[key] = age_value(value)
        else:
            settings[key] = size_value(key, value)
    limit = settings.get(MAX_MESSAGE_SIZE)
    if limit is not None and limit > max_message_size:
        raise BadRequestError(f"{MAX_MESSAGE_SIZE} {limit} is above this broker's maximum "
                              f"of {max_message_size} (--max-message-size)")
    return settings


def size_value(key: str, value: Any) -> int:
    """One setting's size from a JSON number of bytes or a size text (above zero)."""
    try:
        size = size_of(value)
    except argparse.ArgumentTypeError as err:
        raise BadRequestError(_named(err, "invalid size", key)) from err
    if not 0 < size <= _MAX_SIZE:
        raise BadRequestError(f"invalid {key} {size}: must be from 1 to {_MAX_SIZE}")
    return size


def age_value(value: Any) -> int:
    """``retention-age`` in ms (the unit of the command in the log) from a duration text,
    or 0 (off)."""
    try:
        seconds = duration_of(value)
    except argparse.ArgumentTypeError as err:
        raise BadRequestError(_named(err, "invalid duration", RETENTION_AGE)) from err
    ms = round(seconds * 1000)
    if seconds and not ms:
        raise BadRequestError(f"invalid {RETENTION_AGE} {value!r}: below 1ms (0 turns it off)")
    if ms > _MAX_SIZE:
        raise BadRequestError(f"invalid {RETENTION_AGE} {value!r}: must be at most "
                              f"{_MAX_SIZE}ms")
    return ms


def _named(err: argparse.ArgumentTypeError, kind: str, key: str) -> str:
    """The parser's one line, naming the setting instead of the kind of value."""
    return str(err).replace(kind, f"invalid {key}", 1)


# -- the command ------------------------------------------------------------------------------


#: A Kafka partition: the Kafka topic's name and the partition's number.
KafkaLabel = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TopicOp:
    """One topic command as the state machine reads it."""

    topic: int
    kind: str  # CONFIGURE, DELETE, OFFLOAD or EXPIRE
    settings: Mapping[str, int | None] = field(default_factory=dict)
    create: bool = False
    object: SegmentObject | None = None  # OFFLOAD: the segment uploaded
    after: int = 0  # OFFLOAD: the manifest's ``offloaded`` its uploader saw
    through: int = 0  # EXPIRE: everything up to this index goes
    kafka: KafkaLabel | None = None  # CONFIGURE: the Kafka partition the topic becomes


def configure_command(topic: int, settings: Mapping[str, int | None], *,
                      create: bool = True, kafka: KafkaLabel | None = None) -> bytes:
    """The command that changes a topic's settings (``create``: also create it, empty, if it
    does not exist; ``kafka``: it becomes that Kafka partition, see the module's text)."""
    op: dict[str, Any] = {"op": CONFIGURE, "settings": dict(settings), "create": create}
    if kafka is not None:
        op["kafka"] = [kafka[0], kafka[1]]
    return _command(topic, op)


def delete_command(topic: int) -> bytes:
    """The command that deletes a topic: its files, settings and subscriber positions."""
    return _command(topic, {"op": DELETE})


def offload_command(topic: int, obj: SegmentObject, after: int) -> bytes:
    """The command that records ``obj`` (uploaded and verified) in a topic's manifest, as the
    segment right after index ``after`` (the manifest's ``offloaded`` when it was chosen)."""
    return _command(topic, {"op": OFFLOAD, "object": obj.saved(), "after": after})


def expire_command(topic: int, through: int) -> bytes:
    """The command that drops a topic's data up to ``through`` (total retention), in the
    store as locally."""
    return _command(topic, {"op": EXPIRE, "through": through})


def _command(topic: int, op: dict[str, Any]) -> bytes:
    return encode(TOPIC_OP, topic, json.dumps(op, separators=(",", ":")).encode())


def parse_topic_command(topic: int, data: bytes) -> TopicOp:
    """The :class:`TopicOp` a :data:`TOPIC_OP` frame holds (CorruptFrameError if invalid)."""
    try:
        op = json.loads(data)
        kind = op["op"]
        if kind == OFFLOAD:
            return TopicOp(topic, kind, object=SegmentObject.restore(op["object"]),
                           after=int(op["after"]))
        if kind == EXPIRE:
            through = int(op["through"])
            if through <= 0:
                raise ValueError(f"expire through {through}")
            return TopicOp(topic, kind, through=through)
        settings = op.get("settings", {})
        valid = (kind in (CONFIGURE, DELETE) and isinstance(settings, dict)
                 and all(k in KEYS and (v is None or (
                     isinstance(v, int) and (v > 0 or (v == 0 and k == RETENTION_AGE))))
                         for k, v in settings.items()))
        kafka = _label(op.get("kafka"))
    except (ValueError, KeyError, TypeError, ObjectNameError) as err:
        raise CorruptFrameError(f"topic command is not valid JSON: {err}") from err
    if not valid:
        raise CorruptFrameError(f"invalid topic command {op!r}")
    return TopicOp(topic, kind, settings, bool(op.get("create", False)), kafka=kafka)


def _label(value: Any) -> KafkaLabel | None:
    """A Kafka label from its JSON form (None: none; ValueError: not one)."""
    if value is None:
        return None
    name, partition = value
    if not isinstance(name, str) or not name or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"invalid kafka label {value!r}")
    return name, partition


# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicEntry:
    """What the log decided about one topic: the settings set on it, and the broker index its
    last deletion took (None: never deleted). Replaced whole, never changed in place."""

    settings: Mapping[str, int] = field(default_factory=dict)
    deleted_at: int | None = None
    #: Its segments in the object store (empty without one).
    manifest: Manifest = field(default_factory=Manifest)
    #: The Kafka partition it is (None: not one).
    kafka: KafkaLabel | None = None

    def configured(self, change: Mapping[str, int | None],
                   kafka: KafkaLabel | None = None) -> TopicEntry:
        """This entry with ``change`` applied (None removes a key), labelled ``kafka`` when
        given."""
        settings = dict(self.settings)
        for key, value in change.items():
            if value is None:
                settings.pop(key, None)
            else:
                settings[key] = value
        return TopicEntry(settings, self.deleted_at, self.manifest, kafka or self.kafka)

    def with_manifest(self, manifest: Manifest) -> TopicEntry:
        """This entry with another manifest."""
        return TopicEntry(self.settings, self.deleted_at, manifest, self.kafka)

    def saved(self) -> dict[str, Any]:
        """The JSON form (empty parts left out)."""
        saved: dict[str, Any] = {}
        if self.settings:
            saved["settings"] = dict(self.settings)
        if self.deleted_at is not None:
            saved["deleted_at"] = self.deleted_at
        if not self.manifest.empty:
            saved["manifest"] = self.manifest.saved()
        if self.kafka is not None:
            saved["kafka"] = list(self.kafka)
        return saved

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> TopicEntry:
        """The entry from :meth:`saved`."""
        deleted_at = data.get("deleted_at")
        return cls({str(k): int(v) for k, v in data.get("settings", {}).items()},
                   None if deleted_at is None else int(deleted_at),
                   Manifest.restore(data.get("manifest")), _label(data.get("kafka")))

    @property
    def empty(self) -> bool:
        """Whether the entry says nothing (it need not be kept)."""
        return (not self.settings and self.deleted_at is None and self.manifest.empty
                and self.kafka is None)


_MISSING = object()
#: The entry of a topic the log decided nothing about (shared: entries are never changed in
#: place).
NO_ENTRY = TopicEntry()


class TopicTable:
    """Every topic's :class:`TopicEntry`, changed only by the broker's writer thread.

    Like the catalog it belongs to: the group being applied changes an overlay that
    :meth:`commit` folds in and :meth:`rollback` drops (to a savepoint); readers on other
    threads see committed entries only.
    """

    def __init__(self) -> None:
        self.entries: dict[int, TopicEntry] = {}
        #: The committed Kafka topics: name -> partition -> topic id (replaced whole when one
        #: changes, so readers on other threads never see it half changed).
        self.kafka: dict[str, dict[int, int]] = {}
        self._pending: dict[int, TopicEntry] = {}
        #: For a topic whose only changes in the group being applied are to its manifest:
        #: those changes (the journal records them, not the whole entry, which holds every
        #: object of the topic); None once anything else changed.
        self._manifest_changes: dict[int, list[dict[str, Any]] | None] = {}
        self._undo: list[tuple[int, Any, Any]] = []

    def get(self, topic: int) -> TopicEntry:
        """A topic's entry as the group being applied sees it."""
        entry = self._pending.get(topic)
        if entry is None:
            entry = self.entries.get(topic)
        return entry if entry is not None else NO_ENTRY

    def committed(self, topic: int) -> TopicEntry:
        """A topic's committed entry (any thread)."""
        return self.entries.get(topic) or NO_ENTRY

    def stage(self, topic: int, entry: TopicEntry,
              manifest_change: dict[str, Any] | None = None) -> None:
        """Stage ``entry`` for ``topic`` in the group being applied; ``manifest_change``:
        it differs from the entry before only by that change to its manifest (see
        :func:`apply_manifest_change`)."""
        changes = self._manifest_changes.get(topic, _MISSING)
        self._undo.append((topic, self._pending.get(topic, _MISSING),
                           list(changes) if isinstance(changes, list) else changes))
        self._pending[topic] = entry
        if manifest_change is not None and (changes is _MISSING or isinstance(changes, list)):
            self._manifest_changes[topic] = [*(changes if isinstance(changes, list) else []),
                                             manifest_change]
        else:
            self._manifest_changes[topic] = None

    def mark(self) -> int:
        """A savepoint for :meth:`rollback`."""
        return len(self._undo)

    def rollback(self, mark: int = 0) -> None:
        """Undo every change since ``mark`` (0: since the last :meth:`commit`)."""
        while len(self._undo) > mark:
            topic, before, changes = self._undo.pop()
            if before is _MISSING:
                self._pending.pop(topic, None)
            else:
                self._pending[topic] = before
            if changes is _MISSING:
                self._manifest_changes.pop(topic, None)
            else:
                self._manifest_changes[topic] = changes

    @property
    def pending(self) -> bool:
        """Whether the group being applied changed an entry."""
        return bool(self._pending)

    def commit(self) -> None:
        """Fold the group's changes in (one store per topic: readers always find an entry)."""
        relabelled = False
        for topic, entry in self._pending.items():
            before = self.entries.get(topic)
            if entry.kafka != (before.kafka if before is not None else None):
                relabelled = True
            if entry.empty:
                self.entries.pop(topic, None)
            else:
                self.entries[topic] = entry
        if relabelled:
            self._index_kafka()
        self._pending.clear()
        self._manifest_changes.clear()
        self._undo.clear()

    def forget(self, topics: set[int]) -> None:
        """Drop the entries of ``topics`` (named topics whose streams are gone: their ids are
        never given out again)."""
        gone = topics & self.entries.keys()
        for topic in gone:
            del self.entries[topic]
        if gone:
            self._index_kafka()

    def _index_kafka(self) -> None:
        """Rebuild :attr:`kafka` from the committed entries."""
        kafka: dict[str, dict[int, int]] = {}
        for topic, entry in self.entries.items():
            if entry.kafka is not None:
                kafka.setdefault(entry.kafka[0], {})[entry.kafka[1]] = topic
        self.kafka = kafka

    def saved(self) -> dict[str, Any]:
        """Every entry with the group being applied, as JSON (broker.json, snapshots, the
        cluster checkpoint)."""
        entries = {**self.entries, **self._pending}
        return {str(t): e.saved() for t, e in sorted(entries.items()) if not e.empty}

    def changes(self) -> dict[str, Any]:
        """The entries the group being applied changed (for the state journal): whole, or
        only their manifest changes when nothing else changed."""
        changed: dict[str, Any] = {}
        for topic, entry in self._pending.items():
            manifest_changes = self._manifest_changes.get(topic)
            changed[str(topic)] = (entry.saved() if manifest_changes is None
                                   else {MANIFEST_CHANGES: manifest_changes})
        return changed

    def restore(self, data: Mapping[str, Any] | None) -> None:
        """Replace everything with :meth:`saved` output (None: empty)."""
        self.entries = {int(t): TopicEntry.restore(e) for t, e in (data or {}).items()}
        self._index_kafka()
        self._pending.clear()
        self._manifest_changes.clear()
        self._undo.clear()

    def replay(self, changes: Mapping[str, Any]) -> None:
        """Apply a journal line's :meth:`changes` (at start-up)."""
        for topic, saved in changes.items():
            if MANIFEST_CHANGES in saved:
                entry = self.entries.get(int(topic)) or TopicEntry()
                for change in saved[MANIFEST_CHANGES]:
                    entry = apply_manifest_change(entry, change)
            else:
                entry = TopicEntry.restore(saved)
            if entry.empty:
                self.entries.pop(int(topic), None)
            else:
                self.entries[int(topic)] = entry
        if changes:
            self._index_kafka()


#: A journal line's key for a topic whose manifest alone changed: the list of changes.
MANIFEST_CHANGES = "manifest_changes"


def manifest_change(op: TopicOp) -> dict[str, Any]:
    """The journal's form of an offload or expire command."""
    if op.kind == OFFLOAD:
        assert op.object is not None
        return {"offload": op.object.saved(), "after": op.after}
    return {"expire": op.through}


def apply_manifest_change(entry: TopicEntry, change: dict[str, Any]) -> TopicEntry:
    """``entry`` after a change :func:`manifest_change` wrote (replaying the journal: the
    same result as when it was applied)."""
    if "offload" in change:
        manifest = entry.manifest.offload(SegmentObject.restore(change["offload"]),
                                          int(change["after"]))
    else:
        manifest = entry.manifest.expire(int(change["expire"]))
    return entry if manifest is None else entry.with_manifest(manifest)


# -- effective settings -----------------------------------------------------------------------


def effective(entry: TopicEntry, broker: Mapping[str, int | None],
              ) -> dict[str, dict[str, Any]]:
    """Each setting's value and where it came from: ``topic`` (set on the topic), ``broker``
    (a broker flag or config set it to other than the built-in default) or ``default``.

    ``broker``: the broker's own value of each key.
    """
    shown: dict[str, dict[str, Any]] = {}
    for key in KEYS:
        if key in entry.settings:
            shown[key] = {"value": entry.settings[key], "source": SOURCE_TOPIC}
        else:
            value = broker[key]
            source = SOURCE_DEFAULT if value == DEFAULTS[key] else SOURCE_BROKER
            shown[key] = {"value": value, "source": source}
    return shown
