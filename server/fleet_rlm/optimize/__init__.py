"""Optimization: datasets of judged questions, metrics, DSPy optimizers over the RLM program, and
the program versions they yield (see docs/optimization.md).

``datasets`` (import, export, from feedback), ``metrics`` (score + feedback text), ``harness`` (the
module that replays a dataset row through the Engine), ``runner`` (background optimizations with
events, cancel and an evaluation cache), ``versions`` (save, compare, promote, roll back) and
``views`` (what the faces show). Only ``harness`` and ``runner``'s worker thread import DSPy.
"""
