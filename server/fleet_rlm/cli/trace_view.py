"""Render a run's trace tree in the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from fleet_rlm.cli.common import plural
from fleet_rlm.core.views import cache_note, lineage_line, lineage_of, models_note
from fleet_rlm.types import tokens_of


def _short(text: str | None, full: bool, limit: int = 400) -> str:
    text = text or ""
    return text if full or len(text) <= limit else text[:limit] + f" … [{len(text) - limit:,} more chars]"


def _node_tree(tree: Tree, trace: dict[str, Any], name: str, full: bool) -> None:
    node = trace["nodes"][name]
    for step in node["steps"]:
        lm = step.get("lm") or {}
        tokens = tokens_of(lm)
        head = f"[bold]step {step['step']}[/bold]"
        if lm.get("replayed"):
            head += " [dim](answered from the record)[/dim]"
        elif lm:
            cached = cache_note(lm).removeprefix(" · ")
            head += f" [dim]({lm.get('model')}, {tokens:,} tokens, {cached + ', ' if cached else ''}"
            head += f"{lm.get('latency') or 0:.2f}s)[/dim]"
        if step.get("submitted"):
            head += " [green]SUBMIT[/green]"
        branch = tree.add(head)
        if step.get("reasoning"):
            branch.add("[italic]" + escape(_short(step["reasoning"], full)) + "[/italic]")
        if step.get("code"):
            branch.add("[yellow]code[/yellow]\n" + escape(_short(step["code"], full, 1200)))
        if step.get("output") is not None:
            style = "red" if step.get("error") else "white"
            branch.add(
                f"[{style}]output[/{style}] [dim]({step.get('output_chars') or 0:,} chars)[/dim]\n"
                + escape(_short(step["output"], full, 800))
            )
        if step["subcalls"]:
            calls = branch.add(f"[magenta]{plural(len(step['subcalls']), 'sub-query', 'sub-queries')}[/magenta]")
            for call in step["subcalls"]:
                outcome = call.get("error") or call.get("response_preview") or ""
                calls.add(
                    escape(
                        f"{_short(call.get('prompt_preview'), full, 60)!r} → {_short(outcome, full, 80)!r}"
                        f" ({_named(call)}{call.get('latency') or 0:.2f}s)"
                    )
                )
        if step.get("tools"):
            tools = branch.add(f"[green]{plural(len(step['tools']), 'tool call')}[/green]")
            for call in step["tools"]:
                outcome = call.get("error") or f"{call.get('result_chars') or 0:,} chars"
                again = ", from the record" if call.get("replayed") else ""
                tools.add(
                    escape(f"{call.get('server')}.{call.get('tool')} → {_short(outcome, full, 80)}")
                    + f" [dim]({call.get('seconds') or 0:.2f}s{again})[/dim]"
                )
        for child in step["children"]:
            c = trace["nodes"][child]
            sub = branch.add(
                f"[cyan]child {child}[/cyan] {c.get('status')}: " + escape(_short(c.get("query_preview"), full, 100))
            )
            _node_tree(sub, trace, child, full)
    for warning in node["warnings"]:
        tree.add("[red]warning[/red] " + escape(str(warning)))


def _named(call: dict[str, Any]) -> str:
    """The named model that answered a sub-query (``model=NAME``), as "fast, "; empty for the sub model."""
    name = call.get("model_name")
    return f"{name}, " if name and name != "sub" else ""


def render(row: Any, trace: dict[str, Any], *, full: bool = False, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    run = trace["run"]
    usage = (run.get("usage") or {}).get("total") or {}
    title = (
        f"[bold]run {row.id}[/bold] · {row.status} · {plural(row.iterations, 'step')}"
        f" · {plural(row.llm_calls, 'model call')}"
        f" · {tokens_of(usage):,} tokens"
        f"{escape(cache_note(usage))}"
        f"{escape(models_note(run.get('usage') or {}))}"
    )
    tree = Tree(title)
    tree.add("[bold]question[/bold] " + escape(_short(row.question, full)))
    lineage = lineage_line(**lineage_of(row))
    if lineage:
        tree.add("[blue]lineage[/blue] " + escape(lineage))
    _node_tree(tree.add("[cyan]root[/cyan]"), trace, "root", full)
    if row.answer is not None:
        tree.add("[green]answer[/green] " + escape(_short(row.answer, full, 2000)))
    if row.stop_reason:
        tree.add("[yellow]stopped[/yellow] " + escape(row.stop_reason))
    if row.error:
        tree.add("[red]error[/red] " + escape(row.error))
    console.print(tree)
