"""docs/cli.md is the truth about the CLI: every command and flag it documents exists in `--help`
and the reverse, and each one is run (harmless arguments, fresh FLEET_HOME, the scripted LM) with
its exit status and first stderr line checked, for good input and for bad."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import prereqs, tools_mcp_server
from tests.support.oracle_lm import PRICED, OracleLM, Scenario
from tests.support.web_site import Site, make_repo

BIN = Path(sys.executable).parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
FLAG = re.compile(r"--[a-z][a-z-]*")
WORD = re.compile(r"[a-z][a-z-]*")

Key = tuple[str, ...]  # ("fleet-rlm", "volumes", "rm")


def documented() -> dict[Key, set[str]]:
    """Every synopsis in docs/cli.md's code blocks: program and command words -> flags."""
    blocks = re.findall(r"```\n(.*?)```", DOC.read_text(), re.DOTALL)
    lines: list[str] = []
    for block in blocks:
        for line in block.splitlines():
            if line[:1].isspace() and lines:
                lines[-1] += " " + line.strip()  # a wrapped synopsis
            elif line.strip():
                lines.append(line.strip())
    found: dict[Key, set[str]] = {}
    for line in lines:
        tokens = line.split()
        if tokens[0] not in {"fleet-rlm", "fleet"}:
            continue
        words = [tokens[0]]
        for token in tokens[1:]:
            if not WORD.fullmatch(token):
                break
            words.append(token)
        found.setdefault(tuple(words), set()).update(set(FLAG.findall(line)) - {"--help"})
    return found


def run(
    *argv: str, env: dict[str, str], prog: str = "fleet-rlm", stdin: str | None = ""
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / prog), *argv], input=stdin, capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


def help_flags(words: Key, env: dict[str, str]) -> tuple[set[str], list[str]]:
    """(flags, subcommands) that ``--help`` of a command shows."""
    out = run(*words[1:], "--help", env=env, prog=words[0])
    assert out.returncode == 0, out.stderr
    flags: set[str] = set()
    subcommands: list[str] = []
    for line in out.stdout.splitlines():
        if re.match(r"^  -", line):  # an option row: "  --context PATH, -c PATH   help"
            flags |= set(FLAG.findall(re.split(r"\s{2,}", line.strip())[0]))
        elif m := re.match(r"^    ([a-z][a-z-]*)(\s|$)", line):  # a subcommand row
            subcommands.append(m.group(1))
    return flags - {"--help"}, subcommands


@pytest.mark.slow
def test_help_and_docs_agree(fleet_env: dict) -> None:
    docs = documented()
    shown: dict[Key, set[str]] = {}
    todo: list[Key] = [("fleet-rlm",)]
    while todo:
        key = todo.pop()
        flags, subcommands = help_flags(key, fleet_env)
        if subcommands:  # a group (volumes, config): its actions are the documented commands
            todo += [(*key, s) for s in subcommands]
            if len(key) > 1:
                continue
        shown[key] = flags
    assert set(shown) == set(docs) - {("fleet",)}, "commands in --help and docs/cli.md differ"
    for key, flags in shown.items():
        assert docs[key] == flags, f"{' '.join(key)}: --help shows {sorted(flags)}, docs/cli.md {sorted(docs[key])}"
    # `fleet` with options is the chat.
    assert docs[("fleet",)] == shown[("fleet-rlm", "chat")]


# -- the walk -----------------------------------------------------------------------------------

# A harmless invocation for every documented flag, and for every command without flags (key (..., "")).
# Flags that combine share one invocation (each process costs about a second of CPU), so a broken flag
# fails its line; flags that exclude each other, or change how the command answers, get their own.
# "{file}", "{run}" and "{port}" are filled in by the test.
WalkKey = tuple[Key, str]


def _walks(words: Key, line: str, flags: tuple[str, ...] = ()) -> dict[WalkKey, list[str]]:
    """The command ``line`` walks each of ``flags`` (by default every flag in it)."""
    argv = line.split()
    return {(words, flag): argv for flag in flags or [a for a in argv if a.startswith("--")]}


RUN, FORK = ("fleet-rlm", "run"), ("fleet-rlm", "fork")
GOOD: dict[WalkKey, list[str]] = {
    (("fleet-rlm",), "--version"): ["--version"],
    (("fleet-rlm", "run"), ""): ["run", "hello"],
    **_walks(
        RUN, "run hello --context {file} --text x --session walk --volume notes --sandbox local --trace-mode verbose"
    ),
    **_walks(RUN, "run hello --max-iters 3 --max-depth 0 --max-llm-calls 5 --max-seconds 60 --max-cost 1.5"),
    **_walks(RUN, "run hello --context {dir} --include-hidden --json --max-tokens 90000"),
    **_walks(RUN, "run hello --repo {repo}@v1"),  # a smart-HTTP git server on 127.0.0.1, allowed for the walk
    **_walks(RUN, "run hello --mcp lab --allow-tool lab.wipe --tool textwrap:dedent"),  # lab: FLEET_MCP_SERVERS
    (("fleet-rlm", "runs"), "--limit"): ["runs", "--limit", "1"],
    (("fleet-rlm", "runs"), "--status"): ["runs", "--status", "succeeded"],
    (("fleet-rlm", "runs"), "--json"): ["runs", "--json"],
    (("fleet-rlm", "trace"), "--json"): ["trace", "{run}", "--json"],
    (("fleet-rlm", "trace"), "--full"): ["trace", "{run}", "--full"],
    (("fleet-rlm", "pin"), ""): ["pin", "{run}"],
    (("fleet-rlm", "pin"), "--off"): ["pin", "{run}", "--off"],
    (("fleet-rlm", "export"), ""): ["export", "{run}"],
    (("fleet-rlm", "export"), "--html"): ["export", "{run}", "--html", "{dir}/trace.html"],
    (("fleet-rlm", "export"), "--force"): ["export", "{run}", "--html", "{dir}/again.html", "--force"],
    (("fleet-rlm", "export"), "--format"): ["export", "{run}", "--format", "rlms"],
    (("fleet-rlm", "replay"), "--json"): ["replay", "{run}", "--json"],
    (("fleet-rlm", "replay"), "--all"): ["replay", "--all", "--since", "2999-01-01"],  # none: other runs change
    (("fleet-rlm", "replay"), "--since"): ["replay", "--all", "--since", "2999-01-01T00:00"],
    **_walks(FORK, "fork {run} --at 1 --code {file} --max-iters 3"),
    **_walks(FORK, "fork {run} --at 1 --instruction brief --json", ("--instruction", "--json")),
    (("fleet-rlm", "volumes", "ls"), ""): ["volumes", "ls", "notes"],
    (("fleet-rlm", "volumes", "ls"), "--json"): ["volumes", "ls", "--json"],
    (("fleet-rlm", "volumes", "cat"), ""): ["volumes", "cat", "notes/memory/a.md"],
    (("fleet-rlm", "volumes", "put"), ""): ["volumes", "put", "{file}", "notes/memory/b.md"],
    (("fleet-rlm", "volumes", "rm"), ""): ["volumes", "rm", "notes/memory/c.md"],
    (("fleet-rlm", "volumes", "rm"), "--all"): ["volumes", "rm", "scratch", "--all"],
    (("fleet-rlm", "doctor"), "--json"): ["doctor", "--json"],
    (("fleet-rlm", "doctor"), "--offline"): ["doctor", "--offline"],
    (("fleet-rlm", "doctor"), "--strict"): ["doctor", "--offline", "--strict"],  # exit 0 or 2: caps of this host
    (("fleet-rlm", "config", "list"), ""): ["config", "list"],
    (("fleet-rlm", "config", "get"), ""): ["config", "get", "max_iters"],
    (("fleet-rlm", "config", "set"), ""): ["config", "set", "max_depth", "1"],
    (("fleet-rlm", "config", "unset"), ""): ["config", "unset", "max_depth"],
    (("fleet-rlm", "serve-mcp"), "--transport"): ["serve-mcp", "--transport", "stdio"],
    **_walks(
        ("fleet-rlm", "serve-mcp"),
        "serve-mcp --transport http --host 127.0.0.1 --no-auth --port {port}",
        ("--host", "--no-auth", "--port"),
    ),
    **_walks(
        ("fleet-rlm", "serve-mcp"), "serve-mcp --transport http --allow-remote --port {port}", ("--allow-remote",)
    ),
}
GOOD |= {
    **_walks(("fleet-rlm", "web"), "web --host 127.0.0.1 --port {port} --no-open"),
    (("fleet-rlm", "web"), "--allow-remote"): ["web", "--allow-remote", "--no-open", "--port", "{port}"],
    # The window (Qt offscreen when there is no display); needs the desktop extra, which CI installs.
    # One window walks both flags (tests/desktop holds the self-test to far more than its exit code).
    (("fleet-rlm", "desktop"), "--self-test"): ["desktop", "--self-test", "--screenshot", "{dir}/shot.png"],
    (("fleet-rlm", "desktop"), "--screenshot"): ["desktop", "--self-test", "--screenshot", "{dir}/shot.png"],
    # The launcher goes to the walk's own XDG_DATA_HOME (set in the test), never the real menu.
    (("fleet-rlm", "desktop"), "--install"): ["desktop", "--install"],
    (("fleet-rlm", "desktop"), "--uninstall"): ["desktop", "--uninstall"],
}
# Chat flags, stdin says /quit: one line carries every flag but --agent (a different chat), through
# `fleet-rlm chat` and through `fleet`, which only puts `chat` in front (cli/main.py fleet_main).
CHAT = {
    "--context": ["--context", "{file}"],
    "--trace-mode": ["--trace-mode", "off"],
    "--max-iters": ["--max-iters", "2"],
    "--max-depth": ["--max-depth", "1"],
    "--max-llm-calls": ["--max-llm-calls", "9"],
    "--max-seconds": ["--max-seconds", "30"],
    "--max-cost": ["--max-cost", "0.5"],
    "--max-tokens": ["--max-tokens", "90000"],
    "--sandbox": ["--sandbox", "local"],
    "--agent": ["--agent"],
}
_ALL_CHAT_BUT_AGENT = [a for flag, args in CHAT.items() if flag != "--agent" for a in args]
for _flag, _args in CHAT.items():
    _line = _args if _flag == "--agent" else _ALL_CHAT_BUT_AGENT
    GOOD[(("fleet-rlm", "chat"), _flag)] = ["chat", *_line]
    GOOD[(("fleet",), _flag)] = ["@fleet", *_line]

# Bad input: exit 2 and a first stderr line starting with "error:", and no run recorded.
BAD: list[list[str]] = [
    ["bogus-command"],
    ["run"],
    ["run", "hello", "--max-iters", "-3"],
    ["run", "hello", "--max-iters", "0"],
    ["run", "hello", "--max-depth", "-1"],
    ["run", "hello", "--max-llm-calls", "many"],
    ["run", "hello", "--max-seconds", "-5"],
    ["run", "hello", "--max-seconds", "nan"],
    ["run", "hello", "--max-cost", "-1"],
    ["run", "hello", "--context", "{missing}"],
    ["run", "hello", "--context", "ftp://example.org/x"],
    ["run", "hello", "--repo", "{repo}@--upload-pack=x"],
    ["run", "  "],
    ["run", "hello", "--session", "bad id!"],
    ["run", "hello", "--sandbox", "cloud"],
    ["run", "hello", "--trace-mode", "loud"],
    ["runs", "--limit", "0"],
    ["runs", "--status", "bogus"],
    ["trace", "r-no-such-run"],
    ["export", "r-no-such-run"],
    ["export", "{run}", "--html", "{file}"],  # exists: kept unless --force
    ["export", "{run}", "--format", "html"],
    ["replay"],
    ["replay", "r-no-such-run"],
    ["replay", "--since", "2024-01-01"],
    ["replay", "--all", "--since", "soon"],
    ["fork", "{run}"],
    ["fork", "{run}", "--at", "0"],
    ["fork", "{run}", "--at", "1", "--code", "{missing}"],
    ["fork", "{run}", "--at", "1", "--code", "{file}", "--instruction", "both"],
    ["volumes"],
    ["volumes", "ls", "vol:nope"],
    ["volumes", "cat", "notes"],
    ["volumes", "cat", "notes/memory/missing.md"],
    ["volumes", "cat", "notes/../../etc/passwd"],
    ["volumes", "put", "{missing}", "notes/memory/x.md"],
    ["volumes", "put", "{dir}", "notes/memory/x.md"],
    ["volumes", "rm", "notes"],
    ["volumes", "rm", "notes/memory/a.md", "--all"],
    ["doctor", "--bogus"],
    ["config"],
    ["config", "get", "bogus"],
    ["config", "set", "max_iters", "abc"],
    ["config", "set", "max_iters"],
    ["config", "set", "lm_api_key"],  # no keyring in tests: said before any prompt
    ["config", "unset", "bogus"],
    ["web", "--port", "-1"],
    ["desktop", "--screenshot", "shot.png"],  # without --self-test
    ["serve-mcp", "--port", "abc"],
    ["serve-mcp", "--transport", "pigeon"],
    ["daytona"],
    ["daytona", "smoke"],  # no DAYTONA_API_KEY: said before anything is created
    ["chat", "--context", "{missing}"],
    ["chat", "--max-iters", "0"],
    ["@fleet", "--context", "{missing}"],
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fill(argv: list[str], values: dict[str, str]) -> tuple[str, list[str]]:
    prog = "fleet-rlm"
    if argv and argv[0] == "@fleet":
        prog, argv = "fleet", argv[1:]
    values = {**values, "port": str(_free_port())}
    return prog, [a.format(**values) if "{" in a else a for a in argv]


def _serve_briefly(prog: str, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Start a server, wait until its port answers, then Ctrl-C it; 0 if it listened."""
    port = int(argv[argv.index("--port") + 1])
    proc = subprocess.Popen(
        [str(BIN / prog), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    deadline = time.monotonic() + 60
    listening = False
    while time.monotonic() < deadline and proc.poll() is None and not listening:
        with socket.socket() as s:
            listening = s.connect_ex(("127.0.0.1", port)) == 0
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    return (0 if listening else -1), err


def _invoke(argv: list[str], env: dict[str, str], values: dict[str, str]) -> tuple[list[str], int, str]:
    prog, filled = _fill(argv, values)
    if "{port}" in argv:  # a server (`web`, `serve-mcp --transport http`) on a free port
        code, err = _serve_briefly(prog, filled, env)
        return argv, code, err
    stdin = "/quit\n" if prog == "fleet" or filled[:1] == ["chat"] else ""
    proc = run(*filled, env=env, prog=prog, stdin=stdin)
    said = proc.stderr if proc.returncode == 0 or proc.stderr.strip() else proc.stdout  # --json says it on stdout
    return argv, proc.returncode, said


def _run_ids(env: dict[str, str]) -> list[str]:
    return [r["run_id"] for r in json.loads(run("runs", "--json", "--limit", "1000", env=env).stdout)]


@pytest.fixture
def walk_repo(tmp_path: Path) -> Iterator[str]:
    """A repository with a tag v1 on a smart-HTTP git server on 127.0.0.1: `run --repo` walks it."""
    served = tmp_path / "served"
    served.mkdir()
    make_repo(served, "walk.git", tagged={"README.md": "walked\n"}, later={"README.md": "later\n"})
    with Site(served) as site:
        yield site.url("walk.git")


@pytest.mark.slow
def test_every_documented_command_and_flag(fleet_env: dict, oracle: OracleLM, tmp_path: Path, walk_repo: str) -> None:
    prereqs.require_desktop()  # `desktop --self-test` is walked too
    oracle.add(Scenario("hello", ["SUBMIT('hi')"]))
    fleet_env.update(PRICED)  # --max-cost needs a known price
    fleet_env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # where `desktop --install` writes
    docs = documented()
    from tests.optimize.test_cli import OPTIMIZE_WALK  # walked there, in order (later steps use earlier results)
    from tests.sandbox.test_daytona_cli import DAYTONA_WALK  # walked there, against the Daytona API double

    walked = {(key, flag) for key, flag in GOOD} | set(DAYTONA_WALK) | set(OPTIMIZE_WALK)
    wanted = {(key, flag) for key, flags in docs.items() for flag in flags} | {
        (key, "") for key, flags in docs.items() if not flags and len(key) > 1
    }
    assert wanted - walked == set(), "documented but not walked: add a case to GOOD"
    assert walked - wanted - {(k, "") for k, _ in [*GOOD, *DAYTONA_WALK, *OPTIMIZE_WALK]} == set(), (
        "walked but not documented"
    )

    folder = tmp_path / "docs folder"
    folder.mkdir()
    (folder / ".hidden.txt").write_text("hidden")
    note = folder / "note.md"
    note.write_text("remember the milk")
    for target in ("notes/memory/a.md", "notes/memory/c.md", "scratch/memory/a.md"):
        assert run("volumes", "put", str(note), target, env=fleet_env).returncode == 0
    first = json.loads(run("run", "hello", "--text", "x", "--json", env=fleet_env).stdout)
    fleet_env["FLEET_FETCH_ALLOWED_HOSTS"] = "127.0.0.1"  # the walk's git server
    lab = {"command": sys.executable, "args": [tools_mcp_server.__file__, "stdio", str(tmp_path / "lab.log")]}
    fleet_env["FLEET_MCP_SERVERS"] = json.dumps({"lab": lab})  # --mcp lab: the REPL-tools tests' server
    values = {"file": str(note), "dir": str(folder), "run": first["run_id"], "missing": str(tmp_path / "nope.txt")}
    values["repo"] = walk_repo

    distinct = [list(argv) for argv in dict.fromkeys(tuple(argv) for argv in GOOD.values())]
    with ThreadPoolExecutor(4) as pool:
        good = list(pool.map(lambda argv: _invoke(argv, fleet_env, values), distinct))
    failures = [
        f"{' '.join(argv)} -> {code}: {err.strip()[-300:]}"
        for argv, code, err in good
        if code != 0 and not (argv[:1] == ["doctor"] and "--strict" in argv and code == 2)
    ]
    assert not failures, "\n".join(failures)
    # They did what they say: every run is recorded, put wrote, rm --all removed the volume.
    before = _run_ids(fleet_env)
    assert len(before) == 1 + sum(argv[0] in ("run", "fork") for argv in distinct)
    assert run("volumes", "cat", "notes/memory/b.md", env=fleet_env).stdout == "remember the milk"
    volumes = [v["name"] for v in json.loads(run("volumes", "ls", "--json", env=fleet_env).stdout)]
    assert "scratch" not in volumes and "notes" in volumes

    with ThreadPoolExecutor(4) as pool:
        bad = list(pool.map(lambda argv: _invoke(argv, fleet_env, values), BAD))
    failures = [
        f"{' '.join(argv)} -> {code}: {err.strip()[:300]!r}"
        for argv, code, err in bad
        if code != 2 or not err.startswith("error: ") or "Traceback" in err
    ]
    assert not failures, "\n".join(failures)
    assert _run_ids(fleet_env) == before, "a refused request was recorded as a run"


@pytest.mark.slow
@pytest.mark.parametrize("bad", [["--volume", "../x"], ["--context", "vol:nope/x"], ["--context", "{empty}"]])
def test_bad_context_is_refused_before_a_run(fleet_env: dict, bad: list[str], tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = run("run", "hello", *[a.format(empty=tmp_path / "empty") for a in bad], env=fleet_env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")
    assert _run_ids(fleet_env) == []
