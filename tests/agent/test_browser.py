"""Chat mode in a real browser (Debian's chromium via Playwright) against `fleet web` processes: a
conversation starts an RLM run over an uploaded file and answers from it, proposes a memory update that
waits for approval across a server restart, and the approval given on the chat panel applies it once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.agent.conftest import CODE, MEMORY, memory_file
from tests.support.agent_lm import AgentLM, Call, Policy, Say
from tests.support.workloads import write_haystack
from tests.web.conftest import fleet_web
from tests.web.test_browser import chromium, open_page

pytestmark = pytest.mark.slow


@contextmanager
def chat_web(env: dict[str, str], cwd: Path) -> Iterator[str]:
    """`fleet web --port 0` on the given settings; yields its sign-in URL (with the token)."""
    full = {k: v for k, v in os.environ.items() if k != "FLEET_SANDBOX"}  # the real local sandbox
    full.update({k: v for k, v in env.items() if k != "FLEET_SANDBOX"})
    with fleet_web(cwd, full) as web:
        yield web.login_url


@pytest.fixture(scope="module")  # each test opens its own page; one chromium serves them
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def open_chat(page: object, login_url: str) -> None:
    page.goto(login_url)  # type: ignore[attr-defined]
    expect(page.get_by_role("heading", name="Workbench", exact=True)).to_be_visible()  # type: ignore[attr-defined]
    page.get_by_role("tab", name="Chat").click()  # type: ignore[attr-defined]
    expect(page.get_by_role("heading", name="Conversations")).to_be_visible()  # type: ignore[attr-defined]


def test_chat_runs_an_rlm_and_an_approval_survives_a_restart(
    agent_env: dict[str, str], browser: Browser, tmp_path: Path
) -> None:
    haystack = write_haystack(tmp_path / "haystack.txt", 20_000, CODE)
    with chat_web(agent_env, tmp_path) as login, open_page(browser, None, tmp_path) as ui:  # type: ignore[arg-type]
        page = ui.page
        open_chat(page, login)
        page.get_by_label("Attach files").set_input_files(str(haystack))
        expect(page.get_by_role("list", name="Files to attach")).to_contain_text("haystack.txt")
        page.get_by_role("textbox", name="Message").fill("what is the secret code in my file?")
        page.get_by_role("button", name="Send").click()
        log = page.get_by_role("log", name="Conversation")
        expect(log).to_contain_text(f"The secret code is {CODE}", timeout=90_000)
        expect(log.get_by_role("link", name="Trace of run")).to_be_visible()
        expect(log.locator(".tool-card")).to_contain_text("rlm_run")

        page.get_by_role("textbox", name="Message").fill("remember my favourite bird")
        page.get_by_role("button", name="Send").click()
        card = page.get_by_role("group", name="Approval for write_memory")
        expect(card).to_contain_text("memory/birds.md")
        assert ui.errors == [], ui.errors
    assert not memory_file(agent_env["FLEET_HOME"]).exists()

    with chat_web(agent_env, tmp_path) as login, open_page(browser, None, tmp_path) as ui:  # type: ignore[arg-type]
        page = ui.page
        open_chat(page, login)
        page.get_by_role("list", name="Conversations").get_by_role("button").first.click()
        card = page.get_by_role("group", name="Approval for write_memory")
        expect(card).to_contain_text("memory/birds.md")  # still waiting, after the restart
        card.get_by_role("button", name="Approve", exact=True).click()
        log = page.get_by_role("log", name="Conversation")
        expect(log).to_contain_text("wrote 41 bytes", timeout=60_000)
        expect(card).to_be_hidden()
        page.get_by_text("Approval log").click()
        expect(page.locator(".audit")).to_contain_text("approved by web")
        ui.page.screenshot(path=str(tmp_path / "chat.png"))
        assert ui.errors == [], ui.errors
    assert memory_file(agent_env["FLEET_HOME"]).read_text() == MEMORY


def test_a_card_that_cannot_show_its_call_offers_reject_only(
    agent_env: dict[str, str], agent_lm: AgentLM, browser: Browser, tmp_path: Path
) -> None:
    key = agent_env["FLEET_LM_API_KEY"]  # a configured secret: the card cannot show it
    agent_lm.add(Policy("keep the key", [Call("write_memory", {"path": "keys.md", "text": f"key: {key}"})]))
    with chat_web(agent_env, tmp_path) as login, open_page(browser, None, tmp_path) as ui:  # type: ignore[arg-type]
        page = ui.page
        open_chat(page, login)
        page.get_by_role("textbox", name="Message").fill("keep the key")
        page.get_by_role("button", name="Send").click()
        card = page.get_by_role("group", name="Approval for write_memory")
        expect(card).to_contain_text("It cannot be approved: the note contains a configured secret", timeout=60_000)
        expect(card.get_by_role("button", name="Reject")).to_be_visible()
        expect(card.get_by_role("button", name="Approve", exact=True)).to_have_count(0)
        expect(card.get_by_role("button", name="Always in this conversation")).to_have_count(0)
        assert key not in card.inner_text()
        assert ui.errors == [], ui.errors
    assert not (memory_file(agent_env["FLEET_HOME"]).parent / "keys.md").exists()


TRACE_ASK = '{"request": "trace the secret code hunt in my attached notes file", "format": "short"}'


def test_chat_titles_results_and_attachments_read_as_text(
    agent_env: dict[str, str], agent_lm: AgentLM, browser: Browser, tmp_path: Path
) -> None:
    agent_lm.add(Policy("trace the secret code hunt", [
        Call("rlm_run", {"question": "Find the secret code in the attached file.", "max_cost": 0.5}),
        Call("inspect_trace", lambda r: {"run_id": r.json["run_id"]}),
        Say("Traced."),
    ]))  # fmt: skip
    haystack = write_haystack(tmp_path / "notes.txt", 20_000, CODE)
    with chat_web(agent_env, tmp_path) as login, open_page(browser, None, tmp_path) as ui:  # type: ignore[arg-type]
        page = ui.page
        open_chat(page, login)
        picker = page.get_by_label("Attach files")
        picker.set_input_files(str(haystack))
        expect(page.get_by_role("list", name="Files to attach")).to_contain_text("notes.txt")
        box = picker.bounding_box()  # the browser's own "No file chosen" beside the list is not shown
        assert box is None or box["width"] <= 1, f"the native file input shows: {box}"
        page.get_by_role("textbox", name="Message").fill(TRACE_ASK)
        page.get_by_role("button", name="Send").click()
        log = page.get_by_role("log", name="Conversation")
        expect(log).to_contain_text("Traced.", timeout=90_000)

        titles = page.get_by_role("list", name="Conversations").get_by_role("button")
        expect(titles).to_have_text(["trace the secret code hunt in my attached notes file short"])
        run_card, trace_card = log.locator(".tool-card").all()
        result = run_card.locator(".tool-result")
        expect(result.locator("dt", has_text="answer")).to_be_visible()  # key and value, not JSON
        expect(result.locator("dt:text-is('answer') + dd")).to_have_text(CODE)
        assert '{"' not in result.inner_text()
        long = trace_card.locator(".tool-result details")  # a long result starts collapsed
        expect(long).not_to_have_attribute("open", "")
        long.locator("summary").click()
        expect(long.locator("dt:text-is('steps')")).to_be_visible()
        ui.page.screenshot(path=str(tmp_path / "chat-results.png"))
        assert ui.errors == [], ui.errors
