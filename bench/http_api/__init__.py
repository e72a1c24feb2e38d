"""HTTP API benchmark of one node: publish rates, group commit, latency, streaming."""
