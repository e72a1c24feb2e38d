"""One-off experiments that locate what the benchmarks cannot show: split/ (HTTP in its own
processes), latency_budget/ (where the publish → subscriber p50 goes), fanout/ (the broker's
part of the fan-out p99, and the rests between slices). Each is run by its run.py."""
