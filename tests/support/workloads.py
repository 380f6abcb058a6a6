"""Workloads shared by tests and benchmarks: haystacks with a needle, and the code a capable
model would write to find it."""

from __future__ import annotations

import random
from pathlib import Path

FILLER = (
    "The quarterly report covered logistics, staffing and maintenance schedules. ",
    "Service latency stayed within bounds while the cache warmed up overnight. ",
    "Nothing unusual was observed in the access logs for the eastern region. ",
    "The committee postponed the vote on the new archive retention policy. ",
)

# Root steps: look at the input, fan chunks out to sub-queries, submit what they found.
NEEDLE_STEPS = [
    "print(len(context), len(sources))\nprint(context[:200])",
    "size = 100_000\n"
    "chunks = [context[i:i + size] for i in range(0, len(context), size)]\n"
    "answers = llm_query_batched(['Report the secret code in this text, or NONE:\\n' + c for c in chunks])\n"
    "found = [a.strip() for a in answers if a.strip() not in ('NONE', '') and not a.startswith('[ERROR]')]\n"
    "print(len(chunks), found)",
    "SUBMIT(found[0] if found else 'not found')",
]


def write_haystack(path: Path, size: int, code: str, *, seed: int = 7, position: float = 0.61) -> Path:
    """A text file of about ``size`` characters with one 'The secret code is CODE.' inside."""
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    needle_at = int(size * position)
    placed = False
    while total < size:
        if not placed and total >= needle_at:
            sentence = f"The secret code is {code}. "
            placed = True
        else:
            sentence = rng.choice(FILLER)
        parts.append(sentence)
        total += len(sentence)
    path.write_text("".join(parts), encoding="utf-8")
    return path
