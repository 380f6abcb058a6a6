"""How long a test waits for a condition: a base deadline stretched by how busy the machine is.

A wait returns as soon as its condition holds, so a long deadline costs a passing test nothing; a
fixed one fails a test that would pass when other work shares the cores (the run queue per core, the
one-minute load average over the core count, is how much slower everything is now than alone)."""

from __future__ import annotations

import os

MOST = 6.0  # a machine slower than this fails its deadlines: something is wrong, not busy


def slowdown() -> float:
    """How many times slower than alone the machine runs now (1.0 when it is not oversubscribed)."""
    return min(MOST, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def patience(seconds: float) -> float:
    """``seconds`` for a machine to itself, stretched by the machine's slowdown now."""
    return seconds * slowdown()
