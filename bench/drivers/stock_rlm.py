"""Stock ``dspy.RLM`` with ``LocalInterpreter``, as its documentation shows: one run, answer as JSON.

python bench/drivers/stock_rlm.py MODEL BASE_URL QUESTION CONTEXT_FILE MAX_ITERS MAX_LLM_CALLS
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

import dspy
from dspy.primitives.local_interpreter import LocalInterpreter


def main() -> None:
    model, base_url, question, context_file, max_iters, max_llm_calls = sys.argv[1:7]
    lm = dspy.LM(model, api_base=base_url, api_key="sk-bench", cache=False, num_retries=0)
    rlm = dspy.RLM(
        "context, query -> answer",
        max_iters=int(max_iters),
        max_llm_calls=int(max_llm_calls),
        interpreter_factory=LocalInterpreter,
    )
    with open(context_file, encoding="utf-8") as f:
        context = f.read()
    with dspy.context(lm=lm):
        out = rlm(context=context, query=question)
    print(json.dumps({"answer": str(out.answer)}))


if __name__ == "__main__":
    main()
