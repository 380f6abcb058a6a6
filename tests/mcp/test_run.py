"""The run tools end to end over the scripted LM, in both protocol eras."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from fleet_rlm.config import load_settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.mcp.server import build_server
from mcp import Client
from tests.support.oracle_lm import OracleLM
from tests.support.workloads import NEEDLE_STEPS, write_haystack

pytestmark = pytest.mark.anyio


async def test_run_finds_needle_in_5mb_file_with_progress(client: Client, needle: OracleLM, tmp_path: Path) -> None:
    hay = write_haystack(tmp_path / "hay.txt", 5_000_000, "ZEBRA7")
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    result = await client.call_tool(
        "run", {"question": "What is the secret code?", "context_paths": [str(hay)]}, progress_callback=on_progress
    )
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None
    assert out["status"] == "succeeded" and out["answer"] == "ZEBRA7"
    assert out["iterations"] == len(NEEDLE_STEPS)
    assert out["llm_calls"] == len(needle.requests())  # root steps + one sub-query per 100k chunk
    assert out["trace_uri"] == f"fleet://runs/{out['run_id']}/trace"
    # Text content carries the same JSON for clients that ignore structured content.
    assert json.loads(result.content[0].text)["answer"] == "ZEBRA7"  # type: ignore[union-attr]

    messages = [m for _, _, m in progress]
    values = [v for v, _, _ in progress]
    assert len(progress) >= 6, messages
    assert values == sorted(values) and len(set(values)) == len(values)  # strictly increasing
    assert messages[0] == f"run {out['run_id']} started"
    assert "step 1 · running code" in messages and "step 3 · answer submitted" in messages
    chunks = -(-len(hay.read_text()) // 100_000)  # NEEDLE_STEPS reads 100k characters per sub-query
    batch = [m for m in messages if m and "sub-queries" in m]
    assert batch and batch[-1] == f"step 2 · {chunks}/{chunks} sub-queries", batch
    assert messages[-1] == "run succeeded"

    trace = json.loads((await client.read_resource(out["trace_uri"])).contents[0].text)  # type: ignore[union-attr]
    assert trace["run"]["answer"] == "ZEBRA7"
    assert [s["step"] for s in trace["nodes"]["root"]["steps"]] == [1, 2, 3]
    assert len(trace["nodes"]["root"]["steps"][1]["subcalls"]) == chunks


async def test_inspect_trace_pages_steps_and_subcalls(client: Client, needle: OracleLM, tmp_path: Path) -> None:
    hay = write_haystack(tmp_path / "hay.txt", 950_000, "K7Q2")  # 10 chunks of 100k
    run = await client.call_tool("run", {"question": "What is the secret code?", "context_paths": [str(hay)]})
    run_id = run.structured_content["run_id"]  # type: ignore[index]

    page = (await client.call_tool("inspect_trace", {"run_id": run_id, "limit": 2})).structured_content
    assert page is not None
    assert page["steps_total"] == 3 and page["has_more"] is True and page["nodes"] == ["root"]
    first, second = page["steps"]
    assert first["step"] == 1 and first["code_preview"].startswith("print(len(context)")
    assert second["subcalls"] == 10 and "llm_query_batched" in second["code_preview"]
    assert "code" not in first  # summaries carry previews, not the bulk

    rest = (await client.call_tool("inspect_trace", {"run_id": run_id, "offset": 2})).structured_content
    assert [s["step"] for s in rest["steps"]] == [3] and rest["has_more"] is False  # type: ignore[index]
    assert rest["steps"][0]["submitted"] is True  # type: ignore[index]

    full = (await client.call_tool("inspect_trace", {"run_id": run_id, "detail": "full"})).structured_content
    assert full["steps"][1]["code"] == NEEDLE_STEPS[1]  # type: ignore[index]

    step = (
        await client.call_tool("inspect_trace", {"run_id": run_id, "step": 2, "offset": 8, "limit": 5})
    ).structured_content
    assert step is not None and step["steps"] == []
    detail = step["step"]
    assert detail["code"] == NEEDLE_STEPS[1] and detail["subcalls_total"] == 10
    assert [s["index"] for s in detail["subcalls"]] == [8, 9] and step["has_more"] is False
    assert all(s["prompt_preview"].startswith("Report the secret code") for s in detail["subcalls"])
    assert sum(s["response_preview"] == "K7Q2" for s in detail["subcalls"]) <= 1

    missing = await client.call_tool("inspect_trace", {"run_id": run_id, "step": 9})
    assert missing.is_error and "steps 1..3" in missing.content[0].text  # type: ignore[union-attr]
    node = await client.call_tool("inspect_trace", {"run_id": run_id, "node": "root.7"})
    assert node.is_error and "its nodes are: root" in node.content[0].text  # type: ignore[union-attr]
    unknown = await client.call_tool("inspect_trace", {"run_id": "r-nope"})
    assert unknown.is_error and "no run 'r-nope'" in unknown.content[0].text  # type: ignore[union-attr]


async def test_start_run_then_get_run_until_done(client: Client, needle: OracleLM, tmp_path: Path) -> None:
    hay = write_haystack(tmp_path / "hay.txt", 300_000, "OWL5")
    started = await client.call_tool("start_run", {"question": "What is the secret code?", "context_paths": [str(hay)]})
    out = started.structured_content
    assert out is not None and out["status"] in ("queued", "running")
    run_id = out["run_id"]
    assert out["run_uri"] == f"fleet://runs/{run_id}"
    with anyio.fail_after(60):
        while True:
            state = (await client.call_tool("get_run", {"run_id": run_id})).structured_content
            assert state is not None
            if state["status"] not in ("queued", "running"):
                break
            await anyio.sleep(0.05)
    assert state["status"] == "succeeded" and state["answer"] == "OWL5"
    assert state["progress"]["root_steps"] == 3 and state["progress"]["message"] == "run succeeded"
    assert state["progress"]["llm_calls"] == state["llm_calls"] == len(needle.requests())
    listed = (await client.call_tool("list_runs", {"status": "succeeded"})).structured_content
    assert [r["run_id"] for r in listed["runs"]] == [run_id]  # type: ignore[index]
    resource = json.loads((await client.read_resource(f"fleet://runs/{run_id}")).contents[0].text)  # type: ignore[union-attr]
    assert resource["answer"] == "OWL5" and resource["status"] == "succeeded"


@pytest.mark.slow
async def test_client_cancelling_run_cancels_it(fleet_env: dict, slow: OracleLM, era: str) -> None:
    async with Engine(load_settings()) as engine:  # shared: the test can look at the store
        async with Client(build_server(engine), mode=era) as client:
            messages: list[str] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                messages.append(message or "")

            with anyio.move_on_after(2.5) as scope:
                await client.call_tool(
                    "run", {"question": "take your time", "context_text": "x"}, progress_callback=on_progress
                )
            assert scope.cancelled_caught, "the run should still have been going"
            assert "step 1 · running code" in messages, messages
            run_id = messages[0].split()[1]
            with anyio.fail_after(20):
                while (rec := engine.get_run(run_id)) is None or rec.status != "cancelled":
                    await anyio.sleep(0.05)
            assert engine.events(run_id)[-1]["data"]["status"] == "cancelled"
            # The session survives the cancelled call.
            state = (await client.call_tool("get_run", {"run_id": run_id})).structured_content
            assert state is not None and state["status"] == "cancelled"
        # A shared engine stays open after the MCP server is done with it.
        assert engine.get_run(run_id) is not None


async def test_cancel_run_tool(client: Client, slow: OracleLM) -> None:
    started = await client.call_tool("start_run", {"question": "take your time", "context_text": "x"})
    run_id = started.structured_content["run_id"]  # type: ignore[index]
    with anyio.fail_after(20):  # wait until it is really running code
        while (await client.call_tool("get_run", {"run_id": run_id})).structured_content["progress"]["step"] < 1:  # type: ignore[index]
            await anyio.sleep(0.05)
    first = (await client.call_tool("cancel_run", {"run_id": run_id})).structured_content
    assert first == {"run_id": run_id, "cancelled": True, "status": "cancelled", "message": "cancelled"}
    again = (await client.call_tool("cancel_run", {"run_id": run_id})).structured_content
    assert again is not None and again["cancelled"] is False and "already ended" in again["message"]
    listed = (await client.call_tool("list_runs", {"status": "cancelled"})).structured_content
    assert [r["run_id"] for r in listed["runs"]] == [run_id]  # type: ignore[index]


async def test_user_errors_are_tool_errors(client: Client, needle: OracleLM, monkeypatch: pytest.MonkeyPatch) -> None:
    bad_path = await client.call_tool("run", {"question": "q", "context_paths": ["/no/such/file.txt"]})
    assert bad_path.is_error
    assert "context path '/no/such/file.txt' does not exist" in bad_path.content[0].text  # type: ignore[union-attr]
    blank = await client.call_tool("start_run", {"question": "   "})
    assert blank.is_error and "question is empty" in blank.content[0].text  # type: ignore[union-attr]
    too_many = await client.call_tool("run", {"question": "q", "max_iters": 0})
    assert too_many.is_error and "max_iters" in too_many.content[0].text  # type: ignore[union-attr]
    unknown = await client.call_tool("get_run", {"run_id": "r-missing"})
    assert unknown.is_error and "list_runs" in unknown.content[0].text  # type: ignore[union-attr]
    assert not needle.requests()  # nothing reached the model


async def test_missing_model_is_a_clear_tool_error(fleet_env: dict, era: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_LM_MODEL")
    async with Client(build_server(), mode=era) as client:
        result = await client.call_tool("run", {"question": "q", "context_text": "x"})
        assert result.is_error and "FLEET_LM_MODEL" in result.content[0].text  # type: ignore[union-attr]
        doctor = (await client.call_tool("doctor", {})).structured_content
    assert doctor is not None and doctor["ok"] is False
    assert doctor["checks"]["model"]["ok"] is False and "FLEET_LM_MODEL" in doctor["checks"]["model"]["fix"]


async def test_session_id_keeps_the_repl_between_calls(client: Client, oracle: OracleLM) -> None:
    from tests.support.oracle_lm import Scenario

    oracle.add(Scenario("remember the word", ["word = context.split()[1]\nSUBMIT(word)"]))
    oracle.add(Scenario("shout the word", ["SUBMIT(word.upper())"]))
    first = await client.call_tool(
        "run", {"question": "remember the word", "context_text": "alpha bravo charlie", "session_id": "chat-1"}
    )
    second = await client.call_tool("run", {"question": "shout the word", "session_id": "chat-1"})
    assert first.structured_content["answer"] == "bravo"  # type: ignore[index]
    assert second.structured_content["answer"] == "BRAVO"  # type: ignore[index]
    bad = await client.call_tool("run", {"question": "q", "context_text": "x", "session_id": "no spaces allowed"})
    assert bad.is_error and "session id" in bad.content[0].text  # type: ignore[union-attr]
