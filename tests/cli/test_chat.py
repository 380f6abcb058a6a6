"""The terminal chat through its real wire: `fleet` in a subprocess, on a pipe or a pseudo-terminal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.terminal import Terminal
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.slow  # each test starts real processes

BIN = Path(sys.executable).parent
FIRST_WORD = "SUBMIT(context.split()[0] if context.strip() else 'EMPTY')"


def chat(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "fleet"), *args], input=script, capture_output=True, text=True, env={**os.environ, **env},
        timeout=180,
    )  # fmt: skip


def test_attachments_are_checked_quoted_detached_and_cleared(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    oracle.add(Scenario("first word", [FIRST_WORD]))
    folder = tmp_path / "my docs"
    folder.mkdir()
    doc = folder / "notes 1.txt"  # spaces, as a drag and drop pastes them
    doc.write_text("walrus tusk ivory")
    script = "\n".join([
        "/attach /no/such/file.txt",  # refused at once, never kept
        f"/attach '{doc}'",
        "/context",
        "what is the first word?",  # the bad attach does not spoil this question
        f"/attach {doc}",  # unquoted with spaces: taken as one path
        "/attach 'unbalanced",
        "/detach 1",
        "/context",
        "/bogus",
        "/paste",
        "pasted penguin",
        ".",
        "/new",
        "/context",
        "first word again?",
        "/quit",
    ]) + "\n"  # fmt: skip
    proc = chat(script, fleet_env)
    assert proc.returncode == 0, proc.stderr
    out, err = proc.stdout, proc.stderr
    assert "error: context path '/no/such/file.txt' does not exist" in err
    assert f"attached {doc}" in out and "1. " + str(doc) in out
    assert "walrus" in out  # the answer used the quoted file
    assert "error: cannot read the path" in err  # the unbalanced quote, one line
    assert f"removed {doc}" in out
    assert "unknown command /bogus: /help lists the commands" in out and "/attach PATH" not in out
    assert "a line holding only '.'" in err and "pasted 14 characters" in out
    assert "new session: fresh REPL, nothing attached" in out
    assert out.count("nothing attached") >= 2  # /context after /detach, and after /new
    assert "EMPTY" in out  # after /new nothing was attached any more
    assert "Traceback" not in err


def test_fleet_context_attaches_at_start_and_bad_path_is_refused(
    fleet_env: dict, oracle: OracleLM, tmp_path: Path
) -> None:
    oracle.add(Scenario("first word", [FIRST_WORD]))
    doc = tmp_path / "doc.txt"
    doc.write_text("narwhal horn")
    proc = chat("first word?\n/quit\n", fleet_env, "--context", str(doc))
    assert proc.returncode == 0, proc.stderr
    assert f"attached {doc}" in proc.stdout and "narwhal" in proc.stdout
    bad = chat("/quit\n", fleet_env, "--context", str(tmp_path / "missing.txt"))
    assert bad.returncode == 2 and bad.stderr.splitlines()[0].startswith("error: context path")


def test_ctrl_c_at_the_prompt_keeps_the_chat_until_pressed_twice(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("first word", [FIRST_WORD]))
    term = Terminal("fleet", env=fleet_env)
    try:
        term.expect("> ")
        term.proc.send_signal(signal.SIGINT)
        term.expect("press Ctrl-C again, or type /quit, to leave")
        assert term.proc.poll() is None  # still there
        term.type("/paste")
        term.expect("a line holding only '.'")
        term.type("seal flipper")
        term.type(".")
        term.type("first word please")
        term.expect("[succeeded")  # the REPL survived the Ctrl-C and answers
        assert "seal" in term.seen
        term.expect("> ", after=term.seen.index("[succeeded"))  # the prompt after the answer
        mark = len(term.seen)
        term.proc.send_signal(signal.SIGINT)
        term.expect("press Ctrl-C again", after=mark)
        term.proc.send_signal(signal.SIGINT)
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()


def test_agent_chat_has_its_own_banner(fleet_env: dict) -> None:
    term = Terminal("fleet", "--agent", env=fleet_env)
    try:
        term.expect("> ")
        banner = term.seen[: term.seen.index("> ")]
        assert "fleet-rlm agent" in banner and "ask about your files" not in banner  # not the plain chat's
        assert "RLM runs" in banner and "memory" in banner  # what it can do
        assert "asks you first" in banner and "[y]es" in banner and "/approvals" in banner  # how approvals work
        term.type("/quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()


def test_ctrl_c_during_a_run_shows_the_cancelled_run_id(fleet_env: dict, oracle: OracleLM) -> None:
    oracle.add(Scenario("slow one", ["import time\ntime.sleep(60)\nSUBMIT('late')"]))
    term = Terminal("fleet", env=fleet_env)
    try:
        term.expect("> ")
        term.type("slow one please")
        term.expect("running code")  # the live line: the step is in the sandbox now
        term.proc.send_signal(signal.SIGINT)
        term.expect("[cancelled · run r")
        run_id = re.search(r"\[cancelled · run (r\w+)\]", term.seen)
        assert run_id, term.seen[-500:]
        term.expect("> ", after=term.seen.index("[cancelled"))
        term.type("/quit")
        assert term.proc.wait(timeout=60) == 0
    finally:
        term.close()
    runs = subprocess.run([str(BIN / "fleet-rlm"), "runs", "--json"], capture_output=True, text=True,
                          env={**os.environ, **fleet_env}, timeout=60)  # fmt: skip
    assert [(r["run_id"], r["status"]) for r in json.loads(runs.stdout)] == [(run_id.group(1), "cancelled")]


def test_the_live_clock_keeps_ticking_through_a_batch_of_sub_queries(fleet_env: dict, oracle: OracleLM) -> None:
    # One sub-query at a time, each a second at the model: the batch takes at least four seconds, and the
    # clock of what the run waits for must count them, not restart at each answer.
    oracle.state.latency = 1.0
    oracle.add(Scenario("fan out", ["print(llm_query_batched(['a', 'b', 'c', 'd']))", "SUBMIT('fanned')"]))
    term = Terminal("fleet", env={**fleet_env, "FLEET_CONCURRENCY": "1"})
    try:
        term.expect("> ")
        term.type("fan out please")
        term.expect("[succeeded")
        clocks = [int(s) for s in re.findall(r"\d/4 sub-queries \((\d+)s\)", term.seen)]
        assert clocks and max(clocks) >= 2, f"the clock read {sorted(set(clocks))} over a 4 s batch"
    finally:
        term.close()
