"""Benchmarks of the broker, each beside a baseline measured in the same run.

- harness/: the shared parts every benchmark imports (processes, sampling, loops, figures,
  settings, results); nothing in it belongs to one benchmark alone.
- storage/, http_api/, python_client/, cluster/, spark/, streams/, durable_streams/, peers/,
  scaling/, soak/: one folder per benchmark family; its run.py is what its make target runs,
  and its other modules are pieces of that benchmark alone.
- experiments/: one-off experiments (split/, latency_budget/, fanout/), laid out the same way.

Results go to results/<name>.json and .png and to each benchmark's section of RESULTS.md.
A run.py imports bench.harness, messaging and its own folder's modules, never another run.py.
"""
