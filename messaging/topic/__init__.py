"""Topics on disk: segments of checksummed frames, recovery, append and roll, sync and
commit, retention, readers and the in-memory tail. Synchronous file I/O; no asyncio."""
