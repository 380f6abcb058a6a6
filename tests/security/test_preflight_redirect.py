"""The preflight's model-list request does not follow a redirect: the model key in its Authorization
header goes to the configured base URL only, never to where that server points (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.http_server import LoopbackServer, QuietHandler

BIN = Path(sys.executable).parent


class _Listener(LoopbackServer):
    """Records the Authorization header of every request it gets, answering 404."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        lock, seen = threading.Lock(), self.seen

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                with lock:
                    seen.append(self.headers.get("Authorization"))
                self.send_json(404, {"error": {"message": "not here"}})

        super().__init__(Handler)


class _Redirector(LoopbackServer):
    """Answers every GET with a redirect to ``target``."""

    def __init__(self, target: str) -> None:
        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(Handler)


def test_model_list_redirect_is_not_followed_with_the_key(fleet_env: dict) -> None:
    with _Listener() as listener, _Redirector(f"{listener.base_url}/models") as redirector:
        env = {**os.environ, **fleet_env, "FLEET_LM_API_BASE": redirector.base_url}
        # The run itself fails (the redirector answers no model call); what matters is where its key went.
        cmd = [str(BIN / "fleet-rlm"), "run", "how long is it?", "--text", "abcd", "--max-iters", "1"]
        subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert listener.seen == []  # the key never reached the address the redirect named
