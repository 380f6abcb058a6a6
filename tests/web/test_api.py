"""The JSON API through httpx against the ASGI app (finite responses): auth and browser
protections, runs, uploads, feedback, housekeeping, volumes, settings, and the OpenAPI document."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from fleet_rlm.http_auth import BrowserSessions
from fleet_rlm.web.app import create_app
from tests.support.asgi_server import serve_asgi
from tests.support.oracle_lm import OracleLM
from tests.web.conftest import AUTH, BASE, TOKEN, api_client, parse_sse, running, wait_finished

pytestmark = pytest.mark.anyio
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "incident"


async def _run(client: httpx.AsyncClient, question: str = "quick question", **body: object) -> dict:
    started = await client.post("/api/runs", json={"question": question, "context_text": ["some text"], **body})
    assert started.status_code == 202, started.text
    assert started.json()["status"] == "queued"
    return await wait_finished(client, started.json()["run_id"])


# -- auth, browser protections, errors ----------------------------------------------------------


async def test_every_api_request_needs_the_token_or_a_browser_session(client: httpx.AsyncClient) -> None:
    bare = httpx.AsyncClient(transport=client._transport, base_url=BASE)  # same app, no credentials
    async with bare:
        refused = await bare.get("/api/runs")
        assert refused.status_code == 401
        assert refused.json()["error"] == "unauthorized" and "token" in refused.json()["message"]
        assert (await bare.get("/api/runs", headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await bare.post("/mcp", json={})).status_code == 401
        assert (await bare.get("/health")).json() == {"status": "ok"}  # open, and says nothing else
        assert (await bare.post("/api/auth", json={"token": "not-it"})).status_code == 401
        signed_in = await bare.post("/api/auth", json={"token": TOKEN})
        assert signed_in.status_code == 200 and "set-cookie" not in signed_in.headers and not bare.cookies
        assert signed_in.headers["cache-control"] == "no-store"
        session = signed_in.json()["session"]
        assert len(session) >= 40 and TOKEN not in session
        as_page = {"Authorization": f"Bearer {session}"}
        assert (await bare.get("/api/runs", headers=as_page)).status_code == 200
        assert (await bare.post("/mcp", json={}, headers=as_page)).status_code == 401  # MCP wants the token
        other = (await bare.post("/api/auth", json={"token": TOKEN})).json()["session"]
        assert other != session  # each sign-in its own session
        replaced = (await bare.post("/api/auth", json={"token": TOKEN}, headers=as_page)).json()["session"]
        assert (await bare.get("/api/runs", headers=as_page)).status_code == 401  # a tab signing in again
        as_page = {"Authorization": f"Bearer {replaced}"}
        signed_out = await bare.delete("/api/auth", headers=as_page)
        assert signed_out.status_code == 204
        assert (await bare.get("/api/runs", headers=as_page)).status_code == 401  # revoked
        assert (await bare.get("/api/runs", headers={"Authorization": f"Bearer {other}"})).status_code == 200


def test_browser_sessions_end_when_idle_and_past_the_limit() -> None:
    now = [0.0]
    sessions = BrowserSessions(idle_seconds=60, limit=3, clock=lambda: now[0])
    kept, idle = sessions.open(), sessions.open()
    now[0] = 50
    assert sessions.check(kept.encode())  # used at 50: idle from then on
    now[0] = 100
    assert sessions.check(kept.encode()) and not sessions.check(idle.encode())  # idle 100 s > 60 s
    assert not sessions.check(idle.encode())  # and stays ended
    newer = [sessions.open() for _ in range(3)]
    assert not sessions.check(kept.encode())  # the least recently used went for the fourth
    assert all(sessions.check(s.encode()) for s in newer)
    assert not sessions.check(b"") and not sessions.check(b"made-up")


async def test_foreign_host_and_origin_are_refused(client: httpx.AsyncClient) -> None:
    rebinding = await client.get("/api/runs", headers={"Host": "evil.example:8000"})
    assert rebinding.status_code == 421
    other_port = await client.get("/api/runs", headers={"Host": "127.0.0.1:9999"})
    assert other_port.status_code == 421
    cross_site = await client.post("/api/runs", json={"question": "x"}, headers={"Origin": "http://evil.example"})
    assert cross_site.status_code == 403
    same_site = await client.get("/api/runs", headers={"Origin": BASE})
    assert same_site.status_code == 200
    listed = (await client.get("/api/runs")).json()
    assert listed["runs"] == []  # the refused POST started nothing


async def test_headers_errors_and_static_ui(tmp_path: Path, fake_env: dict, scripted: OracleLM) -> None:
    ui = tmp_path / "ui"
    (ui / "static").mkdir(parents=True)
    (ui / "index.html").write_text("<!doctype html><title>fleet</title><script src=/static/app.js></script>")
    (ui / "static" / "app.js").write_text("console.log('hi')")
    app = create_app(token=TOKEN, port=8000, ui_dir=ui)
    async with running(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        page = await c.get("/")  # open: the UI holds no data
        assert page.status_code == 200 and "<title>fleet</title>" in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["referrer-policy"] == "no-referrer"
        assert (await c.get("/static/app.js")).text == "console.log('hi')"
        missing = await c.get("/api/runs/r-nope", headers=AUTH)
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
        assert "r-nope" in missing.json()["message"]
        bad = await c.post("/api/runs", content=b"{not json", headers=AUTH)
        assert bad.status_code == 400 and "JSON" in bad.json()["message"]
        empty = await c.post("/api/runs", json={"question": "   "}, headers=AUTH)
        assert empty.status_code == 400 and "question" in empty.json()["message"]
        unknown = await c.post("/api/runs", json={"question": "q", "bogus": 1}, headers=AUTH)
        assert unknown.status_code == 400 and "bogus" in unknown.json()["message"]
        wrong_method = await c.patch("/api/runs", headers=AUTH)
        assert wrong_method.status_code == 405 and wrong_method.json()["error"] == "method_not_allowed"
        for response in (missing, bad, empty, unknown, wrong_method):
            assert "Traceback" not in response.text



def test_a_client_gone_mid_request_is_not_an_internal_error(
    fake_env: dict, scripted: OracleLM, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fleet_rlm.web.errors")
    with serve_asgi(lambda port: create_app(token=TOKEN, port=port)) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            head = f"POST /api/runs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            sock.sendall(f"{head}Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n".encode() + b'{"q')
        deadline = time.monotonic() + 30
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.02)
    assert [r.levelname for r in caplog.records] == ["INFO"], caplog.text
    assert "went away" in caplog.records[0].getMessage() and "Traceback" not in caplog.text


# -- runs ---------------------------------------------------------------------------------------


async def test_run_lifecycle_trace_export_and_feedback(client: httpx.AsyncClient) -> None:
    state = await _run(client, "quick question about cats", context_text=["cats " * 100])
    assert state["status"] == "succeeded" and state["answer"] == "answered: quick question about"
    run_id = state["run_id"]
    await _run(client, "quick question about dogs")
    found = (await client.get("/api/runs", params={"q": "CATS"})).json()
    assert [r["run_id"] for r in found["runs"]] == [run_id]
    page = (await client.get("/api/runs", params={"limit": 1, "status": "succeeded"})).json()
    assert len(page["runs"]) == 1 and page["has_more"] is True
    assert (await client.get("/api/runs", params={"status": ""})).status_code == 200  # an empty filter is none
    assert (await client.get("/api/runs", params={"status": "nonsense"})).status_code == 400

    trace = (await client.get(f"/api/runs/{run_id}/trace")).json()
    assert trace["steps_total"] == 1 and trace["steps"][0]["submitted"] is True
    step = (await client.get(f"/api/runs/{run_id}/trace", params={"step": 1})).json()
    assert "SUBMIT" in step["step"]["code"]
    assert (await client.get(f"/api/runs/{run_id}/trace", params={"node": "root.9"})).status_code == 404
    tree = (await client.get(f"/api/runs/{run_id}/tree")).json()
    root_step = tree["nodes"]["root"]["steps"][0]
    assert root_step["ts"] <= root_step["ts_end"] <= tree["run"]["finished"]

    export = await client.get(f"/api/runs/{run_id}/export")
    assert export.headers["content-type"].startswith("application/x-ndjson")
    events = [json.loads(line) for line in export.text.splitlines()]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["kind"] == "run.started" and events[-1]["kind"] == "run.finished"
    # A finished run's SSE stream is finite: the whole log, then the end.
    frames = parse_sse((await client.get(f"/api/runs/{run_id}/events")).text)
    assert frames[0] == {"retry": "2000"}
    assert [int(f["id"]) for f in frames[1:]] == [e["seq"] for e in events]
    resumed = parse_sse((await client.get(f"/api/runs/{run_id}/events", headers={"Last-Event-ID": "3"})).text)
    assert [int(f["id"]) for f in resumed[1:]] == [e["seq"] for e in events[3:]]

    judgement = {"correct": False, "expected": "42", "comment": "no"}
    given = await client.post(f"/api/runs/{run_id}/feedback", json=judgement)
    assert given.status_code == 201 and given.json()["expected"] == "42"
    listed = (await client.get(f"/api/runs/{run_id}/feedback")).json()["feedback"]
    assert [(f["correct"], f["expected"], f["comment"]) for f in listed] == [(False, "42", "no")]
    assert (await client.post("/api/runs/r-nope/feedback", json={"correct": True})).status_code == 404

    cancel = (await client.post(f"/api/runs/{run_id}/cancel")).json()
    assert cancel == {"run_id": run_id, "cancelled": False, "status": "succeeded", "message": cancel["message"]}
    assert "already ended" in cancel["message"]


async def test_run_state_and_tree_report_the_prompt_cache(client: httpx.AsyncClient, scripted: OracleLM) -> None:
    scripted.state.cache_reads = 25  # each reply reports 25 prompt tokens read from the provider's cache
    state = await _run(client)
    assert state["usage"]["total"]["cached_tokens"] == 25 * state["llm_calls"]
    tree = (await client.get(f"/api/runs/{state['run_id']}/tree")).json()
    assert [s["lm"]["cached_tokens"] for s in tree["nodes"]["root"]["steps"]] == [25]  # the timeline's tooltip


async def test_cancel_and_delete(client: httpx.AsyncClient) -> None:
    started = (await client.post("/api/runs", json={"question": "slow question"})).json()
    run_id = started["run_id"]
    refused = await client.delete(f"/api/runs/{run_id}")
    assert refused.status_code == 409 and "cancel" in refused.json()["message"]
    cancelled = (await client.post(f"/api/runs/{run_id}/cancel")).json()
    assert cancelled["cancelled"] is True and cancelled["status"] == "cancelled"
    assert (await client.delete(f"/api/runs/{run_id}")).status_code == 204
    assert (await client.get(f"/api/runs/{run_id}")).status_code == 404
    assert (await client.delete(f"/api/runs/{run_id}")).status_code == 404


async def test_uploads_live_with_their_runs(client: httpx.AsyncClient, fake_env: dict) -> None:
    home = Path(fake_env["FLEET_HOME"])
    files = [("file", ("../../evil name.txt", b"The secret code is KIWI", "text/plain")), ("file", ("b.txt", b"bee"))]
    sent = await client.post("/api/uploads", files=files)
    assert sent.status_code == 201, sent.text
    first, second = sent.json()["uploads"]
    assert first["name"] == "evil name.txt" and first["size"] == 23  # no folders from the client's name
    folder = home / "uploads" / first["upload_id"]
    assert (folder / "evil name.txt").read_bytes() == b"The secret code is KIWI"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct((folder / "evil name.txt").stat().st_mode & 0o777) == "0o600"

    one = await _run(client, "quick question on an upload", upload_ids=[first["upload_id"]])
    two = await _run(client, "quick question again", upload_ids=[first["upload_id"], second["upload_id"]])
    assert one["status"] == two["status"] == "succeeded"
    unknown = await client.post("/api/runs", json={"question": "q", "upload_ids": ["u0000000000"]})
    assert unknown.status_code == 404
    sneaky = await client.post("/api/runs", json={"question": "q", "upload_ids": ["../../etc"]})
    assert sneaky.status_code == 404

    assert (await client.delete(f"/api/runs/{one['run_id']}")).status_code == 204
    assert folder.exists()  # the second run still uses it
    assert (await client.delete(f"/api/runs/{two['run_id']}")).status_code == 204
    assert not folder.exists() and not (home / "uploads" / second["upload_id"]).exists()

    assert (await client.post("/api/uploads", data={"x": "y"})).status_code == 400  # no file part


async def test_upload_size_limit(fake_env: dict, scripted: OracleLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_UPLOAD_MAX_MB", "1")
    async with api_client() as client:
        big = b"x" * (2 * 1024 * 1024)
        refused = await client.post("/api/uploads", files=[("file", ("big.bin", big))])
        assert refused.status_code == 413 and "upload_max_mb" in refused.json()["message"]

        async def chunked():  # no Content-Length: the limit is counted as the body arrives
            for _ in range(4):
                yield big[: 512 * 1024]
            yield b"x" * 1024

        streamed = await client.put("/api/volumes/v1/raw", params={"path": "memory/a.bin"}, content=chunked())
        assert streamed.status_code == 413
        uploads = Path(fake_env["FLEET_HOME"]) / "uploads"
        assert not uploads.exists() or not any(uploads.iterdir())  # nothing half-written is left
        volume = Path(fake_env["FLEET_HOME"]) / "volumes" / "v1" / "memory" / "a.bin"
        assert not volume.exists()


async def test_context_roots_confine_paths_but_not_uploads(
    fake_env: dict, scripted: OracleLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "a.txt").write_text("inside")
    outside = tmp_path / "outside.txt"
    outside.write_text("private")
    monkeypatch.setenv("FLEET_CONTEXT_ROOTS", str(allowed))
    async with api_client() as client:
        refused = await client.post("/api/runs", json={"question": "quick question", "context_paths": [str(outside)]})
        assert refused.status_code == 400 and "FLEET_CONTEXT_ROOTS" in refused.json()["message"]
        ok = await _run(client, "quick question", context_paths=[str(allowed / "a.txt")])
        assert ok["status"] == "succeeded"
        upload = (await client.post("/api/uploads", files=[("file", ("n.txt", b"uploaded"))])).json()["uploads"][0]
        via_upload = await _run(client, "quick question", upload_ids=[upload["upload_id"]])
        assert via_upload["status"] == "succeeded", via_upload


async def test_delete_by_age_disk_use_and_sessions(client: httpx.AsyncClient, fake_env: dict) -> None:
    run = await _run(client)
    assert (await client.delete("/api/runs", params={"older_than_days": 1})).json() == {"deleted": 0}
    assert (await client.delete("/api/runs", params={"older_than_days": 0})).status_code == 400
    disk = (await client.get("/api/disk")).json()
    assert disk["runs"] > 0 and disk["total"] >= disk["runs"] and disk["retention_days"] is None
    assert (await client.get(f"/api/runs/{run['run_id']}")).status_code == 200

    opened = await client.post("/api/sessions", json={"name": "notes"})
    assert opened.status_code == 201
    session_id = opened.json()["id"]
    sessions = (await client.get("/api/sessions")).json()["sessions"]
    assert [(s["id"], s["name"]) for s in sessions] == [(session_id, "notes")]
    assert (await client.delete(f"/api/sessions/{session_id}")).status_code == 204
    assert (await client.get("/api/sessions")).json()["sessions"] == []
    assert (await client.delete("/api/sessions/s-nope")).status_code == 404


# -- volumes ------------------------------------------------------------------------------------


async def test_volumes(client: httpx.AsyncClient, fake_env: dict, tmp_path: Path) -> None:
    assert (await client.post("/api/volumes", json={"name": "notes"})).status_code == 201
    put = await client.put("/api/volumes/notes/raw", params={"path": "memory/a.md"}, content="héllo\n".encode())
    assert put.status_code == 200 and put.json()["path"] == "memory/a.md"
    listed = (await client.get("/api/volumes")).json()["volumes"]
    assert [(v["name"], v["bytes"]) for v in listed] == [("notes", 7)]
    tree = (await client.get("/api/volumes/notes/files", params={"recursive": "true"})).json()
    assert "memory/a.md" in [e["path"] for e in tree["entries"]]
    text = (await client.get("/api/volumes/notes/text", params={"path": "memory/a.md", "length": 2})).json()
    assert text["content"] == "h" and text["next_offset"] == 1  # never half a character
    raw = await client.get("/api/volumes/notes/raw", params={"path": "memory/a.md"})
    assert raw.content == "héllo\n".encode() and "attachment" in raw.headers["content-disposition"]

    secret = tmp_path / "host-secret.txt"
    secret.write_text("do not read")
    volume = Path(fake_env["FLEET_HOME"]) / "volumes" / "notes"
    os.symlink(secret, volume / "memory" / "link.txt")
    for path in ("../../../host-secret.txt", "/etc/passwd", "memory/link.txt"):
        read = await client.get("/api/volumes/notes/raw", params={"path": path})
        assert read.status_code in (400, 404) and "do not read" not in read.text
    escape = await client.put("/api/volumes/notes/raw", params={"path": "../outside.txt"}, content=b"x")
    assert escape.status_code == 400
    through_link = await client.put("/api/volumes/notes/raw", params={"path": "memory/link.txt"}, content=b"x")
    assert through_link.status_code == 400
    assert secret.read_text() == "do not read" and not (volume.parent / "outside.txt").exists()
    assert (await client.get("/api/volumes/nope/files")).status_code == 404

    assert (await client.delete("/api/volumes/notes/raw", params={"path": "memory/a.md"})).status_code == 204
    assert (await client.delete("/api/volumes/notes")).status_code == 204
    assert (await client.get("/api/volumes")).json()["volumes"] == []


# -- settings -----------------------------------------------------------------------------------


async def test_settings_sources_and_saving(client: httpx.AsyncClient, fake_env: dict) -> None:
    rows = {r["name"]: r for r in (await client.get("/api/settings")).json()["settings"]}
    assert rows["lm_model"]["source"] == "env" and rows["lm_model"]["value"] == "openai/oracle"
    assert rows["lm_api_key"]["secret"] and rows["lm_api_key"]["set"] and rows["lm_api_key"]["value"] is None
    assert fake_env["FLEET_LM_API_KEY"] not in json.dumps(rows)
    assert rows["max_iters"]["source"] == "default"

    saved = await client.put("/api/settings", json={"max_iters": 3, "lm_model": "openai/other"})
    assert saved.status_code == 200
    rows = {r["name"]: r for r in saved.json()["settings"]}
    assert rows["max_iters"] == {**rows["max_iters"], "source": "file", "value": 3, "overridden_by_env": False}
    assert rows["lm_model"]["source"] == "env" and rows["lm_model"]["overridden_by_env"] is True
    on_disk = json.loads((Path(fake_env["FLEET_HOME"]) / "settings.json").read_text())
    assert on_disk == {"lm_model": "openai/other", "max_iters": 3}

    refused = await client.put("/api/settings", json={"lm_api_key": "sk-should-not-land"})
    assert refused.status_code == 400 and "keyring" in refused.json()["message"]
    assert "sk-should-not-land" not in (Path(fake_env["FLEET_HOME"]) / "settings.json").read_text()
    invalid = await client.put("/api/settings", json={"max_iters": 0})
    assert invalid.status_code == 400 and "max_iters" in invalid.json()["message"]
    assert (await client.put("/api/settings", json={"nonsense": 1})).status_code == 400
    assert (await client.put("/api/settings", json={"home": "/tmp/x"})).status_code == 400

    # Saved settings apply to the next run without a restart.
    run = await _run(client, "slow question")  # 7 steps to its answer, stopped at 3
    assert run["iterations"] == 3 and run["answer"] != "slow done"
    started = (await client.get(f"/api/runs/{run['run_id']}/export")).text.splitlines()[0]
    assert json.loads(started)["data"]["limits"]["max_iters"] == 3


async def test_checks_and_doctor(client: httpx.AsyncClient) -> None:
    model = (await client.post("/api/check/model")).json()
    assert model["ok"] is True and "openai/oracle" in model["detail"]
    sandbox = (await client.post("/api/check/sandbox")).json()
    assert sandbox["ok"] is True and "fake" in sandbox["detail"]
    doctor = (await client.get("/api/doctor")).json()
    assert doctor["model"]["ok"] and "keyring" in doctor


async def test_an_error_whose_fix_is_a_setting_says_so(
    fake_env: dict, scripted: OracleLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_LM_MODEL")
    async with api_client() as client:
        refused = await client.post("/api/runs", json={"question": "quick question", "context_text": ["x"]})
        missing = await client.get("/api/runs/r-nothing-here")
    assert refused.status_code == 400
    body = refused.json()
    assert body["hint"] == "settings" and "No model configured" in body["message"], body
    assert set(missing.json()) == {"error", "message"}  # no setting fixes a wrong run id


async def test_the_sample_is_offered_while_runs_may_read_it(
    fake_env: dict, scripted: OracleLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with api_client() as client:
        sample = (await client.get("/api/sample")).json()
        assert sample["path"] == str(SAMPLE) and sample["question"], sample
        run = await _run(client, "quick question", context_paths=[sample["path"]])
        assert run["status"] == "succeeded", run
    monkeypatch.setenv("FLEET_CONTEXT_ROOTS", str(tmp_path))  # the checkout is outside: a run would be refused
    async with api_client() as client:
        assert (await client.get("/api/sample")).json()["path"] is None


# -- the document -------------------------------------------------------------------------------


async def test_openapi_describes_exactly_the_routes(client: httpx.AsyncClient) -> None:
    from starlette.routing import Route

    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    app = client._transport.app  # type: ignore[attr-defined]
    served = {
        (method.lower(), route.path)
        for route in app.routes
        if isinstance(route, Route) and route.include_in_schema
        for method in (route.methods or {"GET", "POST", "DELETE"}) - {"HEAD"}
    }
    served |= {("get", "/health"), ("post", "/api/auth"), ("delete", "/api/auth")}  # answered by the Guard
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == served
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (method, path)
            for response in op["responses"].values():
                for media in response.get("content", {}).values():
                    ref = media["schema"].get("$ref")
                    assert ref is None or ref.split("/")[-1] in doc["components"]["schemas"], ref


async def test_pin_a_run_over_http(client: httpx.AsyncClient) -> None:
    state = await _run(client)
    run_id = state["run_id"]
    assert state["pinned"] is False
    pinned = await client.post(f"/api/runs/{run_id}/pin", json={"pinned": True})
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True, pinned.text
    assert (await client.get(f"/api/runs/{run_id}")).json()["pinned"] is True
    assert (await client.post(f"/api/runs/{run_id[-6:]}/pin", json={"pinned": False})).json()["pinned"] is False
    assert (await client.post("/api/runs/rnosuchrun0/pin", json={"pinned": True})).status_code == 404
    assert (await client.post(f"/api/runs/{run_id}/pin", json={"pinned": "yes please"})).status_code == 400
