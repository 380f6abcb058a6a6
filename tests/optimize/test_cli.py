"""The CLI face through its wire: the installed ``fleet-rlm`` in a subprocess, the real local
sandbox, the scripted model over HTTP. The acceptance flow: import a 10-row dataset, optimize with
bootstrap (--json: id, version, scores before and after), promote (the next run uses it), roll back;
and a killed optimization rerun with --resume skips every replay it had finished."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.oracle_lm import PRICED, OracleLM, Scenario

pytestmark = pytest.mark.slow  # each test starts real processes

BIN = Path(sys.executable).parent / "fleet-rlm"


def cli(*argv: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *argv], input=stdin, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)  # fmt: skip


def ok(*argv: str, env: dict[str, str]) -> Any:
    out = cli(*argv, "--json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_import_optimize_promote_rollback(fleet_env: dict, shout: OracleLM, shout_file: Path) -> None:
    made = ok("dataset", "import", str(shout_file), "--name", "shout", env=fleet_env)
    assert (made["train"], made["holdout"]) == (8, 2) and len(made["rows"]) == 10
    assert [d["name"] for d in ok("dataset", "ls", env=fleet_env)] == ["shout"]
    exported = cli("dataset", "export", "shout", env=fleet_env).stdout.splitlines()
    assert len(exported) == 10 and json.loads(exported[0])["context"].startswith("Word:")

    result = ok("optimize", "--dataset", "shout", "--optimizer", "bootstrap", "--metric", "exact", env=fleet_env)
    assert result["status"] == "succeeded" and result["optimization_id"].startswith("o")
    version = result["version_id"]
    before, after = result["scores"]["before"], result["scores"]["after"]
    assert before["train"] < after["train"] == 1.0 and after["holdout"] >= before["holdout"]
    assert result["gate"]["passed"] is True and result["estimate"]["evaluations"] >= result["evaluations"]

    listed = ok("programs", "ls", env=fleet_env)
    assert listed["active"] == "builtin" and [v["id"] for v in listed["versions"]] == [version]
    assert ok("programs", "promote", version, env=fleet_env) == {"active": version, "override": False}
    answer = ok("run", "Shout the word in the context (plum)", "--text", "Word: plum", env=fleet_env)
    assert answer["answer"] == "PLUM"
    assert ok("programs", "rollback", env=fleet_env) == {"active": "builtin"}
    answer = ok("run", "Shout the word in the context (pear)", "--text", "Word: pear", env=fleet_env)
    assert answer["answer"] == "pear"
    refused = cli("programs", "rollback", env=fleet_env)
    assert refused.returncode == 2 and refused.stderr.startswith("error: nothing to roll back")


def test_a_killed_optimization_resumes_without_redoing_finished_replays(
    fleet_env: dict, shout: OracleLM, shout_file: Path
) -> None:
    shout.state.latency = 0.2
    assert cli("dataset", "import", str(shout_file), "--name", "shout", env=fleet_env).returncode == 0
    db = Path(fleet_env["FLEET_HOME"]) / "fleet.db"
    proc = subprocess.Popen([str(BIN), "optimize", "--dataset", "shout", "--optimizer", "bootstrap", "--metric",
                             "exact"], env={**os.environ, **fleet_env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    done = 0
    deadline = time.monotonic() + 120
    while done < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        if db.exists():
            with sqlite3.connect(db) as conn:
                done = conn.execute("SELECT COUNT(*) FROM eval_cache").fetchone()[0]
    assert done >= 4, proc.stderr.read() if proc.poll() is not None else "no replay finished in time"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with sqlite3.connect(db) as conn:
        (opt_id,) = conn.execute("SELECT id FROM optimizations").fetchone()
        finished = conn.execute("SELECT COUNT(*) FROM eval_cache").fetchone()[0]

    asked = len(shout.requests("root"))
    result = ok("optimize", "--resume", opt_id, env=fleet_env)
    assert result["status"] == "succeeded" and result["scores"]["after"]["train"] == 1.0
    assert result["cached"] >= finished
    # Every replay it did not skip cost one model call (single-step scenario); skipped ones none.
    assert len(shout.requests("root")) - asked == result["evaluations"] - result["cached"]
    with sqlite3.connect(db) as conn:
        status = conn.execute("SELECT status FROM runs WHERE id = ?", (opt_id,)).fetchone()[0]
    assert status == "interrupted"


def test_feedback_import_keeps_a_sessions_first_run_and_names_why_others_are_skipped(
    fleet_env: dict, shout: OracleLM, tmp_path: Path
) -> None:
    from fleet_rlm.store import Store

    word = tmp_path / "word.txt"
    word.write_text("Word: plum")
    first = ok("run", "Shout the word in the context (plum)", "--session", "s1", "--context", str(word), env=fleet_env)
    shout.add(Scenario("Repeat it", ["SUBMIT('plum')"]))  # each CLI run is a process: its REPL starts afresh
    follow_up = ok("run", "Repeat it", "--session", "s1", env=fleet_env)
    shout.state.fail_next.append(500)
    failed = cli("run", "Shout the word in the context (fig)", "--json", env=fleet_env)
    assert failed.returncode == 1, failed.stderr
    failed_id = json.loads(failed.stdout)["run_id"]
    with Store(Path(fleet_env["FLEET_HOME"]) / "fleet.db") as store:
        store.uploads.add_feedback(first["run_id"], True, None, None)
        store.uploads.add_feedback(follow_up["run_id"], True, None, None)
        store.uploads.add_feedback(failed_id, True, None, None)  # judged before faces refused this

    made = ok("dataset", "import", "--feedback", "--name", "judged", env=fleet_env)
    assert [(r["run_id"], r["answer"], r["context_paths"]) for r in made["rows"]] == [
        (first["run_id"], "plum", [str(word)])
    ]
    assert made["skipped"] == [
        f"{follow_up['run_id']}: it is run 2 of session s1, so it builds on the REPL state its earlier runs left, "
        "which a replay cannot rebuild; judge the session's first run, or ask the question as the first run of a "
        "new session",
        f"{failed_id}: it was marked correct but gave no answer (failed); mark it wrong and give the expected answer",
    ]


def test_the_terminal_shows_our_progress_and_readable_versions(
    fleet_env: dict, shout: OracleLM, shout_file: Path
) -> None:
    assert cli("dataset", "import", str(shout_file), "--name", "shout", env=fleet_env).returncode == 0
    narrow = {**fleet_env, "COLUMNS": "60"}
    out = cli("optimize", "--dataset", "shout", "--optimizer", "bootstrap", "--metric", "exact", env=narrow)
    assert out.returncode == 0, out.stderr
    for noise in ("INFO dspy", "Bootstrapped", "it/s", "%|"):  # DSPy's log lines and tqdm's bars
        assert noise not in out.stderr, out.stderr
    (estimate,) = [line for line in out.stderr.splitlines() if line.startswith("optimizing with bootstrap")]
    assert estimate.endswith(" model calls"), "the estimate is one line; the terminal wraps it"
    assert "after: train score 1.000 (8 rows)" in out.stderr.splitlines()
    version = out.stdout.strip()

    loud = cli("optimize", "--dataset", "shout", "--optimizer", "bootstrap", "--metric", "exact", "--verbose",
               env=fleet_env)  # fmt: skip
    assert loud.returncode == 0 and "INFO dspy" in loud.stderr, loud.stderr

    shown = cli("programs", "show", version, env=fleet_env)
    assert shown.returncode == 0 and len(shown.stdout) < 1500, shown.stdout
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"version {version}") and "bootstrap" in lines[1] and "exact" in lines[1]
    assert any(line.startswith("train 0.") and line.endswith("-> 1.000 (8 rows)") for line in lines), lines
    assert any(re.fullmatch(r"act: demos 0 -> [1-3]", line) for line in lines), lines
    assert ok("programs", "show", version, env=fleet_env)["id"] == version

    compared = cli("programs", "compare", "builtin", version, env=fleet_env)
    assert compared.returncode == 0 and len(compared.stdout) < 3000, compared.stdout
    lines = compared.stdout.splitlines()
    assert lines[0] == f"builtin vs {version}" and lines[3].split() == ["holdout", "n/a", "1.000"], lines
    assert re.search(rf"^act: demos only in builtin: 0, only in {version}: [1-3], shared: 0$", compared.stdout, re.M)
    assert "act: instructions the same" in lines
    assert ok("programs", "compare", "builtin", version, env=fleet_env)["b"] == version


# -- the documented commands and flags (tests/cli/test_docs.py checks this covers docs/cli.md) ----

Key = tuple[str, ...]
OPT = "fleet-rlm"
ALL_OPTIMIZE_FLAGS = ["--dataset", "walk", "--optimizer", "bootstrap", "--metric", "exact", "--trials", "1",
                      "--max-calls", "1000", "--max-total-cost", "5", "--max-iters", "5", "--max-depth", "1",
                      "--max-llm-calls", "50", "--max-seconds", "120", "--max-cost", "1", "--max-tokens", "900000",
                      "--sandbox", "local", "--verbose", "--json"]  # fmt: skip
# In order: later steps use what earlier ones made ({opt}, {version}: the first optimization's).
OPTIMIZE_WALK: dict[tuple[Key, str], list[str]] = {
    ((OPT, "dataset", "import"), "--seed"): ["dataset", "import", "{file}", "--name", "walk", "--seed", "3"],
    ((OPT, "dataset", "import"), "--name"): ["dataset", "import", "-", "--name", "walk2"],
    ((OPT, "dataset", "import"), "--holdout"): ["dataset", "import", "{file}", "--name", "walk3", "--holdout", "0.5"],
    ((OPT, "dataset", "import"), "--json"): ["dataset", "import", "{file}", "--name", "walk4", "--json"],
    ((OPT, "dataset", "import"), "--feedback"): ["dataset", "import", "--feedback", "--name", "judged"],
    ((OPT, "dataset", "export"), ""): ["dataset", "export", "walk"],
    ((OPT, "dataset", "ls"), "--json"): ["dataset", "ls", "--json"],
    ((OPT, "dataset", "show"), ""): ["dataset", "show", "walk"],
    ((OPT, "dataset", "show"), "--json"): ["dataset", "show", "walk", "--json"],
    **{((OPT, "optimize"), flag): ["optimize", *ALL_OPTIMIZE_FLAGS] for flag in ALL_OPTIMIZE_FLAGS if flag[:2] == "--"},
    ((OPT, "optimize"), "--base"): ["optimize", "--dataset", "walk", "--optimizer", "bootstrap", "--base", "{version}"],
    ((OPT, "optimize"), "--resume"): ["optimize", "--resume", "{opt}"],
    ((OPT, "programs", "ls"), "--json"): ["programs", "ls", "--json"],
    ((OPT, "programs", "show"), ""): ["programs", "show", "{version}"],
    ((OPT, "programs", "compare"), ""): ["programs", "compare", "builtin", "{version}"],
    ((OPT, "programs", "show"), "--json"): ["programs", "show", "{version}", "--json"],
    ((OPT, "programs", "compare"), "--json"): ["programs", "compare", "builtin", "{version}", "--json"],
    ((OPT, "programs", "promote"), ""): ["programs", "promote", "{version}"],
    ((OPT, "programs", "rollback"), ""): ["programs", "rollback"],
    ((OPT, "programs", "promote"), "--tolerance"): ["programs", "promote", "{version}", "--tolerance", "0.1"],
    ((OPT, "programs", "rollback"), "--json"): ["programs", "rollback", "--json"],
    ((OPT, "programs", "promote"), "--json"): ["programs", "promote", "{version}", "--json"],
    ((OPT, "programs", "promote"), "--override"): ["programs", "promote", "{other}", "--override", "walked"],
}
BAD = [
    ["dataset", "import", "--name", "x"],
    ["dataset", "import", "{missing}", "--name", "x"],
    ["dataset", "import", "{file}", "--name", "walk"],  # taken
    ["dataset", "import", "{file}", "--name", "bad name"],
    ["dataset", "import", "{file}", "--name", "x", "--holdout", "1.5"],
    ["dataset", "show", "nope"],
    ["optimize"],
    ["optimize", "--dataset", "nope", "--optimizer", "gepa"],
    ["optimize", "--dataset", "walk", "--optimizer", "sgd"],
    ["optimize", "--dataset", "walk", "--optimizer", "gepa", "--metric", "bleu"],
    ["optimize", "--resume", "o-nope"],
    ["programs", "show", "v-nope"],
    ["programs", "promote", "v-nope"],
    ["programs", "promote", "{other}"],  # does not pass the gate
]


def test_every_documented_optimization_command_and_flag(fleet_env: dict, shout: OracleLM, tmp_path: Path) -> None:
    from tests.optimize.conftest import shout_rows

    fleet_env.update(PRICED)  # --max-cost and --max-total-cost need a known price
    rows = [r for r in shout_rows() if r["context"].split()[-1] in ("apple", "banana", "KIWI", "LIME")]
    walk = tmp_path / "walk.jsonl"
    walk.write_text("".join(json.dumps(r) + "\n" for r in rows))
    judged = ok("run", "Shout the word in the context (x)", "--context", str(walk), env=fleet_env)
    from fleet_rlm.store import Store

    with Store(Path(fleet_env["FLEET_HOME"]) / "fleet.db") as store:
        store.uploads.add_feedback(judged["run_id"], False, "X", "should shout")
    values = {"file": str(walk), "missing": str(tmp_path / "nope.jsonl")}
    walked: set[tuple[str, ...]] = set()  # the optimize line carries every flag: it runs once, not once per flag
    for (key, flag), argv in OPTIMIZE_WALK.items():
        if key == (OPT, "optimize") and flag == "--base" and "version" not in values:
            first = ok("optimize", "--dataset", "walk", "--optimizer", "bootstrap", "--metric", "exact", env=fleet_env)
            assert first["gate"]["passed"], first  # the walk dataset's split leaves room to improve
            values |= {"opt": first["optimization_id"], "version": first["version_id"]}
        filled = [a.format(**values) for a in argv]
        if tuple(filled) in walked:
            continue
        walked.add(tuple(filled))
        out = cli(*filled, env=fleet_env, stdin=walk.read_text() if "-" in filled else "")
        assert out.returncode == 0, f"{' '.join(filled)} ({flag}) -> {out.returncode}: {out.stderr[-500:]}"
        if flag == "--base":
            values["other"] = out.stdout.strip()  # a version built on a perfect one: no better
    for argv in BAD:
        filled = [a.format(**values) for a in argv]
        out = cli(*filled, env=fleet_env)
        assert out.returncode == 2 and out.stderr.startswith("error: "), f"{filled}: {out.returncode} {out.stderr}"
        assert "Traceback" not in out.stderr
