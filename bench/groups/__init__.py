"""Topic-groups benchmark: 4 broker nodes, G = 1, 2, 4, 8 groups held by R = 2 nodes each, on
one or two 3-member etcd clusters, every process in a network namespace of its own.

- netns: the namespaces (one per process, joined by veth links to a bridge in a switch
  namespace, the host on it too), the link delay, and round-trip probes
- cluster: etcd members and broker nodes in namespaces, readiness, placement, the exact
  per-node applied counters
- load: the load generator (batch and single publishes over every node and topic)
- model: the table, the capacity model and the plot
- run: what ``make bench-groups`` runs
"""
