"""The cluster's log on etcd: the log itself (lifecycle and public face), its watch, apply,
checkpoint and progress, snapshot installs from peers, the writer that puts commands, the
etcd client, and membership."""
