"""``messaging.journal``, the public path of :mod:`messaging.client.journal`: primary/backup
journals with fenced writers, checkpoint entries and a ``CaughtUp`` signal."""

from messaging.client.journal import CaughtUp, Checkpoint, Entry, Receiver, Writer
from messaging.errors import FencedError, JournalError

__all__ = ["CaughtUp", "Checkpoint", "Entry", "FencedError", "JournalError", "Receiver",
           "Writer"]
