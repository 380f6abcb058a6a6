"""`fleet-rlm export --html` and `--format rlms` as real subprocesses, after a real run against the scripted LM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from bench.runtimes import RLMS_HOME, ensure_rlms

from tests.cli.test_cli import cli
from tests.support.oracle_lm import OracleLM, Scenario

HOSTILE = "</script><script>document.title='PWNED'</script>"
STEPS = [
    f"# {'y' * 30000}\nprint({HOSTILE!r})",  # code past the HTML file's 20 KB cap per block
    "kid = rlm_query('EXPORT-CHILD: report', context='The code is KID7.')\nprint(kid)",
    "SUBMIT('done ' + kid)",
]


@pytest.fixture
def run_id(fleet_env: dict, oracle: OracleLM) -> str:
    oracle.add(Scenario("EXPORT-ROOT", STEPS))
    oracle.add(Scenario("EXPORT-CHILD", ["SUBMIT('KID7')"]))
    proc = cli("run", "EXPORT-ROOT: make a trace to share", "--json", env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["answer"] == "done KID7"
    return str(result["run_id"])


@pytest.mark.slow
def test_export_html_writes_one_file_reports_its_size_and_keeps_an_existing_file(
    fleet_env: dict, run_id: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.html"
    proc = cli("export", run_id, "--html", str(out), env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert f"wrote {out} ({out.stat().st_size:,} bytes)" in proc.stderr
    assert (
        "cut to their first and last 10,000 characters" in proc.stderr and f"fleet-rlm export {run_id}" in proc.stderr
    )
    assert "EXPORT-ROOT: make a trace to share" in html and "done KID7" in html and HOSTILE not in html

    out.write_text("notes I keep")
    again = cli("export", "last", "--html", str(out), env=fleet_env)
    assert again.returncode == 2 and "pass --force" in again.stderr and out.read_text() == "notes I keep"
    forced = cli("export", "last", "--html", str(out), "--force", env=fleet_env)
    assert forced.returncode == 0, forced.stderr
    assert "EXPORT-ROOT: make a trace to share" in out.read_text()


@pytest.mark.slow
def test_export_rlms_rows_rebuild_through_the_reference_package(fleet_env: dict, run_id: str, tmp_path: Path) -> None:
    proc = cli("export", run_id, "--format", "rlms", env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["type"] for r in rows] == ["metadata", "iteration", "iteration", "iteration"]
    assert rows[0]["root_model"] == "openai/oracle" and rows[-1]["final_answer"] == "done KID7"
    [child] = rows[2]["code_blocks"][0]["result"]["rlm_calls"]
    assert child["response"] == "KID7" and child["metadata"]["iterations"][0]["final_answer"] == "KID7"

    python = RLMS_HOME / "bin" / "python"
    if reason := ensure_rlms(python):
        pytest.skip(f"the reference rlms package is {reason}")
    trajectory = tmp_path / "run.jsonl"
    trajectory.write_text(proc.stdout)
    checked = subprocess.run([str(python), "-c", REBUILD, str(trajectory)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.split() == ["metadata", "iteration", "iteration", "iteration"]


# Each row rebuilt with rlms' own dataclasses and written back with their to_dict(): the same fields and
# values as the reference logger's rows, apart from our extra "fleet_rlm" outcome on the metadata row.
REBUILD = """
import json, sys
from rlm.core.types import CodeBlock, REPLResult, RLMChatCompletion, RLMIteration, RLMMetadata

def block(b):
    r = b["result"]
    calls = [RLMChatCompletion.from_dict(c) for c in r["rlm_calls"]]
    result = REPLResult(r["stdout"], r["stderr"], r["locals"], r["execution_time"], calls, r["final_answer"])
    return CodeBlock(b["code"], result)

for line in open(sys.argv[1]):
    row = json.loads(line)
    if row["type"] == "metadata":
        fields = {k: row[k] for k in RLMMetadata.__dataclass_fields__}
        assert {"type": "metadata", "timestamp": row["timestamp"], **RLMMetadata(**fields).to_dict(),
                "fleet_rlm": row["fleet_rlm"]} == row, row
    else:
        it = RLMIteration(row["prompt"], row["response"], [block(b) for b in row["code_blocks"]],
                          row["final_answer"], row["iteration_time"])
        assert {"type": "iteration", "iteration": row["iteration"], "timestamp": row["timestamp"],
                **it.to_dict()} == row, row
    print(row["type"])
"""
