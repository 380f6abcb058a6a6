"""Drives a real desktop window (server, pywebview, the page) in its own process, for the tests.

``python -m tests.desktop.driver ACTION ARG [ACTION ARG]...`` opens the window as ``fleet desktop``
does, does each ACTION through the page (or the launch-token API where only the server matters),
prints one JSON object on stdout and closes. The person at the window is the only thing replaced: the close
confirmation answers yes and is recorded.

* ``save-key KEY``: type KEY into the Settings page's lm_api_key field and press Save.
* ``run QUESTION``: start a run and wait for it to finish.
* ``close-running QUESTION``: start a run, close the window while it runs.
* ``link URL``: click a link to URL in the page.
* ``export QUESTION``: run it, open the run's page and press Export; the save dialog answers
  ``$FLEET_TEST_SAVE_TO``.
* ``session-ends -``: revoke the page's session (as 8 idle hours would), then open the Runs page.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from typing import Any

from fleet_rlm.config import default_home
from fleet_shell import bridge, qt, window
from fleet_shell.launch import choose_gui
from fleet_shell.server import LocalServer
from fleet_shell.window import DesktopWindow

asked: list[int] = []


def _confirm(_window: Any, count: int) -> bool:
    asked.append(count)
    return True


def _save_to(_parent: Any, suggested: Any) -> str:
    asked_names.append(suggested.name)
    return os.environ["FLEET_TEST_SAVE_TO"]


asked_names: list[str] = []
window.confirm_close = _confirm  # the person at the window says yes
qt.ask_save_path = _save_to  # ... and picks where to save


def _js(desktop: DesktopWindow, script: str, timeout: float = 30.0) -> None:
    if not bridge.wait_for(desktop.window, script, timeout):
        shown = desktop.window.run_js("document.body.innerText.slice(0, 400)")
        raise AssertionError(f"timed out waiting for {script!r}; the page shows {shown!r}")


def _start_run(server: LocalServer, question: str) -> str:
    body = json.dumps({"question": question, "context_text": ["x"]}).encode()
    status, raw = server.request("POST", "/api/runs", body=body)
    assert status == 202, raw
    return str(json.loads(raw)["run_id"])


def _wait_status(server: LocalServer, run_id: str, wanted: set[str], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = json.loads(server.request("GET", f"/api/runs/{run_id}")[1])["status"]
        if status in wanted or time.monotonic() > deadline:
            return str(status)
        time.sleep(0.05)


def save_key(desktop: DesktopWindow, key: str) -> dict[str, Any]:
    _js(desktop, bridge.READY_JS)
    desktop.window.run_js("location.hash = '#/settings'")
    field = "document.querySelector('input[data-setting=\"lm_api_key\"]')"
    _js(desktop, f"!!{field} && !!document.querySelector('[data-doctor=\"keyring\"]')")
    desktop.window.run_js(
        f"(function () {{ const i = {field}; i.value = {json.dumps(key)}; i.form.requestSubmit(); }})()"
    )
    _js(desktop, "!!document.querySelector('.settings .ok, .settings .error')")
    return {
        "saved": desktop.window.run_js("(document.querySelector('.settings .ok') || {}).textContent || ''"),
        "error": desktop.window.run_js("(document.querySelector('.settings .error') || {}).textContent || ''"),
        "backend": desktop.window.run_js("document.querySelector('[data-doctor=\"keyring\"]').textContent"),
    }


SESSION_JS = "sessionStorage.getItem('fleet-session')"


def _status(server: LocalServer, method: str, path: str, session: str) -> int:
    """A request to the window's server as its page would send it, with ``session`` as the bearer."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {session}"})
        return conn.getresponse().status
    finally:
        conn.close()


def session_ends(desktop: DesktopWindow) -> dict[str, Any]:
    """The page's session ends under it; the page's next request must bring a new one (the shell's token)."""
    _js(desktop, bridge.READY_JS)
    ended = str(desktop.window.run_js(SESSION_JS))
    _status(desktop.server, "DELETE", "/api/auth", ended)
    refused = _status(desktop.server, "GET", "/api/runs", ended)
    desktop.window.run_js("location.hash = '#/runs'")  # the Runs page asks the API at once
    _js(desktop, f"!!{SESSION_JS} && {SESSION_JS} !== {json.dumps(ended)} && ({bridge.READY_JS})")
    renewed = str(desktop.window.run_js(SESSION_JS))
    return {"refused": refused, "works": _status(desktop.server, "GET", "/api/runs", renewed)}


def _act(desktop: DesktopWindow, action: str, arg: str) -> dict[str, Any]:
    server = desktop.server
    if action == "save-key":
        return save_key(desktop, arg)
    if action == "session-ends":
        return session_ends(desktop)
    if action == "link":
        _js(desktop, bridge.READY_JS)
        desktop.window.run_js(f"(function () {{ const a = document.createElement('a'); a.href = {json.dumps(arg)};"
                              " a.textContent = 'elsewhere'; document.body.append(a); a.click(); })()")  # fmt: skip
        time.sleep(1.0)
        return {"origin": desktop.window.run_js("location.origin"), "ready": desktop.window.run_js(bridge.READY_JS)}
    _js(desktop, bridge.READY_JS)
    run_id = _start_run(server, arg)
    if action == "run":
        return {"run_id": run_id, "status": _wait_status(server, run_id, {"succeeded", "failed"})}
    if action == "export":
        _wait_status(server, run_id, {"succeeded", "failed"})
        desktop.window.run_js(f"location.hash = '#/runs/{run_id}'")
        _js(desktop, "!!document.querySelector('a[download]')")
        desktop.window.run_js("document.querySelector('a[download]').click()")
        target = os.environ["FLEET_TEST_SAVE_TO"]
        deadline = time.monotonic() + 30
        while not (os.path.exists(target) and os.path.getsize(target)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return {"run_id": run_id, "suggested": asked_names}
    if action == "close-running":
        before = _wait_status(server, run_id, {"running"})
        desktop.window.destroy()  # as the window's close button does: asks, then cancels
        return {"run_id": run_id, "before": before}
    raise ValueError(f"unknown action {action}")


def main(steps: list[str]) -> int:
    """``steps``: ACTION ARG pairs, done in order in one window."""
    server = LocalServer()
    desktop = DesktopWindow(server, default_home(), gui=choose_gui(self_test=True))
    results: list[dict[str, Any]] = []

    def work() -> None:
        try:
            for action, arg in zip(steps[::2], steps[1::2], strict=True):
                results.append(_act(desktop, action, arg))
                if action == "close-running":
                    return
        except Exception as exc:
            results.append({"failure": repr(exc)})
        desktop.close(cancel_runs=True)

    try:
        desktop.start(work)
    finally:
        server.stop()
    print(json.dumps({"port": server.port, "steps": results, "asked": asked}), flush=True)
    return 1 if any("failure" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
