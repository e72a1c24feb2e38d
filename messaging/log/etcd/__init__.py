"""The cluster's log on etcd: the watch-and-apply loop, the writer that puts
commands, the etcd client, membership, and snapshot fetches from peers."""
