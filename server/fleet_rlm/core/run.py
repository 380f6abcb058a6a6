"""A run: one question answered by a tree of RLM nodes sharing a budget and an event log."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_rlm.config import Settings
from fleet_rlm.core.budget import Budget, Limits
from fleet_rlm.core.context import StagedContext, stage_context
from fleet_rlm.core.lm import CallUsage, MeteredLM, Usage
from fleet_rlm.core.node import NodeRuntime
from fleet_rlm.core.program import NodeResult, RLMProgram, TranscriptAdapter
from fleet_rlm.sandbox.local import LocalSandbox

Emit = Callable[..., dict[str, Any]]


@dataclass
class RunRequest:
    """What a face asks for. Limits left as None take the settings' values."""

    question: str
    context_paths: list[str] = field(default_factory=list)
    context_text: list[str] = field(default_factory=list)
    session_id: str | None = None
    volume: str | None = None
    max_iters: int | None = None
    max_depth: int | None = None
    max_llm_calls: int | None = None
    max_seconds: float | None = None
    max_cost: float | None = None

    def limits(self, settings: Settings) -> Limits:
        return Limits(
            max_iters=self.max_iters or settings.max_iters,
            max_llm_calls=self.max_llm_calls or settings.max_llm_calls,
            max_depth=settings.max_depth if self.max_depth is None else self.max_depth,
            max_seconds=self.max_seconds or settings.max_seconds,
            max_cost=self.max_cost if self.max_cost is not None else settings.max_cost,
        )

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["context_text"] = [f"({len(t):,} chars)" for t in self.context_text]  # keep rows small
        return data


@dataclass
class RunResult:
    run_id: str
    status: str
    answer: str | None
    iterations: int
    llm_calls: int
    usage: dict[str, Any]
    seconds: float
    stop_reason: str | None = None
    error: str | None = None
    session_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class RunContext:
    """Everything the nodes of one run share."""

    def __init__(
        self,
        *,
        run_id: str,
        settings: Settings,
        limits: Limits,
        emit: Emit,
        root_lm: MeteredLM,
        sub_lm: MeteredLM,
        program: RLMProgram,
        work_dir: Path,
        volumes: dict[str, Path],
    ) -> None:
        self.run_id = run_id
        self.settings = settings
        self.limits = limits
        self.budget = Budget(limits)
        self.usage = Usage()
        self.emit = emit  # (kind, data, *, node, parent, depth): every node's events go here
        self.root_lm = root_lm
        self.sub_lm = sub_lm
        self.adapter = TranscriptAdapter()
        self.program = program
        self.work_dir = work_dir
        self.volumes = volumes
        self.subcall_gate = asyncio.Semaphore(settings.concurrency)
        self.iterations = 0
        self._batches = 0
        self._children: dict[str, int] = {}

    def record_usage(self, usage: CallUsage) -> None:
        self.usage.add(usage)
        self.budget.charge(usage.cost)

    def next_batch_id(self) -> int:
        self._batches += 1
        return self._batches

    def new_sandbox(self, work_dir: Path) -> LocalSandbox:
        return make_sandbox(self.settings, work_dir, self.volumes)

    async def run_node(self, runtime: NodeRuntime) -> NodeResult:
        await runtime.sandbox.register_functions(runtime.host_functions())
        result = await self.program.aforward(runtime)
        self.iterations += result.iterations
        return result

    async def child(self, parent: NodeRuntime, prompt: str, context: str | None) -> str:
        """A child RLM with its own REPL, sharing this run's budget; deeper than allowed, a plain call."""
        depth = parent.depth + 1
        if depth > self.limits.max_depth:
            parent.warn(f"rlm_query at depth {depth} exceeds max_depth {self.limits.max_depth}; using llm_query")
            return await parent.llm_query(prompt if not context else f"{prompt}\n\n{context}")
        index = self._children.get(parent.node, 0) + 1
        self._children[parent.node] = index
        node = f"{parent.node}.{index}"
        work = self.work_dir / node
        sandbox = self.new_sandbox(work)
        started = time.monotonic()
        self.emit(
            "child.started",
            {"query_preview": prompt[:200], "query_chars": len(prompt), "context_chars": len(context or "")},
            node=node,
            parent=parent.node,
            depth=depth,
        )
        result: NodeResult | None = None
        error: str | None = None
        try:
            await sandbox.start()
            staged = await load_inputs(sandbox, work, prompt, texts=[context] if context else [])
            runtime = NodeRuntime(
                self, node=node, parent=parent.node, depth=depth, query=prompt, sandbox=sandbox, staged=staged
            )
            result = await self.run_node(runtime)
        except Exception as exc:
            error = str(exc)
            raise
        finally:
            await sandbox.shutdown()
            shutil.rmtree(work, ignore_errors=True)
            self.emit(
                "child.finished",
                {
                    "status": result.status if result else "failed",
                    "answer_preview": ((result.answer if result else None) or "")[:200],
                    "iterations": result.iterations if result else 0,
                    "stop_reason": result.stop_reason if result else None,
                    "error": error,
                    "seconds": round(time.monotonic() - started, 3),
                },
                node=node,
                parent=parent.node,
                depth=depth,
            )
        if result.answer is None:
            raise RuntimeError(f"child RLM {node} found no answer ({result.stop_reason})")
        return result.answer


def make_sandbox(settings: Settings, work_dir: Path, volumes: dict[str, Path]) -> LocalSandbox:
    """A sandbox with the settings' limits and the given volumes mounted."""
    return LocalSandbox(
        work_dir,
        volumes=volumes,
        isolation=settings.isolation,
        memory_mb=settings.memory_mb,
        exec_timeout=settings.exec_timeout,
    )


async def load_inputs(
    sandbox: LocalSandbox,
    work: Path,
    query: str,
    *,
    paths: list[str] | None = None,
    texts: list[str] | None = None,
    volumes: Any = None,
    roots: list[Path] | None = None,
    keep_context: bool = False,
) -> StagedContext | None:
    """Put query, context and sources into the REPL once, through files, never re-sent."""
    inputs = work / ".inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    query_file = inputs / "query.txt"
    query_file.write_text(query, encoding="utf-8")
    await sandbox.load_text("query", query_file)
    await sandbox.set_var("volumes", dict(sandbox.volume_paths))  # name -> path inside the sandbox
    if keep_context and not paths and not texts:
        return None
    staged = stage_context(inputs / "context.txt", paths=paths, texts=texts, volumes=volumes, roots=roots)
    await sandbox.load_text("context", staged.path)
    await sandbox.set_var("sources", [s.to_dict() for s in staged.sources])
    return staged
