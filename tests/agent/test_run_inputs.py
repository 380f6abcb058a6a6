"""The agent's rlm_run reads web pages and a repository as a run does: the approval card names each
URL exactly and says it goes to the network, and the run fetches it under the one fetch policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_rlm.agent.host import AgentHost
from fleet_rlm.config import load_settings
from fleet_rlm.core.engine import Engine
from tests.support.agent_lm import AgentLM, Call, Policy, Say
from tests.support.web_site import Site

pytestmark = pytest.mark.anyio


async def test_rlm_run_over_a_web_page_shows_the_url_and_answers_from_it(
    agent_env: dict[str, str], agent_lm: AgentLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_FETCH_ALLOWED_HOSTS", "127.0.0.1")  # the test's own site, allowed explicitly
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "status.html").write_text("<html><body><p>The secret code is WEB77.</p></body></html>")
    with Site(tmp_path / "site") as site:
        url = site.url("status.html")
        call = {"question": "Find the secret code in the page.", "urls": [url], "max_cost": 0.5}
        agent_lm.add(Policy("code on the status page", [Call("rlm_run", call), Say(lambda r: r.result)]))
        async with Engine(load_settings()) as engine:
            host = AgentHost.of(engine)
            conv = await host.create_conversation()
            done = await host.chat(conv.id, "what is the code on the status page?")
            view = host.conversation(conv.id)
        assert done.status == "done", done
        assert "WEB77" in done.reply
        [approval] = view.approvals
        assert f"the page {url} (network access)" in approval.summary
        assert site.requests == ["/status.html"]
