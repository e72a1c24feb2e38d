"""The command logs that drive the broker: the Log protocol, the embedded local log with
group commit, and the etcd-replicated log of a cluster."""
