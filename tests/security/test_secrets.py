"""The configured keys themselves never leave the host process: not in events, run errors, the
SQLite file, MCP replies, logs, or the text the sandbox's code gets back from a failed call.

The scripted model server plays a careless provider: its 400/401/500 replies quote the request's
Authorization header and the bare key. The root key is deliberately not key-shaped ("live…", no
"sk-" prefix), so only masking the configured value itself can hide it.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import sys
from pathlib import Path

import pytest
from mcp.client.stdio import stdio_client

from fleet_rlm.config import Settings
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.html_export import run_html
from fleet_rlm.redaction import RedactingFormatter, redact_text
from fleet_rlm.types import RunRequest
from mcp import Client, StdioServerParameters
from tests.mcp.conftest import fleet_mcp_command, server_env
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.otlp_collector import collecting

pytestmark = pytest.mark.anyio

ROOT_KEY = "live" + secrets.token_hex(16)
SUB_KEY = "sk-live-" + secrets.token_hex(16)
KEYS = (ROOT_KEY, SUB_KEY)
STATUSES = (400, 401, 500)

# The sandbox's code keeps what the failed calls told it, in a volume file and in its answer.
CATCH_STEP = """
import os
caught = []
try:
    llm_query("hello")
except Exception as exc:
    caught.append(f"{type(exc).__name__}: {exc}")
caught += llm_query_batched(["a", "b"])
with open(os.path.join(volumes["leak"], "artifacts", "caught.txt"), "w") as f:
    f.write("\\n".join(caught))
SUBMIT("\\n".join(caught))
"""


@pytest.fixture
def keyed_env(fleet_env: dict[str, str], oracle: OracleLM, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    oracle.state.echo_secrets = True
    keys = {"FLEET_LM_API_KEY": ROOT_KEY, "FLEET_SUB_LM_API_KEY": SUB_KEY}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    oracle.add(Scenario("echo root", ["SUBMIT('never reached')"]))
    oracle.add(Scenario("catch sub", [CATCH_STEP]))
    return {**fleet_env, **keys}


# The provider echoes each key whole, reversed and in 4 pieces (9-10 characters each): no run of 9
# characters of a key, read either way, may be left anywhere.
RUN = 9


def assert_no_key(text: str | bytes, where: str) -> None:
    data = text.encode() if isinstance(text, str) else text
    for key in KEYS:
        for form in (key, key[::-1]):
            runs = {form[i : i + RUN] for i in range(len(form) - RUN + 1)}
            leaked = [run for run in runs if run.encode() in data]
            assert not leaked, f"a configured key (or part of it: {len(leaked)} runs) leaked into {where}"


def assert_home_clean(home: Path) -> None:
    """Every file under FLEET_HOME, the SQLite database and its -wal included, byte by byte."""
    files = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.name == "fleet.db" for p in files)
    for path in files:
        assert_no_key(path.read_bytes(), str(path))


def keys_were_sent(oracle: OracleLM) -> None:
    """The provider really received (and so echoed) both keys: the test is not vacuous."""
    sent = {r.auth for r in oracle.requests()}
    assert f"Bearer {ROOT_KEY}" in sent and f"Bearer {SUB_KEY}" in sent


async def test_model_errors_never_show_the_key(keyed_env: dict[str, str], oracle: OracleLM) -> None:
    home = Path(keyed_env["FLEET_HOME"])
    async with Engine() as engine:
        failed = []
        for status in STATUSES:
            oracle.state.fail_kind = {"root": status}
            failed.append(await engine.run(RunRequest("echo root", context_text=["x"])))
        caught = []
        for status in STATUSES:
            oracle.state.fail_kind = {"sub": status}
            caught.append(await engine.run(RunRequest("catch sub", context_text=["x"], volume="leak")))
            sandbox_file = engine.volumes.path("leak") / "artifacts" / "caught.txt"
            seen = sandbox_file.read_text()
            # The failures did reach the sandbox's code (as an exception and as [ERROR] slots) ...
            assert seen.startswith("RuntimeError: ") and seen.count("[ERROR]") == 2, seen
            assert_no_key(seen, "the text llm_query handed back into the sandbox")  # ... masked
        runs = engine.list_runs(limit=50)
        events = [e for run in runs for e in engine.events(run.id)]
        assert_home_clean(home)  # while open: the -wal file holds the latest writes
    keys_were_sent(oracle)

    assert [r.status for r in failed] == ["failed"] * 3
    for result in failed:
        assert_no_key(json.dumps(result.to_dict()), "a failed run's result")
    for result in (failed[0], failed[2]):  # 400 and 500: the provider's own words got through, masked
        assert "injected failure: request had Authorization: Bearer ***; the key *** is" in result.error  # type: ignore[operator]
    assert "rejected the API key" in failed[1].error  # type: ignore[operator]  # 401: our own sentence
    for result in caught:
        assert result.status == "succeeded" and result.answer and "[ERROR]" in result.answer
        assert_no_key(result.answer, "an answer built from a sub-call's error")
    assert len(runs) == 6 and events
    for run in runs:
        assert_no_key(json.dumps(run.__dict__, default=str), f"run {run.id}'s row")
    assert_no_key(json.dumps(events), "the events")
    assert_home_clean(home)


@pytest.mark.slow
async def test_mcp_replies_and_logs_never_show_the_key(
    keyed_env: dict[str, str], oracle: OracleLM, tmp_path: Path
) -> None:
    """Through the real `fleet-mcp` over stdio: its own settings register the keys it must mask."""
    command, *args = fleet_mcp_command()
    env = server_env(keyed_env) | {"FLEET_MCP_LOG_LEVEL": "DEBUG"}
    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(tmp_path))
    log = tmp_path / "server.log"
    replies = []
    with log.open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            oracle.state.fail_kind = {"root": 500}
            ran = await client.call_tool("run", {"question": "echo root", "context_text": "x"})
            assert ran.structured_content["status"] == "failed"  # type: ignore[index]
            replies.append(ran)
            state = await client.call_tool("get_run", {"run_id": ran.structured_content["run_id"]})  # type: ignore[index]
            replies.append(state)
            oracle.state.fail_kind = {"sub": 400}
            replies.append(
                await client.call_tool("run", {"question": "catch sub", "context_text": "x", "volume": "leak"})
            )
            oracle.state.fail_kind = {"sub": 500}  # doctor's one-line probe looks like a sub-query
            doctor = await client.call_tool("doctor", {"offline": False})
            assert doctor.structured_content["checks"]["model"]["ok"] is False  # type: ignore[index]
            replies.append(doctor)
    keys_were_sent(oracle)
    assert "injected failure" in json.dumps(replies[0].structured_content)
    assert "[ERROR]" in replies[2].structured_content["answer"]  # type: ignore[index]
    assert "injected failure" in json.dumps(replies[3].structured_content)
    for reply in replies:
        assert_no_key(reply.model_dump_json(), "an MCP tool reply")
    assert_no_key(log.read_text(), "the MCP server's log")
    assert_home_clean(Path(keyed_env["FLEET_HOME"]))


def test_reversed_and_split_secrets_are_masked_and_ordinary_text_is_not(fleet_env: dict[str, str]) -> None:
    value = "qq" + secrets.token_hex(14)  # 30 characters, nothing key-shaped
    Settings(daytona_api_key=value)
    quarters = [value[i : i + 8] for i in range(0, 30, 8)]  # 8, 8, 8 and 6 characters
    leaks = [
        value[::-1],
        " ".join(quarters),
        "\n".join(quarters),
        json.dumps(quarters),  # "['…', '…']": quotes, commas and spaces between the pieces
        '"' + '" + "'.join(quarters) + '"',  # as string concatenation
        "\\n".join(quarters),  # a newline escaped inside JSON text
        " ".join(quarters)[::-1],
    ]
    for leak in leaks:
        masked = redact_text(f"provider said: {leak}.")
        assert masked.startswith("provider said: ") and "***" in masked, (leak, masked)
        assert not any(piece in masked or piece[::-1] in masked for piece in quarters), (leak, masked)
    # Pieces out of order, or only some of them, are not matched: the whole key, in order, is needed.
    assert redact_text(" ".join(quarters[1:])) == " ".join(quarters[1:])
    ordinary = "The quick brown fox, 'jumps' over [the] lazy dog;\n" * 1000
    assert redact_text(ordinary) == ordinary


def test_loaded_secrets_are_masked_in_any_text_and_in_logs(fleet_env: dict[str, str]) -> None:
    value = "zz" + secrets.token_hex(8)  # nothing about it looks like a key
    assert redact_text(f"a{value}b") == f"a{value}b"
    Settings(daytona_api_key=value)  # loading settings registers every secret they hold
    assert redact_text(f"a{value}b") == "a***b"
    try:
        raise RuntimeError(f"provider said {value}")
    except RuntimeError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "call failed: %s", (value,), sys.exc_info())
    assert value not in RedactingFormatter().format(record)  # message, arguments and traceback
    Settings(lm_api_key="short")  # too short to mask by value: ordinary words must survive
    assert redact_text("a short story") == "a short story"


# -- secrets in other shapes: after an auth scheme, encoded, case-changed ------------------------

# Prints every shape of the context the test asks about, one a line, and answers with them too.
SHAPES_STEP = """
import base64
t = context
shapes = [t, t.upper(), t.lower(), t.swapcase(), t.encode().hex(), t.encode().hex().upper()]
for prefix in ('', 'u:', 'us:'):  # every alignment of the value inside base64 text
    raw = (prefix + t + '!').encode()
    shapes += [base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip('=')]
print('\\n'.join(shapes))
SUBMIT(' '.join(shapes))
"""


def shapes_of(value: str) -> list[str]:
    """What SHAPES_STEP prints for ``value`` (the encoded ones carry a few characters of their neighbours)."""
    shapes = [value.upper(), value.lower(), value.swapcase(), value.encode().hex(), value.encode().hex().upper()]
    for prefix in ("", "u:", "us:"):
        raw = (prefix + value + "!").encode()
        shapes += [base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("=")]
    return [value, *shapes]


def leaked_runs(data: bytes, value: str, run: int = 12) -> list[str]:
    """Runs of ``run`` characters of any shape of ``value`` found in ``data`` (an encoded shape's first
    and last few characters also encode its neighbours, so a shorter run may stay beside the mask)."""
    found = []
    for shape in shapes_of(value):
        found += [shape[i : i + run] for i in range(len(shape) - run + 1) if shape[i : i + run].encode() in data]
    return found


async def run_and_export(question: str, context: str) -> tuple[str, bytes, str]:
    """One run of SHAPES_STEP on ``context``: its answer, every file under FLEET_HOME (fleet.db and its
    -wal while the engine is open), and the run's shareable HTML export."""
    async with Engine() as engine:
        result = await engine.run(RunRequest(question, context_text=[context]))
        assert result.status == "succeeded", result.error
        page = run_html(result.run_id, engine.events(result.run_id)).html
        files = b"".join(p.read_bytes() for p in engine.settings.home.rglob("*") if p.is_file())
    return result.answer or "", files, page


@pytest.fixture
def shapes_env(fleet_env: dict[str, str], oracle: OracleLM, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")  # the masking is on the host's side of the sandbox
    oracle.add(Scenario("shapes of", [SHAPES_STEP]))
    return fleet_env


async def test_an_otlp_header_value_is_masked_without_its_scheme(
    shapes_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer <token>": the token alone is the secret, and so is
    the password inside a Basic credential."""
    token, password = "otlp" + secrets.token_hex(16), "pw" + secrets.token_hex(10)
    basic = base64.b64encode(f"collector:{password}".encode()).decode()
    with collecting() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{token},x-upstream=Basic%20{basic}")
        for value in (token, password, basic):
            answer, files, page = await run_and_export(f"shapes of {value[:4]}", value)
            for where, data in (
                ("the answer", answer.encode()),
                ("FLEET_HOME", files),
                ("the HTML export", page.encode()),
            ):
                assert not leaked_runs(data, value), f"a shape of the header value leaked into {where}"
            assert "***" in answer
        assert collector.headers and {h["authorization"] for h in collector.headers} == {f"Bearer {token}"}


async def test_encoded_and_case_changed_shapes_of_every_secret_are_masked(
    shapes_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An MCP token (URL-safe base64) and a hex model key, upper-cased, hex-encoded or inside base64 text."""
    token, key = secrets.token_urlsafe(32), secrets.token_hex(20)
    monkeypatch.setenv("FLEET_MCP_TOKEN", token)
    monkeypatch.setenv("FLEET_DAYTONA_API_KEY", key)
    for value in (token, key):
        answer, files, page = await run_and_export(f"shapes of {value[:4]}", value)
        for where, data in (("the answer", answer.encode()), ("FLEET_HOME", files), ("the HTML export", page.encode())):
            assert not leaked_runs(data, value), f"a shape of a configured secret leaked into {where}"
        assert answer.count("***") >= len(shapes_of(value)), answer  # each shape masked, not the answer dropped
    ordinary = "The quick brown fox, 'jumps' over [the] lazy dog;\n" * 1000
    assert redact_text(ordinary) == ordinary
