"""Cluster benchmark: 3 broker nodes on a 3-member etcd cluster beside a single node."""
