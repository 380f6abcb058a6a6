"""The reference ``rlms`` package (``from rlm import RLM``) with its local REPL: one run, answer as
JSON. Runs in its own virtual environment, so it imports nothing of this project.

    python bench/drivers/rlms_run.py BASE_URL QUESTION CONTEXT_FILE MAX_ITERS MAX_DEPTH
"""

from __future__ import annotations

import json
import sys

from rlm import RLM


def main() -> None:
    base_url, question, context_file, max_iters, max_depth = sys.argv[1:6]
    rlm = RLM(
        backend="openai",
        backend_kwargs={"model_name": "oracle", "base_url": base_url, "api_key": "sk-bench"},
        environment="local",
        max_iterations=int(max_iters),
        max_depth=int(max_depth),
    )
    with open(context_file, encoding="utf-8") as f:
        context = f.read()
    result = rlm.completion(context, root_prompt=question)
    print(json.dumps({"answer": str(result.response)}))


if __name__ == "__main__":
    main()
