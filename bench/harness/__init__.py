"""The benchmarks' shared harness: what every family of bench/ imports, and nothing that
belongs to one family alone. A family imports another family's code only through here, and
tests may import the harness (the launchers of real services), never a family.

- procs: child processes started and stopped by PID (broker, bare server, free ports, tools)
- peer_servers: Redis, NATS JetStream and the Durable Streams reference server as processes
- etcd_members: etcd members by PID, and their status, leader, health and Raft index
- cluster_nodes: a publish to a broker node of a cluster, and whether every node is ready
- seaweedfs: a SeaweedFS S3 server on loopback (the tiering benchmark and the object tests)
- bare_server: the bare aiohttp baseline server (a child process)
- stream_holder: the handle on a child holding N streaming GETs open, and its broker calls
- hold_streams: that child process
- sampling: CPU, RSS, descriptors and the machine's busy time from /proc
- loops: the event loop, open-loop pacing, closed loops and waits, all bounded
- figures: Figure, Runs, Row, percentiles and number formats
- payloads: the 100-byte message, its frame size and its timestamped variant
- disk: the disk's write + fdatasync rate as a baseline
- http_load: single-POST load (wrk, or aiohttp loops)
- client_load: preload and consume through our Python client
- lean_clients: lean socket clients that time live delivery (ours and Redis)
- v1_stream: the Durable Streams surface as the benchmarks drive it
- settings: the base Settings and the shared command line (--quick, --rounds, --out)
- results: results/<bench>.json, the RESULTS.md section, the machine and command on record
- plots: pyplot on the Agg backend and the results table's bar chart
"""
