"""The report: the machine it ran on, each figure's table, and the bounds from ``bench/bounds.toml``
checked against the run's ratios (ratios only: both sides of each come from the same run)."""

from __future__ import annotations

import os
import platform
import tomllib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Bound:
    ratio: str
    max: float | None
    min: float | None
    modes: tuple[str, ...]
    why: str

    @property
    def figure(self) -> str:
        return self.ratio.split(".", 1)[0]

    def describe(self) -> str:
        return " and ".join(
            ([f">= {self.min}"] if self.min is not None else []) + ([f"<= {self.max}"] if self.max is not None else [])
        )


def load_bounds(path: Path) -> list[Bound]:
    """Each ``[[bound]]`` names a ratio and a ``max`` and/or ``min``; ``modes`` defaults to both."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    bounds = []
    for item in raw.get("bound", []):
        if "ratio" not in item or ("max" not in item and "min" not in item):
            raise ValueError(f"{path}: every [[bound]] needs 'ratio' and 'max' or 'min': {item}")
        bounds.append(
            Bound(
                item["ratio"],
                item.get("max"),
                item.get("min"),
                tuple(item.get("modes", ("quick", "full"))),
                item.get("why", ""),
            )
        )
    return bounds


def check_bounds(
    ratios: dict[str, float | None], bounds: list[Bound], mode: str, figures: set[str] | None = None
) -> list[dict[str, Any]]:
    """One verdict per bound that applies; a ratio that was not measured fails its bound."""
    verdicts = []
    for bound in bounds:
        if mode not in bound.modes or (figures is not None and bound.figure not in figures):
            continue
        value = ratios.get(bound.ratio)
        ok = (
            value is not None
            and (bound.max is None or value <= bound.max)
            and (bound.min is None or value >= bound.min)
        )
        verdicts.append(
            {
                "ratio": bound.ratio,
                "figure": bound.figure,
                "value": value,
                "bound": bound.describe(),
                "ok": ok,
                "why": bound.why if value is not None else "not measured in this run",
            }
        )
    return verdicts


def machine() -> dict[str, Any]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor() or "unknown",
    )
    mem_kb = next((int(line.split()[1]) for line in _lines("/proc/meminfo") if line.startswith("MemTotal")), 0)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 2**20, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "dspy": version("dspy"),
        "fleet_rlm": version("fleet-rlm"),
        "load_average": os.getloadavg(),
    }


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    out = [
        f"## Results ({report['mode']} run, {report['date']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['os']}, Python {m['python']}, "
        f"dspy {m['dspy']}; load average at start {', '.join(f'{x:.2f}' for x in m['load_average'])}.",
        f"Command: `{report['command']}` ({report['seconds']:.0f} s).",
        "",
    ]
    for fig in report["figures"]:
        out += [f"### {fig['title']}", ""]
        if not fig["available"]:
            out += [f"*{fig['reason']}*", ""]
            continue
        out += [f"| {' | '.join(fig['columns'])} |", f"|{'---|' * len(fig['columns'])}"]
        out += [f"| {' | '.join(row)} |" for row in fig["rows"]]
        out += [""] + [f"- {note}" for note in fig["notes"]] + ([""] if fig["notes"] else [])
    out += ["### Bounds (`bench/bounds.toml`)", "", "| ratio | value | bound | |", "|---|---|---|---|"]
    for v in report["bounds"]:
        value = "not measured" if v["value"] is None else f"{v['value']:.2f}"
        if v.get("first_value") is not None:
            value += f" (first {v['first_value']:.2f}, measured again)"
        out.append(f"| `{v['ratio']}` | {value} | {v['bound']} | {'ok' if v['ok'] else '**FAILED**'} |")
    return "\n".join(out) + "\n"
