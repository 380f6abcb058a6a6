"""The CLI through its real wire: console scripts in subprocesses, against the scripted LM."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS, write_haystack

BIN = Path(sys.executable).parent


def cli(*args: str, env: dict, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "fleet-rlm"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=timeout,
    )


def test_help_does_not_load_the_runtime() -> None:
    probe = (
        "import sys, fleet_rlm.cli.main as m; m.build_parser();"
        "print(*(name in sys.modules for name in ('dspy', 'litellm', 'pydantic', 'rich', 'asyncio')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False False False False"  # a parser for --help, nothing of the runtime
    assert "run" in subprocess.run([str(BIN / "fleet-rlm"), "--help"], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_run_needle_over_5mb_file_json(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    hay = write_haystack(tmp_path / "big.log", 5_000_000, "Z9X8")
    proc = cli("run", "What is the secret code?", "--context", str(hay), "--json", env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout holds exactly one JSON object
    assert result["answer"] == "Z9X8" and result["status"] == "succeeded"
    for key in ("run_id", "iterations", "llm_calls", "usage", "seconds"):
        assert key in result
    chunks = -(-len(hay.read_text()) // 100_000)
    assert result["llm_calls"] == 3 + chunks  # 3 root steps, one sub-query per 100K chunk

    trace = cli("trace", result["run_id"], env=fleet_env)
    assert trace.returncode == 0, trace.stderr
    assert all(f"step {n}" in trace.stdout for n in (1, 2, 3))
    assert f"{chunks} sub-queries" in trace.stdout and "Z9X8" in trace.stdout

    runs = json.loads(cli("runs", "--json", env=fleet_env).stdout)
    assert runs[0]["run_id"] == result["run_id"]
    lines = cli("export", result["run_id"], env=fleet_env).stdout.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert sum(e["kind"] == "subcall.finished" for e in events) == chunks


@pytest.mark.slow
def test_run_64_batched_subqueries_from_stdin(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(
        Scenario(
            "classify",
            [
                "lines = context.splitlines()\n"
                "labels = llm_query_batched(['Label: ' + l for l in lines])\nprint(len(labels))",
                "SUBMIT(str(sum(l == 'NONE' for l in labels)))",
            ],
        )
    )
    text = "\n".join(f"record {i}" for i in range(64))
    proc = cli("run", "classify these", "--context", "-", "--json", env=fleet_env, stdin=text)
    result = json.loads(proc.stdout)
    assert result["answer"] == "64" and result["llm_calls"] == 66
    trace = json.loads(cli("trace", result["run_id"], "--json", env=fleet_env).stdout)
    assert len(trace["nodes"]["root"]["steps"][0]["subcalls"]) == 64


def test_missing_model_is_one_clear_line(fleet_env: dict) -> None:
    env = {k: v for k, v in fleet_env.items() if k != "FLEET_LM_MODEL"}
    proc = subprocess.run(
        [str(BIN / "fleet-rlm"), "run", "q", "--text", "x"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "FLEET_LM_MODEL"} | env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: No model configured") and "Traceback" not in proc.stderr
    assert "MCP" not in proc.stderr  # the MCP face's hint about client configuration is its own


@pytest.mark.slow
def test_volumes_roundtrip(fleet_env: dict, tmp_path: Path) -> None:
    note = tmp_path / "note.md"
    note.write_text("remember the milk")
    assert cli("volumes", "put", str(note), "notes/memory/note.md", env=fleet_env).returncode == 0
    listing = json.loads(cli("volumes", "ls", "--json", env=fleet_env).stdout)
    assert [v["name"] for v in listing] == ["notes"]
    assert cli("volumes", "cat", "notes/memory/note.md", env=fleet_env).stdout == "remember the milk"
    escape = cli("volumes", "cat", "notes/../../etc/passwd", env=fleet_env)
    assert escape.returncode != 0 and "escapes" in escape.stderr
    assert cli("volumes", "rm", "notes/memory/note.md", env=fleet_env).returncode == 0
    assert cli("volumes", "cat", "notes/memory/note.md", env=fleet_env).returncode != 0


@pytest.mark.slow
def test_config_keeps_secrets_out_of_files(fleet_env: dict) -> None:
    assert cli("config", "set", "max_iters", "7", env=fleet_env).returncode == 0
    assert cli("config", "get", "max_iters", env=fleet_env).stdout.strip() == "7"
    bad = cli("config", "set", "max_iters", "zero", env=fleet_env)
    assert bad.returncode == 2 and "max_iters" in bad.stderr.lower()
    secret = cli("config", "set", "lm_api_key", "sk-should-never-hit-disk", env=fleet_env)
    assert secret.returncode == 2 and "keyring" in secret.stderr and "FLEET_LM_API_KEY" in secret.stderr
    home = Path(fleet_env["FLEET_HOME"])
    assert all(b"sk-should-never-hit-disk" not in p.read_bytes() for p in home.rglob("*") if p.is_file())
    listing = cli("config", "list", env=fleet_env).stdout
    assert fleet_env["FLEET_LM_API_KEY"] not in listing and "lm_api_key" in listing


@pytest.mark.slow
def test_doctor_reports_model_and_isolation(fleet_env: dict) -> None:
    proc = cli("doctor", "--json", env=fleet_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["model"]["ok"] and "answered" in report["model"]["detail"]
    assert report["sandbox"]["isolation"] in {"bwrap", "none"}
    assert set(report) >= {"keyring", "store", "caps"}
    down = cli("doctor", "--json", env={**fleet_env, "FLEET_LM_API_BASE": "http://127.0.0.1:9/v1"})
    assert down.returncode == 1 and "cannot reach" in json.loads(down.stdout)["model"]["detail"]


@pytest.mark.slow
def test_chat_follow_up_uses_repl_state(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("alpha beta gamma delta")
    oracle.add(Scenario("third word", ["w = context.split()[2]\nSUBMIT(w)"]))
    oracle.add(Scenario("again", ["SUBMIT(w.upper())"]))
    script = f"/attach {doc}\nwhat is the third word?\nnow say it again louder\n/quit\n"
    proc = subprocess.run(
        [str(BIN / "fleet")], input=script, capture_output=True, text=True, env={**os.environ, **fleet_env}, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    answers = [line for line in proc.stdout.splitlines() if line.strip() and not line.startswith(">")]
    assert "gamma" in proc.stdout and "GAMMA" in proc.stdout, (answers, proc.stderr)


@pytest.mark.slow
def test_killed_process_leaves_run_interrupted_with_events(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("hang", ["print('working')", "import time\ntime.sleep(120)"]))
    proc = subprocess.Popen(
        [str(BIN / "fleet-rlm"), "run", "hang please", "--text", "x", "--json"],
        env={**os.environ, **fleet_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    db = Path(fleet_env["FLEET_HOME"]) / "fleet.db"
    deadline = time.monotonic() + 60
    seen = 0
    while time.monotonic() < deadline and seen < 5:  # started, context, lm, code, lm
        time.sleep(0.2)
        if db.exists():
            try:
                with sqlite3.connect(db) as conn:
                    seen = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
            except sqlite3.OperationalError:  # the schema is still being created
                continue
    assert seen >= 5, "the run never got going"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    runs = json.loads(cli("runs", "--json", env=fleet_env).stdout)
    assert runs[0]["status"] == "interrupted"  # the first look notices the dead owner
    assert (Path(fleet_env["FLEET_HOME"]) / "work" / runs[0]["run_id"]).is_dir()  # left behind by the kill
    # The next start of the runtime removes the scratch folder nobody owns any more.
    cli("run", "anything", "--text", "x", "--json", env=fleet_env)
    run = next(r for r in json.loads(cli("runs", "--json", env=fleet_env).stdout) if r["question"] == "hang please")
    assert run["status"] == "interrupted"
    assert not (Path(fleet_env["FLEET_HOME"]) / "work" / run["run_id"]).exists()  # scratch cleaned up
    events = [json.loads(line) for line in cli("export", run["run_id"], env=fleet_env).stdout.splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[:4] == ["run.started", "context.loaded", "lm.call", "code.executed"]
    assert kinds[-1] == "run.finished" and events[-1]["data"]["status"] == "interrupted"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


@pytest.fixture(autouse=True)
def _no_stray_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.mark.slow
def test_serve_mcp_refuses_open_bind_without_auth(fleet_env: dict) -> None:
    env = {k: v for k, v in fleet_env.items()}
    proc = subprocess.run(
        [
            str(BIN / "fleet-rlm"),
            "serve-mcp",
            "--transport",
            "http",
            "--host",
            "0.0.0.0",
            "--allow-remote",
            "--no-auth",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "FLEET_MCP_TOKEN"} | env,
    )
    assert proc.returncode == 2
    assert "drop --no-auth" in proc.stderr and "FLEET_MCP_TOKEN" in proc.stderr and proc.stdout == ""


@pytest.mark.slow
def test_chat_ctrl_c_cancels_the_run_not_the_chat(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("slow one", ["import time\ntime.sleep(60)\nSUBMIT('late')"]))
    oracle.add(Scenario("quick one", ["SUBMIT('quick answer')"]))
    proc = subprocess.Popen(
        [str(BIN / "fleet")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **fleet_env},
    )
    proc.stdin.write("slow one please\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not oracle.requests("root"):
        time.sleep(0.1)
    time.sleep(0.5)  # the slow step is running in the sandbox now
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate("quick one\n/quit\n", timeout=60)
    assert proc.returncode == 0, err
    assert "cancelled" in err and "quick answer" in out
    runs = json.loads(cli("runs", "--json", env=fleet_env).stdout)
    assert [r["status"] for r in runs] == ["succeeded", "cancelled"]


@pytest.mark.slow
@pytest.mark.usefixtures("ctrl_c_reaches_children")
def test_run_ctrl_c_records_cancelled(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("slow one", ["import time\ntime.sleep(60)\nSUBMIT('late')"]))
    proc = subprocess.Popen(
        [str(BIN / "fleet-rlm"), "run", "slow one", "--text", "x"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **fleet_env},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not oracle.requests("root"):
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert json.loads(cli("runs", "--json", env=fleet_env).stdout)[0]["status"] == "cancelled"


@pytest.mark.slow
def test_run_reads_every_reply_form_without_extra_calls(fleet_env: dict, oracle: OracleLM) -> None:
    """A model that answers each step in another form (JSON, tags, prose and one block ...): each is
    read as it comes, the run takes one model call per step, and the forms are counted."""
    steps = [
        'RAW:{"reasoning": "Start.", "code": "```python\\nx = 1\\nprint(x)\\n```"}',
        'RAW:```json\n{"reasoning": "Next.", "code": "x += 1\\nprint(x)"}\n```\nShall I go on?',
        "RAW:Add one more.\n\n```python\nx += 1\nprint(x)\n```",
        "RAW:<reasoning>And one.</reasoning>\n<code>\n```python\nx += 1\nprint(x)\n```\n</code>",
        "RAW:[[ ## reasoning ## ]]\nOnce more.\n\n[[ ## code ## ]]\n```python\nx += 1\nprint(x)\n```",
        "SUBMIT(x)",
    ]
    oracle.add(Scenario("count in every form", steps))
    proc = cli("run", "count in every form", "--text", "x", "--json", env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["answer"] == "5" and result["iterations"] == len(steps)
    assert len(oracle.requests("root")) == len(steps)
    forms = {"json": 2, "prose_code": 1, "xml": 1, "fields_unclosed": 1, "fields": 1}
    assert result["usage"]["reply_forms"] == forms
    trace = json.loads(cli("trace", result["run_id"], "--json", env=fleet_env).stdout)
    shown = [s["lm"]["reply_form"] for s in trace["nodes"]["root"]["steps"]]
    assert shown == ["json", "json", "prose_code", "xml", "fields_unclosed", "fields"]


@pytest.mark.slow
def test_prompt_cache_share_and_saving_in_run_and_trace(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("count to two", ["x = 1\nprint(x)", "SUBMIT(x + 1)"]))
    oracle.state.cache_reads = 100  # each reply reports 100 prompt tokens read from the provider's cache
    env = {**fleet_env, "FLEET_LM_MODEL": "openai/gpt-4o-mini"}  # LiteLLM prices its cache reads
    result = json.loads(cli("run", "count to two", "--json", env=env).stdout)
    total = result["usage"]["total"]
    assert total["cached_tokens"] == 200 and total["saved"] > 0
    share = f"{200 / total['prompt_tokens']:.0%} of prompt cached"

    summary = cli("run", "count to two", env=env).stderr
    assert f"{share}, ${total['saved']:.4f} saved" in summary

    trace = cli("trace", result["run_id"], env=env).stdout
    assert f"{share}, ${total['saved']:.4f} saved" in trace  # the run's line
    assert trace.count("of prompt cached") == 3  # and each step's
