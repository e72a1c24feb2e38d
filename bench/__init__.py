"""Benchmarks of the broker, each beside a baseline measured in the same run.

- harness/: the shared parts every benchmark imports (processes, sampling, loops, figures,
  settings, results, the etcd and SeaweedFS launchers); nothing in it belongs to one
  benchmark alone.
- storage/, http_api/, python_client/, cli/, cluster/, groups/, spark/, streams/,
  durable_streams/, peers/, scaling/, soak/, tiering/: one folder per benchmark family; its
  run.py is what its make target runs, and its other modules are pieces of that benchmark
  alone.
- experiments/: one-off experiments (split/, latency_budget/, fanout/), laid out the same way.

Results go to results/<name>.json and .png and to each benchmark's section of RESULTS.md.
A family imports bench.harness and its own folder's modules, never another family's; tests
import bench.harness only, never a family (tests/test_layout.py checks both).
"""
