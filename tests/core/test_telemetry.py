"""OpenTelemetry export: a run's spans as a real OTLP/HTTP collector receives them (a loopback server
decoding the protobuf requests), secrets masked, and a collector that is down costs the run nothing.

Against Arize Phoenix (the real UI), by hand: ``bench/otel_phoenix.py`` (docs/observability.md)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_rlm.config import load_settings
from fleet_rlm.core.doctor import doctor_report
from fleet_rlm.core.engine import Engine
from fleet_rlm.types import RunRequest
from tests.support import fake_sandbox
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.otlp_collector import Collector, attrs, collecting
from tests.support.workloads import NEEDLE_STEPS, write_haystack

pytestmark = pytest.mark.anyio
SECRET = "sk-test-oracle-0000"  # fleet_env's model key
CHILD_STEP = "r = rlm_query('child task: shout', 'alpha')\nprint(r)"


@pytest.fixture
def collector() -> Iterator[Collector]:
    with collecting() as receiver:
        yield receiver


@pytest.fixture(autouse=True)
def _fake_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_sandbox.register()
    monkeypatch.setenv("FLEET_SANDBOX", "fake")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)


async def test_run_exports_openinference_span_tree(
    fleet_env: dict, oracle: OracleLM, collector: Collector, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=collector%20key%201")
    oracle.add(Scenario("secret code", [*NEEDLE_STEPS[:2], CHILD_STEP, NEEDLE_STEPS[2]]))
    oracle.add(Scenario("child task", ["SUBMIT(context.upper())"]))
    oracle.state.cache_reads = 200  # each reply reports 200 prompt tokens read from a prompt cache
    hay = write_haystack(tmp_path / "hay.txt", 300_000, "K7Q2")
    async with Engine() as engine:
        result = await engine.run(RunRequest(f"What is the secret code? (key {SECRET})", context_paths=[str(hay)]))
    assert result.status == "succeeded" and result.answer == "K7Q2", result.error
    assert collector.paths and set(collector.paths) == {"/v1/traces"}
    assert set(collector.api_keys) == {"collector key 1"}  # the standard headers variable, URL-decoded
    spans = {s.span_id: s for s in collector.spans}
    kind = {sid: attrs(s)["openinference.span.kind"] for sid, s in spans.items()}
    (run,) = [s for s in spans.values() if not s.parent_span_id]
    assert kind[run.span_id] == "CHAIN" and attrs(run)["fleet.run_id"] == result.run_id
    assert all(s.trace_id == run.trace_id and s.parent_span_id in spans for s in spans.values() if s is not run)
    children_of = {sid: [s for s in spans.values() if s.parent_span_id == sid] for sid in spans}
    (root,) = children_of[run.span_id]
    assert kind[root.span_id] == "AGENT" and root.name == "node root"
    steps = sorted(
        (s for s in children_of[root.span_id] if kind[s.span_id] == "LLM"), key=lambda s: s.start_time_unix_nano
    )
    tools = [s for s in children_of[root.span_id] if kind[s.span_id] == "TOOL"]
    assert [s.name for s in steps] == ["step 1", "step 2", "step 3", "step 4"] and len(tools) == 4
    step = attrs(steps[0])
    assert step["llm.token_count.prompt"] > 200 and step["llm.token_count.completion"] > 0
    assert step["llm.token_count.prompt_details.cache_read"] == 200
    assert step["llm.model_name"] == "openai/oracle" and "print(len(context)" in step["output.value"]
    assert attrs(steps[1])["llm.input_messages.0.message.content"].startswith("300")  # step 1's output: the new message
    fan_out, delegate = sorted(tools, key=lambda s: s.start_time_unix_nano)[1:3]
    subcalls = children_of[fan_out.span_id]
    assert len(subcalls) == -(-len(hay.read_text()) // 100_000) and {kind[s.span_id] for s in subcalls} == {"LLM"}
    assert any(attrs(s)["output.value"] == "K7Q2" for s in subcalls)
    (child,) = children_of[delegate.span_id]
    assert kind[child.span_id] == "AGENT" and child.name == "node root.1"
    assert sorted(kind[s.span_id] for s in children_of[child.span_id]) == ["LLM", "TOOL"]  # its one step: SUBMIT
    assert all(s.end_time_unix_nano >= s.start_time_unix_nano for s in spans.values())
    every_value = repr([attrs(s) for s in spans.values()])
    assert SECRET not in every_value and "***" in attrs(run)["input.value"]


@pytest.mark.slow
async def test_collector_down_costs_the_run_nothing(
    fleet_env: dict, needle: OracleLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    monkeypatch.setenv("FLEET_OTEL_ENDPOINT", f"http://127.0.0.1:{closed}")
    hay = write_haystack(tmp_path / "hay.txt", 300_000, "K7Q2")
    async with Engine() as engine:
        assert engine._telemetry is not None  # the export is on: the failures below are its own
        result = await engine.run(RunRequest("What is the secret code?", context_paths=[str(hay)]))
        telemetry = engine._telemetry
    assert result.status == "succeeded" and result.answer == "K7Q2"
    assert engine._telemetry is None and not telemetry._worker.is_alive()  # closed, within its bound


async def test_export_off_by_default_and_doctor_says_where(fleet_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Engine() as engine:
        assert engine._telemetry is None
    report = await doctor_report(load_settings(), offline=True)
    assert report["otel"]["ok"] and "off" in report["otel"]["detail"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://user:pw-in-url@collector.example:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20abcdefghijklmnop")
    detail = (await doctor_report(load_settings(), offline=True))["otel"]["detail"]
    assert "https://collector.example:4318/v1/traces" in detail and "authorization" in detail
    assert "pw-in-url" not in detail and "abcdefghijklmnop" not in detail
    monkeypatch.setenv("FLEET_OTEL", "false")
    assert "off" in (await doctor_report(load_settings(), offline=True))["otel"]["detail"]
