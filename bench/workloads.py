"""The benchmark's workloads: seeded generators, the root policy each one plays (code steps that a
capable model would write), the answer it must reach, and ``read``, the sub-model that answers
sub-queries from the text they carry.

The same code steps run in every runtime: ``context`` is the input, ``llm_query[_batched]`` and
``rlm_query`` are the host functions, and ``SUBMIT(x)`` ends the run (the simulated server
rewrites it into ``rlms``' ``answer`` dict for that package). Every question carries a unique
``[bench:...]`` tag, which is how the server knows which policy to play.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.oracle_lm import default_sub
from tests.support.workloads import write_haystack

POSITIVE = ("delighted", "excellent", "grateful", "reliable", "smooth")
NEGATIVE = ("broken", "furious", "late", "rude", "unusable")
NAMES = (
    "Ana Silva",
    "Bruno Costa",
    "Chen Wei",
    "Dara Okafor",
    "Eli Novak",
    "Fatima Zahra",
    "Goran Ilic",
    "Hana Sato",
    "Ivan Petrov",
    "Jonas Berg",
    "Kira Lund",
    "Luis Ortega",
    "Mei Tan",
    "Nils Dahl",
)
OFFICES = ("Lisbon", "Osaka", "Nairobi", "Toronto", "Krakow", "Santiago", "Oslo", "Perth")


@dataclass(frozen=True)
class Workload:
    """One question with its input, the policy's root steps and the answer it should reach."""

    tag: str
    question: str
    steps: tuple[str, ...]
    expected: str
    write_context: Callable[[Path], None] = field(repr=False)
    subcalls: int = 0  # sub-queries the policy makes (for the budget)

    @property
    def max_iters(self) -> int:
        return len(self.steps) + 1


def read(prompt: str) -> str:
    """The simulated sub-model: reads the instruction at the head of the prompt and answers it."""
    if prompt.startswith("LABEL:"):
        words = set(re.findall(r"[a-z]+", prompt.lower()))
        return "positive" if words & set(POSITIVE) else "negative" if words & set(NEGATIVE) else "neutral"
    if prompt.startswith("EXTRACT manager:"):
        found = re.search(r"manager is ([A-Z]\w+ [A-Z]\w+)", prompt)
        return found.group(1) if found else "NONE"
    if prompt.startswith("EXTRACT office:"):
        found = re.search(r"works in the (\w+) office", prompt)
        return found.group(1) if found else "NONE"
    if prompt.startswith("ECHO:"):
        return prompt.split()[-1]
    return default_sub(prompt)


def _text_writer(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text, encoding="utf-8")


def overhead(size: int, label: str, steps: int) -> Workload:
    """``steps`` cheap steps over a ``size``-character log: the per-step cost of the runtime itself."""
    line = "2026-11-29T10:00:00 service=api level=info msg=request served in 12ms\n"
    tag = f"[bench:overhead:{label}:{steps}]"
    code = ("x = len(context)",) * (steps - 1) + ("SUBMIT('done')",)
    return Workload(
        tag,
        f"{tag} measure the step cost",
        code,
        "done",
        lambda path: path.write_text((line * (size // len(line) + 1))[:size], encoding="utf-8"),
    )


# Chunks of 100K characters, 200 per batch: this project refuses a host call over 64 MB (it says
# so, and a model adapts), and rlms' prompt asks for batches of about twenty.
NEEDLE_STEPS = (
    "print(len(context), len(sources) if 'sources' in dir() else 1)\nprint(context[:200])",
    "size = 100_000\nchunks = [context[i:i + size] for i in range(0, len(context), size)]\nanswers = []\n"
    "for g in range(0, len(chunks), 200):\n"
    "    prompts = ['Report the secret code in this text, or NONE:\\n' + c for c in chunks[g:g + 200]]\n"
    "    answers += llm_query_batched(prompts)\n"
    "found = [a.strip() for a in answers if a.strip() not in ('NONE', '') and not a.startswith(('[ERROR]', 'Error'))]\n"
    "print(len(chunks), found)",
    "SUBMIT(found[0] if found else 'not found')",
)


def needle(size: int, seed: int = 7) -> Workload:
    """S-NIAH: one 'The secret code is X.' in a ``size``-character haystack, found by chunked sub-queries."""
    code = f"K{random.Random(seed * 31 + size).randrange(10**6):06d}"
    tag = f"[bench:needle:{size}]"
    chunks = -(-size // 100_000)
    return Workload(
        tag,
        f"{tag} What is the secret code?",
        NEEDLE_STEPS,
        code,
        lambda path: write_haystack(path, size, code, seed=seed),
        subcalls=chunks,
    )


def _records(n: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    rng = random.Random(seed)
    lines, labels, users = [], [], []
    for i in range(n):
        label = rng.choice(("positive", "negative", "neutral"))
        word = rng.choice(POSITIVE if label == "positive" else NEGATIVE if label == "negative" else ("fine",))
        user = f"user{rng.randrange(max(2, n // 4))}"
        lines.append(f"record {i} | {user} | the delivery was {word} and the desk noted it on day {rng.randrange(365)}")
        labels.append(label)
        users.append(user)
    return lines, labels, users


_LABEL_STEPS = (
    "lines = [l for l in context.splitlines() if l.startswith('record ')]\nprint(len(lines), lines[:2])",
    "labels = [a.strip() for a in llm_query_batched(['LABEL: ' + l for l in lines])]\n"
    "users = [l.split(' | ')[1] for l in lines]\nprint(labels[:5])",
)


def oolong(n: int, seed: int = 11) -> Workload:
    """OOLONG-style aggregation: each record's label comes from a sub-query; the answer is a count."""
    lines, labels, _ = _records(n, seed)
    tag = f"[bench:oolong:{n}]"
    steps = (*_LABEL_STEPS, "SUBMIT(str(sum(a == 'positive' for a in labels)))")
    return Workload(
        tag,
        f"{tag} How many records are positive?",
        steps,
        str(labels.count("positive")),
        _text_writer("\n".join(lines) + "\n"),
        subcalls=n,
    )


def pairs(n: int, seed: int = 13) -> Workload:
    """OOLONG-Pairs-style: pairs of positive records from different users, quadratic in records."""
    lines, labels, users = _records(n, seed)
    expected = sum(
        1 for i in range(n) for j in range(i + 1, n) if labels[i] == labels[j] == "positive" and users[i] != users[j]
    )
    tag = f"[bench:pairs:{n}]"
    count = (
        "n = len(lines)\nfound = sum(1 for i in range(n) for j in range(i + 1, n) "
        "if labels[i] == labels[j] == 'positive' and users[i] != users[j])\nSUBMIT(str(found))"
    )
    return Workload(
        tag,
        f"{tag} How many pairs of positive records come from different users?",
        (*_LABEL_STEPS, count),
        str(expected),
        _text_writer("\n".join(lines) + "\n"),
        subcalls=n,
    )


def multihop(docs: int, seed: int = 17) -> Workload:
    """Two hops over generated documents: who is X's manager, then where does that manager work."""
    rng = random.Random(seed)
    people = list(NAMES)
    rng.shuffle(people)
    subject, manager = people[0], people[1]
    office = rng.choice(OFFICES)
    facts = [f"{subject}'s manager is {manager}.", f"{manager} works in the {office} office."]
    for other in people[2:]:
        facts.append(f"{other} works in the {rng.choice(OFFICES)} office.")
    filler = "Minutes of the weekly meeting: budgets, rotas and the cafeteria survey were discussed."
    texts = [f"Document {i}: {filler}" for i in range(docs)]
    for fact in facts:
        texts[rng.randrange(docs)] += " " + fact
    tag = f"[bench:multihop:{docs}]"
    steps = (
        f"docs = context.split('\\n\\n')\nfirst = next(d for d in docs if \"{subject}'s manager\" in d)\n"
        "manager = llm_query('EXTRACT manager: ' + first).strip()\nprint(manager)",
        "second = next(d for d in docs if manager + ' works in' in d)\n"
        "office = llm_query('EXTRACT office: ' + second).strip()\nprint(office)",
        "SUBMIT(office)",
    )
    return Workload(
        tag,
        f"{tag} In which office does {subject}'s manager work?",
        steps,
        office,
        _text_writer("\n\n".join(texts) + "\n"),
        subcalls=2,
    )


def long_loop(steps: int = 50) -> Workload:
    """``steps`` steps that each print a little, then SUBMIT: how the root prompt grows."""
    tag = f"[bench:loop:{steps}]"
    code = tuple(f"print('step {k}:', context[{k * 60}:{k * 60 + 60}])" for k in range(steps))
    text = "".join(f"line {i:05d} of the running log, nothing to see here ......\n" for i in range(steps + 10))
    return Workload(tag, f"{tag} Walk the log", (*code, f"SUBMIT('{steps}')"), str(steps), _text_writer(text))


def fanout(n: int) -> Workload:
    """One batch of ``n`` sub-queries, timed inside the REPL; the answer carries the count and time."""
    tag = f"[bench:fanout:{n}]"
    steps = (
        "import time\nt = time.perf_counter()\n"
        f"answers = llm_query_batched([f'ECHO: slot C{{i}}' for i in range({n})])\n"
        "seconds = time.perf_counter() - t\nprint(round(seconds, 4))",
        "SUBMIT(f\"{sum(a.strip() == f'C{i}' for i, a in enumerate(answers))} in {seconds:.4f}s\")",
    )
    return Workload(tag, f"{tag} Fan out", steps, str(n), _text_writer("x"), subcalls=n)


# A child RLM's policy. rlms shows a child only its context's length, never its text, so the
# server plays this for any root request no tagged workload claims.
CHILD_STEPS = ("q = query if 'query' in dir() else context\nSUBMIT(str(q).split()[-1])",)


def children(k: int, function: str) -> Workload:
    """``k`` sequential ``rlm_query`` children (or ``llm_query`` calls, the baseline), timed in the REPL."""
    tag = f"[bench:children:{function}:{k}]"
    steps = (
        "import time\nt = time.perf_counter()\n"
        # The tag is split so the parent's own transcript never matches the child's policy.
        f"out = [{function}('ECHO: [bench:' + f'child] slot C{{i}}') for i in range({k})]\n"
        "seconds = time.perf_counter() - t\nprint(out)",
        "SUBMIT(f\"{sum(o.strip() == f'C{i}' for i, o in enumerate(out))} in {seconds:.4f}s\")",
    )
    return Workload(tag, f"{tag} Delegate", steps, str(k), _text_writer("x"), subcalls=k)


def timed_answer(answer: str | None) -> tuple[str | None, float | None]:
    """Split a timed workload's answer 'COUNT in SECONDSs' into its parts."""
    found = re.fullmatch(r"\s*(\S+) in ([0-9.]+)s\s*", answer or "")
    return (found.group(1), float(found.group(2))) if found else (answer, None)


def load(batch: int = 16) -> Workload:
    """One run of the `fleet web` load wave: a look at the input, one batch of ``batch``
    sub-queries, then SUBMIT the count answered right."""
    tag = "[bench:load]"
    steps = (
        "print(len(context), context[:40])",
        f"answers = llm_query_batched([f'ECHO: slot C{{i}}' for i in range({batch})])\nprint(answers[:3])",
        "SUBMIT(str(sum(a.strip() == f'C{i}' for i, a in enumerate(answers))))",
    )
    return Workload(tag, f"{tag} Fan out once", steps, str(batch), _text_writer("x"), subcalls=batch)


def stuck() -> Workload:
    """A run whose second step sleeps long enough for its sandbox worker to be killed under it."""
    tag = "[bench:fault:stuck]"
    steps = ("print('ready')", "import time\ntime.sleep(120)\nprint('woke')", "SUBMIT('not reached')")
    return Workload(tag, f"{tag} Wait", steps, "", _text_writer("x"))


def overfill(volume: str, megabytes: int) -> Workload:
    """A run that writes ``megabytes`` to a volume, then reports whether its file is still there."""
    tag = "[bench:fault:overfill]"
    path = f"volumes[{volume!r}] + '/artifacts/big.bin'"
    steps = (
        f"open({path}, 'wb').write(b'x' * {megabytes} * 1024 * 1024)",
        f"import os\nSUBMIT('kept' if os.path.exists({path}) else 'trimmed')",
    )
    return Workload(tag, f"{tag} Store a big file", steps, "trimmed", _text_writer("x"))
