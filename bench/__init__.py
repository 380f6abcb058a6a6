"""Benchmarks: this project against stock ``dspy.RLM`` and the reference ``rlms`` package, on the
same seeded workloads, against one simulated model. Run ``python -m bench``; see docs/benchmarks.md."""
