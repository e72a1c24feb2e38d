"""Topics on disk: segments of checksummed frames and their time indexes. Synchronous file
I/O; no asyncio.

* :mod:`~messaging.topic.topic`: :class:`Topic`, the face the other rooms use, composed of:
* :mod:`~messaging.topic.recovery`: opening a topic's files, and cutting back frames never
  acknowledged;
* :mod:`~messaging.topic.writer`: the writer thread's transaction (append and roll, write,
  sync, commit, abort);
* :mod:`~messaging.topic.table`: the segment list and committed bounds the threads share;
* :mod:`~messaging.topic.read`: queries over committed state (positions, counts, times);
* :mod:`~messaging.topic.retention`: deleting the oldest segments, and the tombstone;
* :mod:`~messaging.topic.stats`: counters, and damage reported once per place;
* :mod:`~messaging.topic.segment`, :mod:`~messaging.topic.times`: one segment file and its
  sparse index, and its time index;
* :mod:`~messaging.topic.reader`, :mod:`~messaging.topic.tail`: reading committed frames, from
  the files or the in-memory tail;
* :mod:`~messaging.topic.store`: the data directory's topics, lock, open-file budget, fsyncs;
* :mod:`~messaging.topic.view`: the protocols the rooms above read a topic through.
"""
