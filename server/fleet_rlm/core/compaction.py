"""Runs longer than a window: the root transcript is compacted before it passes the root model's context
window (docs/limits.md, "Longer than a window").

Before a step's model call the loop (``program.RLMProgram``) measures the prompt it is about to send
against the window (``settings.lm_context_window``, else LiteLLM's figure for the model); at
``settings.compact_at`` of it (85%) the steps so far but the last are folded into one summary, written
by one budgeted call of the root model (recorded like every model call, so replay and fork answer it).
The compacted transcript is the opening observation, the summary and the last step verbatim; later
steps are appended to it, so from the compaction on each prompt is again a prefix of the next and
the provider's prompt cache hits. The REPL keeps every step as ``history`` (``NodeRuntime`` puts it
there after each step) and the trace keeps every event unchanged.

A leaf of the runtime: it imports nothing of the package, so the loop and the node both use it.
"""

from __future__ import annotations

import functools
from typing import Any, Final

CHARS_PER_TOKEN: Final = 4  # a rough figure for English and code; providers' own counts correct it (NodeRuntime)
SUMMARY_SHARE: Final = 0.2  # of the window, at most, for the summary (and never more than SUMMARY_CHARS)
SUMMARY_CHARS: Final = 12_000
SUMMARY_HEADER: Final = "\n\n=== Earlier steps, compacted ==="

SUMMARY_INSTRUCTIONS: Final = (
    "You compact the working notes of a program that answers a query by writing Python code in a "
    "persistent REPL, one step at a time. Write a faithful summary of the steps you are given, for the "
    "program to go on from: what was found (exact names, numbers, offsets, variable names and what they "
    "hold), what was tried and failed, and what remains to do. Plain text, no code blocks; keep every "
    "figure the answer may need."
)


def estimate_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


@functools.lru_cache(maxsize=64)
def context_window(model: str | None) -> int | None:
    """The model's input window in tokens from LiteLLM's model map as dspy ships it; None when it has no
    figure (local servers: set FLEET_LM_CONTEXT_WINDOW / FLEET_SUB_LM_CONTEXT_WINDOW)."""
    if not model:
        return None
    provider, slash, name = model.partition("/")
    try:
        if slash:
            from dspy.clients.model_metadata import model_info

            info: dict[str, Any] = dict(model_info(provider, name))
        else:
            import litellm

            info = dict(litellm.get_model_info(model))
    except Exception:  # not in the map
        return None
    window = info.get("max_input_tokens") or info.get("max_tokens")
    return int(window) if isinstance(window, int | float) and window > 0 else None


def summary_chars(window: int) -> int:
    """The longest summary kept, in characters, for a window of ``window`` tokens."""
    return max(500, min(SUMMARY_CHARS, int(window * SUMMARY_SHARE * CHARS_PER_TOKEN)))


def summary_prompt(query: str, previous: str, steps: str, first: int, last: int) -> str:
    """The summary call's prompt: what to write, the query, the summary so far (of steps before ``first``)
    and the steps ``first``..``last`` as the transcript showed them."""
    earlier = f"Summary of steps 1-{first - 1} (fold it in):\n{previous}\n\n" if previous else ""
    return (
        f"{SUMMARY_INSTRUCTIONS}\n\nSummarise steps {first}-{last} of the REPL work below into one summary of "
        f"steps 1-{last}.\n\nThe query: {query}\n\n{earlier}Steps {first}-{last}:{steps}"
    )


def compacted_transcript(opening: str, summary: str, through: int, last_step: str) -> str:
    """The transcript after a compaction: the opening observation, the summary of steps 1..``through``,
    then the last step as it was shown (``program.render_step``)."""
    return (
        f"{opening}{SUMMARY_HEADER}\nSteps 1-{through}, summarised (every step's code and output is in the "
        f"REPL variable `history`, a list of {{step, code, output}}):\n{summary.strip()}{last_step}"
    )
