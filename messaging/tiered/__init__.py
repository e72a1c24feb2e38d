"""Reading a topic whose older segments live in an object store, as if they were local.

* :mod:`~messaging.tiered.manifest`: which segments are in the store (state, through the log);
* :mod:`~messaging.tiered.cache`: a bounded cache of object chunks, fetched with ranged GETs,
  with prefetch;
* :mod:`~messaging.tiered.reader`: a reader that reads the store below the local segments
  and hands over to them with no gap and no repeat;
* :mod:`~messaging.tiered.view`: a topic as readers see it (its first index, times and
  counts over both);
* :mod:`~messaging.tiered.metrics`: store errors, cache hits, bytes read.

This room sits below the broker (which keeps manifests in its state and hands the views out)
and above the topic and object rooms it reads.
"""
