"""Entry points ``fleet-rlm`` and ``fleet``. Only argparse at import: ``--help`` stays fast,
the runtime (dspy, litellm) loads when a command needs it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fleet_rlm import __version__
from fleet_rlm.cli.common import Parser, fail, limit_argument, not_negative, positive, since_date
from fleet_rlm.limits import LIMITS, MAX_ITERS, check_limits  # a leaf module: --help stays fast
from fleet_rlm.types import STATUSES  # a leaf module: --help stays fast

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from fleet_rlm.core.engine import Engine

Handler = Callable[[argparse.Namespace], int]
TRACE_MODES = ["compact", "verbose", "off"]


def _limits(p: argparse.ArgumentParser) -> None:
    for limit in LIMITS.values():
        limit_argument(p, limit)
    p.add_argument("--sandbox", choices=["local", "daytona"], default=None, help="where code runs (local, daytona)")


def _context(p: argparse.ArgumentParser, *, urls: bool = False) -> None:
    p.add_argument(
        "--context",
        "-c",
        action="append",
        default=[],
        metavar="PATH|URL" if urls else "PATH",
        help=f"file, folder, vol:NAME/PATH, {'http(s) URL (fetched), ' if urls else ''}or - for stdin (repeatable)",
    )


def _trace_mode(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace-mode",
        choices=TRACE_MODES,
        default="compact",
        help="progress on stderr: compact (default), verbose (code and output) or off",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fleet-rlm",
        description="Answer questions over inputs far larger than a context window, "
        "with a recursive language model working in a sandboxed Python REPL.",
    )
    parser.add_argument("--version", action="version", version=f"fleet-rlm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="answer a question over files, folders or text")
    run.add_argument("question")
    _context(run, urls=True)
    run.add_argument(
        "--repo",
        metavar="URL[@REF]",
        help="a git repository (http/https) at a branch or tag, cloned shallowly as context",
    )
    run.add_argument("--text", "-t", action="append", default=[], help="pasted text as context (repeatable)")
    run.add_argument(
        "--include-hidden",
        action="store_true",
        help="read hidden files, .git/node_modules/.venv and .gitignore'd paths of context folders",
    )
    run.add_argument("--session", metavar="ID", help="continue in a session's REPL")
    run.add_argument("--volume", metavar="NAME", help="mount only this volume (created if new); default: all volumes")
    run.add_argument(
        "--mcp", action="append", default=[], metavar="NAME",
        help="give the REPL the tools of this configured MCP server (FLEET_MCP_SERVERS; repeatable)",
    )  # fmt: skip
    run.add_argument(
        "--tool", action="append", default=[], metavar="MODULE:FUNCTION",
        help="give the REPL this Python function, imported and run on the host (repeatable)",
    )  # fmt: skip
    run.add_argument(
        "--allow-tool", action="append", default=[], metavar="SERVER.TOOL",
        help="let the REPL call this tool although it is not marked read-only (SERVER.* for all; repeatable)",
    )  # fmt: skip
    _limits(run)
    run.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    _trace_mode(run)

    runs = sub.add_parser("runs", help="list recent runs")
    runs.add_argument("--limit", type=positive(int), default=20, metavar="N", help="how many (default 20)")
    runs.add_argument("--status", choices=STATUSES, metavar="S", help=f"only runs that are {', '.join(STATUSES)}")
    runs.add_argument("--json", action="store_true", help="print a JSON list")

    pin = sub.add_parser("pin", help="keep a run when retention deletes old runs (or --off to let it go)")
    pin.add_argument("run_id")
    pin.add_argument("--off", action="store_true", help="unpin: retention may delete it again")

    trace = sub.add_parser("trace", help="show a run's trace as a tree")
    trace.add_argument("run_id")
    trace.add_argument("--json", action="store_true", help="the tree as JSON")
    trace.add_argument("--full", action="store_true", help="do not shorten code and outputs")

    export = sub.add_parser("export", help="print a run's events as JSON lines, or save it as one HTML file")
    export.add_argument("run_id")
    how = export.add_mutually_exclusive_group()
    how.add_argument("--html", metavar="FILE", help="write a self-contained HTML page of the run (works offline)")
    how.add_argument(
        "--format",
        choices=("events", "rlms"),
        default="events",
        help="events: ours (default); rlms: the reference rlms package's trajectory, for its visualizer",
    )
    export.add_argument("--force", action="store_true", help="with --html: overwrite FILE if it exists")
    _rerun(sub)

    vol = sub.add_parser("volumes", help="list, read, write and delete volume files")
    vsub = vol.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = vsub.add_parser("ls", help="list volumes, or files in VOLUME[/PATH]")
    ls.add_argument("target", nargs="?")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    cat = vsub.add_parser("cat", help="print a file: VOLUME/PATH")
    cat.add_argument("target")
    put = vsub.add_parser("put", help="copy a local file (or - for stdin) to VOLUME/PATH")
    put.add_argument("source")
    put.add_argument("target")
    rm = vsub.add_parser("rm", help="delete VOLUME/PATH, or a whole VOLUME with --all")
    rm.add_argument("target")
    rm.add_argument("--all", action="store_true", help="delete the whole volume and every file in it")

    doctor = sub.add_parser("doctor", help="check the model, sandbox, keyring, store and Daytona settings")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--offline", action="store_true", help="skip the model reachability call")
    doctor.add_argument("--strict", action="store_true", help="exit 2 when a sandbox cap is not enforced")

    cfg = sub.add_parser("config", help="get and set settings (secrets go to the OS keyring)")
    csub = cfg.add_subparsers(dest="action", metavar="ACTION", required=True)
    csub.add_parser("list", help="every setting, its value (secrets masked) and where it comes from")
    g = csub.add_parser("get", help="one setting's value (secrets masked)")
    g.add_argument("key")
    s = csub.add_parser("set", help="save a setting (secrets go to the OS keyring, never a file)")
    s.add_argument("key")
    s.add_argument("value", nargs="?", help="omit for secrets to be prompted without echo")
    u = csub.add_parser("unset", help="remove a saved setting (or a secret from the keyring)")
    u.add_argument("key")

    web = sub.add_parser("web", help="the web UI, JSON API and MCP (/mcp) on one local server")
    web.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    web.add_argument("--port", type=not_negative, default=8000, help="port (default 8000; 0: any free one)")
    web.add_argument("--no-open", action="store_true", help="do not open a browser")
    web.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host (token stays required)")

    desk = sub.add_parser("desktop", help="the web UI in a native window (needs the 'desktop' extra)")
    desk.add_argument("--self-test", action="store_true", help="open the window, check the UI and server, exit")
    desk.add_argument("--screenshot", metavar="PATH", help="with --self-test: save the window as a PNG")
    menu = desk.add_mutually_exclusive_group()
    menu.add_argument("--install", action="store_true", help="add the window to the desktop's app menu, then exit")
    menu.add_argument("--uninstall", action="store_true", help="remove what --install added, then exit")

    mcp = sub.add_parser("serve-mcp", help="serve the runtime as an MCP server (same as fleet-mcp)")
    mcp.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="stdio (default) or http")
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP: interface (default loopback)")
    mcp.add_argument("--port", type=positive(int), default=8765, help="HTTP: port (default 8765)")
    mcp.add_argument(
        "--allow-remote", action="store_true", help="HTTP: allow a non-loopback host (authentication stays on)"
    )
    mcp.add_argument(
        "--no-auth",
        action="store_true",
        help="HTTP: serve without a bearer token (default: FLEET_MCP_TOKEN, else one printed at launch)",
    )

    day = sub.add_parser("daytona", help="Daytona sandboxes: register the snapshot, smoke test, clean up")
    dsub = day.add_subparsers(dest="action", metavar="ACTION", required=True)
    dsub.add_parser("setup", help="register the snapshot the sandboxes start from (once per worker version)")
    smoke = dsub.add_parser("smoke", help="check credentials, snapshot, volume, execution and the host bridge")
    smoke.add_argument("--json", action="store_true", help="print the timed checks as JSON")
    gc = dsub.add_parser("gc", help="delete fleet-rlm sandboxes whose process is gone (a killed run's)")
    gc.add_argument("--all", action="store_true", help="every fleet-rlm sandbox, in use or not")
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    gc.add_argument("--json", action="store_true", help="print what was removed and kept as JSON")

    chat = sub.add_parser("chat", help="interactive session in the terminal")
    _context(chat)
    _trace_mode(chat)
    _limits(chat)
    chat.add_argument(
        "--agent",
        action="store_true",
        help="talk to the workspace agent (it runs RLMs, keeps memory; asks before side effects)",
    )
    _optimization(sub)
    return parser


def _rerun(sub: Any) -> None:
    """``replay`` and ``fork`` (docs/replay.md)."""
    replay = sub.add_parser("replay", help="rerun recorded runs on the current code, every model call from the record")
    replay.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="the runs to replay")
    replay.add_argument("--all", action="store_true", help="every finished run (with --since: created since DATE)")
    replay.add_argument("--since", type=since_date, metavar="DATE", help="with --all: runs created on or after DATE")
    replay.add_argument("--json", action="store_true", help="print the report as JSON (several: {replays, skipped})")

    fork = sub.add_parser("fork", help="a new run from a recorded one: steps before STEP replayed, then live")
    fork.add_argument("run_id")
    fork.add_argument("--at", required=True, metavar="STEP", help="the step to branch at: N, or NODE:N (root.1:2)")
    given = fork.add_mutually_exclusive_group()
    given.add_argument("--code", metavar="FILE", help="run this Python (- for stdin) at that step, asking no model")
    given.add_argument("--instruction", metavar="TEXT", help="ask the model at that step with this added")
    limit_argument(fork, MAX_ITERS, help=f"steps per node, {MAX_ITERS.span} (default: the run's)")
    fork.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _optimization(sub: Any) -> None:
    """``dataset``, ``optimize`` and ``programs`` (docs/optimization.md)."""
    ds = sub.add_parser("dataset", help="datasets of questions with expected answers, for optimize")
    dsub = ds.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = dsub.add_parser("import", help="make a dataset from a JSONL file (- for stdin) or from judged runs")
    imp.add_argument("file", nargs="?", help='JSON lines: {"question", "context" or "context_path", "answer"}')
    imp.add_argument("--name", required=True, help="the dataset's name")
    imp.add_argument("--feedback", action="store_true", help="from runs marked right or wrong instead of a file")
    imp.add_argument("--holdout", type=_fraction, default=0.2, metavar="F", help="share kept back (default 0.2)")
    imp.add_argument("--seed", type=not_negative, default=0, metavar="N", help="seed of the split (default 0)")
    imp.add_argument("--json", action="store_true", help="print the dataset as JSON")
    exp = dsub.add_parser("export", help="print a dataset as JSON lines")
    exp.add_argument("name")
    dls = dsub.add_parser("ls", help="list datasets")
    dls.add_argument("--json", action="store_true", help="print a JSON list")
    show = dsub.add_parser("show", help="a dataset's rows and split")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="print it as JSON")

    opt = sub.add_parser("optimize", help="improve the RLM program on a dataset (GEPA, MIPROv2, bootstrap)")
    opt.add_argument("--dataset", metavar="NAME", help="the dataset to learn from")
    opt.add_argument("--optimizer", choices=["gepa", "mipro", "bootstrap"], help="the DSPy optimizer")
    opt.add_argument("--metric", default="normalised", metavar="M",
                     help="exact, normalised (default), numeric[:TOL], f1 or judge")  # fmt: skip
    opt.add_argument("--base", metavar="VERSION", help="optimize this program version (default: the active one)")
    opt.add_argument("--trials", type=positive(int), metavar="N", help="GEPA full evaluations / MIPROv2 trials (4)")
    opt.add_argument("--max-calls", type=positive(int), metavar="N", help="stop after the replays made N model calls")
    opt.add_argument("--max-total-cost", type=positive(float), metavar="USD", help="stop after the replays cost this")
    opt.add_argument("--resume", metavar="ID", help="rerun an interrupted optimization, skipping finished replays")
    _limits(opt)
    opt.add_argument("--verbose", action="store_true", help="also show DSPy's own log lines and progress bars")
    opt.add_argument("--json", action="store_true", help="print the id, the new version and the scores as JSON")

    prog = sub.add_parser("programs", help="program versions: list, show, compare, promote, roll back")
    psub = prog.add_subparsers(dest="action", metavar="ACTION", required=True)
    pls = psub.add_parser("ls", help="versions with their scores; the active one is marked *")
    pls.add_argument("--json", action="store_true", help="print JSON")
    pshow = psub.add_parser("show", help="a version's scores and the instructions and demos it changed")
    pshow.add_argument("version")
    pshow.add_argument("--json", action="store_true", help="print all of it as JSON")
    cmp = psub.add_parser("compare", help="two versions side by side: scores, instruction diff, demos")
    cmp.add_argument("a", help="a version id, or builtin")
    cmp.add_argument("b", help="a version id, or builtin")
    cmp.add_argument("--json", action="store_true", help="print all of it as JSON")
    prom = psub.add_parser("promote", help="make a version active if it passes the promotion gate")
    prom.add_argument("version")
    prom.add_argument("--override", metavar="REASON", help="promote even if the gate fails; the reason is kept")
    prom.add_argument("--tolerance", type=_fraction, default=0.0, metavar="T", help="holdout drop allowed (0)")
    prom.add_argument("--json", action="store_true", help="print JSON")
    rb = psub.add_parser("rollback", help="make the version active before the current one active again")
    rb.add_argument("--json", action="store_true", help="print JSON")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not 0 <= value < 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, not {text}")
    return value


def _handler(name: str) -> Handler:
    if name in {"run", "runs", "pin", "trace", "export"}:
        from fleet_rlm.cli import runs as mod
    elif name in {"replay", "fork"}:
        from fleet_rlm.cli import rerun as mod  # type: ignore[no-redef]
    elif name == "agent_chat":
        from fleet_rlm.cli import agent_chat as mod  # type: ignore[no-redef]
    elif name == "volumes":
        from fleet_rlm.cli import volumes as mod  # type: ignore[no-redef]
    elif name == "serve-mcp":
        return _serve_mcp
    elif name == "web":
        return _web
    elif name == "desktop":
        from fleet_shell import launch as mod  # type: ignore[no-redef]  # the desktop face's entry point
    elif name in {"dataset", "optimize", "programs"}:
        from fleet_rlm.cli import optimize as mod  # type: ignore[no-redef]
    elif name == "daytona":
        from fleet_rlm.cli import daytona as mod  # type: ignore[no-redef]
    elif name in {"doctor", "config"}:
        from fleet_rlm.cli import setup as mod  # type: ignore[no-redef]
    else:
        from fleet_rlm.cli import chat as mod  # type: ignore[no-redef]
    return getattr(mod, f"cmd_{name}")  # type: ignore[no-any-return]


def _serve_mcp(args: argparse.Namespace) -> int:
    """Entry-point wiring only: the MCP face runs on its own, this just launches it."""
    from fleet_rlm.mcp.server import main as mcp_main

    argv = ["--transport", args.transport, "--host", args.host, "--port", str(args.port)]
    flags = [flag for flag, on in (("--allow-remote", args.allow_remote), ("--no-auth", args.no_auth)) if on]
    return mcp_main(argv + flags)


def _web(args: argparse.Namespace) -> int:
    """Entry-point wiring only: ``fleet web`` is handed the MCP face it serves at ``/mcp``."""
    from fleet_rlm.web.serve import cmd_web

    return cmd_web(args, mcp=_mcp_over_http)


def _mcp_over_http(engine: Engine, *, token: str | None, host: str, port: int | None, allow_remote: bool) -> ASGIApp:
    """The MCP face's HTTP app, imported only when the web app mounts it (off its event loop): the
    MCP SDK takes a second or two to import, and ``/health`` answers before that."""
    from fleet_rlm.mcp.server import http_app

    return http_app(engine, token=token, host=host, port=port, allow_remote=allow_remote)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    return _dispatch(args)


def _command(args: argparse.Namespace) -> str:
    """``fleet --agent`` is the chat with the workspace agent: chosen here, so the plain chat (which the
    agent chat builds on) never reaches for the module that subclasses it."""
    return "agent_chat" if args.command == "chat" and getattr(args, "agent", False) else args.command


def _dispatch(args: argparse.Namespace) -> int:
    """Run one command; every failure becomes one line and an exit status, in ``fail``."""
    try:
        check_limits(vars(args))  # before any work, in the words every face uses
        code = _handler(_command(args))(args)
        sys.stdout.flush()  # a reader that left (`| head`) shows up here, not at exit
        return code
    except (Exception, KeyboardInterrupt) as exc:
        return fail(exc)


def fleet_main(argv: Sequence[str] | None = None) -> int:
    """``fleet``: the terminal chat when called bare or with chat options (``fleet --context FILE``),
    otherwise the same commands as fleet-rlm."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in {"-h", "--help", "--version"}):
        argv = ["chat", *argv]
    return main(argv)


if __name__ == "__main__":
    sys.exit(main())
