"""Keeping closed segments in an object store: upload, total retention in the store, sweep.

* :mod:`~messaging.offload.candidates`: which local segments are ready to upload, and the
  backlog;
* :mod:`~messaging.offload.uploader`: :class:`Offloader`, the loop one holder of a group runs:
  uploads rolled segments (conditional, verified, retried with backoff and jitter, a bounded
  number at once), records them through the log, applies total retention to the store
  (through the log too) and deletes what it dropped;
* :mod:`~messaging.offload.sweep`: finds objects no manifest records (a crash between upload
  and record, a deletion interrupted) and manifest entries whose object vanished;
* :mod:`~messaging.offload.service`: builds all of it for one broker and its log from the
  configuration, and hands reads their view of the store.

This room sits above the broker (whose state holds the manifests) and below the log that
carries its commands (it is given the log's ``apply``).
"""
