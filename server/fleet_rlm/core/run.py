"""A run: one question answered by a tree of RLM nodes sharing a budget and an event log."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fleet_rlm.config import Settings
from fleet_rlm.core.budget import Budget, Limits
from fleet_rlm.core.context import StagedContext, image_file_name, stage_context
from fleet_rlm.core.inputs.documents import Converter
from fleet_rlm.core.lm import CallUsage, MeteredLM, Usage, build_named_lm, has_price
from fleet_rlm.core.node import NodeRuntime
from fleet_rlm.core.program import NodeResult, RLMProgram, TranscriptAdapter
from fleet_rlm.core.tape import Tape
from fleet_rlm.sandbox.base import Sandbox, SandboxSpec, create_sandbox
from fleet_rlm.types import RunRequest
from fleet_rlm.volumes import Volumes

Emit = Callable[..., dict[str, Any]]


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
        scratch: Path,
        volumes: dict[str, Path],
        volume_store: Volumes | None = None,
        tape: Tape | None = None,
        named_models: Callable[[str], MeteredLM] | None = None,
    ) -> None:
        self.run_id = run_id
        self.settings = settings
        self.limits = limits
        self.budget = Budget(limits)
        self.usage = Usage()
        self.replayed = Usage()  # calls answered from a record (replay, a fork's first steps): no model called
        self.tape = tape  # keeps what every call returned; in a replay or fork, answers from the source run's
        self.tools: Any = None  # core.tools.ToolBox: the tools the run's REPLs call (set by the engine)
        self.reply_forms: Counter[str] = Counter()  # how the root model's replies were written (core.replies)
        self.emit = emit  # (kind, data, *, node, parent, depth): every node's events go here
        self.root_lm = root_lm
        self.sub_lm = sub_lm
        # Named models (settings.models), built once per engine when it hands its cache over.
        self._named_models = named_models or functools.cache(functools.partial(build_named_lm, settings))
        self.adapter = TranscriptAdapter()
        self.program = program
        self.scratch = scratch  # host-only folder of this run: staged inputs and one folder per sandbox
        self.volumes = volumes
        self.volume_store = volume_store  # enforces volume quotas after each step
        self.subcall_gate = asyncio.Semaphore(settings.concurrency)
        self.iterations = 0
        self._batches = 0
        self._children: dict[str, int] = {}

    def record_usage(self, usage: CallUsage) -> None:
        # A replayed call costs nothing now, but the budget sees what it cost when recorded, so the
        # run stops where the recorded run stopped.
        (self.replayed if usage.replayed else self.usage).add(usage)
        self.budget.charge(usage.cost, usage.prompt_tokens + usage.completion_tokens)

    def count_reply_forms(self, forms: list[str]) -> None:
        self.reply_forms.update(forms)

    def usage_report(self) -> dict[str, Any]:
        """What the run used, as recorded: tokens and cost per model, and its replies per form."""
        report = {**self.usage.to_dict(), "reply_forms": dict(self.reply_forms)}
        if self.replayed.by_model:
            report["replayed"] = self.replayed.to_dict()["total"]
        return report

    def named_lm(self, name: Any) -> MeteredLM:
        """The named model ``name`` for a sub-call (``model=NAME`` in the REPL); an unknown name is a
        ValueError the code sees, listing the names configured."""
        configured = self.settings.models
        if not isinstance(name, str) or name not in configured:
            names = ", ".join(sorted(configured)) or "none (set FLEET_MODELS or `fleet-rlm config set models`)"
            raise ValueError(f"no model named {name!r}; configured: {names}")
        lm = self._named_models(name)
        if self.limits.max_cost is not None and not has_price(lm):  # its calls would count as $0 against the cap
            raise ValueError(
                f"model {name!r} ({lm.model}) has no known price, so a run with a cost cap cannot use it: cap "
                "model calls with max_llm_calls instead of max_cost"
            )
        return lm

    def next_batch_id(self) -> int:
        self._batches += 1
        return self._batches

    def sandbox_spec(self, node: str) -> SandboxSpec:
        """A fresh folder per node, side by side in the host-only scratch folder: never inside
        another sandbox's tree, so no sandbox can plant a link where a child's folder goes."""
        spec = sandbox_spec(self.settings, self.scratch / f"node-{node}", self.volumes)
        spec.read_only_volumes = self.tape is not None and self.tape.mode == "replay"  # a replay writes nothing
        return spec

    def inputs_file(self, node: str) -> Path:
        return self.scratch / f"context-{node}.txt"

    async def run_node(self, runtime: NodeRuntime) -> NodeResult:
        await runtime.sandbox.register_functions(runtime.host_functions())
        result = await self.program.aforward(runtime)
        self.iterations += result.iterations
        return result

    async def child(self, parent: NodeRuntime, prompt: str, context: str | None, *, model: str | None = None) -> str:
        """A child RLM with its own REPL, sharing this run's budget; deeper than allowed, a plain call.
        ``model``: a named model takes the child's root steps; its sub-calls stay the run's sub model."""
        depth = parent.depth + 1
        if depth > self.limits.max_depth:
            parent.warn(f"rlm_query at depth {depth} exceeds max_depth {self.limits.max_depth}; using llm_query")
            return await parent.llm_query(prompt if not context else f"{prompt}\n\n{context}", model=model)
        root_lm = self.named_lm(model) if model is not None else None
        index = self._children.get(parent.node, 0) + 1
        self._children[parent.node] = index
        node = f"{parent.node}.{index}"
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
            spec = self.sandbox_spec(node)
            spec.near = parent.sandbox  # a backend may place the child beside its parent (Daytona: shared)
            async with open_sandbox(self.settings, spec, usage=self.usage) as sandbox:
                staged = await load_inputs(sandbox, self.inputs_file(node), prompt, texts=[context] if context else [])
                origin = parent.step_path(parent.step) + ">"  # this child's calls are recorded under it
                runtime = NodeRuntime(
                    self, node=node, parent=parent.node, depth=depth, query=prompt, sandbox=sandbox, staged=staged,
                    origin=origin, root_lm=root_lm
                )  # fmt: skip
                result = await self.run_node(runtime)
        except Exception as exc:
            error = str(exc)
            raise
        finally:
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


def limits_for(req: RunRequest, settings: Settings) -> Limits:
    """The request's limits, the settings' values where it leaves one unset."""
    return Limits(
        max_iters=req.max_iters or settings.max_iters,
        max_llm_calls=req.max_llm_calls or settings.max_llm_calls,
        max_depth=settings.max_depth if req.max_depth is None else req.max_depth,
        max_seconds=req.max_seconds or settings.max_seconds,
        max_cost=req.max_cost if req.max_cost is not None else settings.max_cost,
        max_tokens=req.max_tokens if req.max_tokens is not None else settings.max_tokens,
    )


def sandbox_spec(settings: Settings, work_dir: Path, volumes: dict[str, Path]) -> SandboxSpec:
    """What a sandbox of this run gets: the settings' limits and the given volumes mounted."""
    return SandboxSpec(
        work_dir=work_dir,
        volumes=volumes,
        memory_mb=settings.memory_mb,
        max_procs=settings.max_procs,
        exec_timeout=settings.exec_timeout,
        host_call_mb=settings.host_call_mb,
        host_call_total_mb=settings.host_call_total_mb,
        work_quota_mb=settings.work_quota_mb,
        work_max_files=settings.work_max_files,
    )


@contextlib.asynccontextmanager
async def open_sandbox(
    settings: Settings, spec: SandboxSpec, existing: Sandbox | None = None, usage: Usage | None = None
) -> AsyncIterator[Sandbox]:
    """The one sandbox lifecycle, for root and child nodes: create (unless a session's REPL is
    given), start, and afterwards shut down and remove the folder of a sandbox created here.
    A billed sandbox (one with ``cost_per_second``) adds the time this run held it to ``usage``."""
    sandbox = existing or create_sandbox(settings, spec)
    held = time.monotonic()
    try:
        await sandbox.start()
        yield sandbox
    finally:
        rate = getattr(sandbox, "cost_per_second", None)
        if usage is not None and rate is not None:
            seconds = time.monotonic() - held
            usage.add_sandbox(seconds, seconds * rate)
        if existing is None:
            await sandbox.shutdown()
            await asyncio.to_thread(shutil.rmtree, spec.work_dir, ignore_errors=True)


async def load_inputs(
    sandbox: Sandbox,
    staging: Path,
    query: str,
    *,
    paths: list[str] | None = None,
    texts: list[str] | None = None,
    volumes: Volumes | None = None,
    roots: list[Path] | None = None,
    keep_context: bool = False,
    include_hidden: bool = False,
    converter: Converter | None = None,
    named: list[tuple[str, Path]] | None = None,
) -> StagedContext | None:
    """Put query, context and sources into the REPL once, as data through the sandbox protocol.

    ``staging`` is a host-only file (in the run's scratch folder, which no sandbox can write); ``named``
    are host-only files and folders shown by another name (fetched pages and repositories)."""
    await sandbox.put_text("query", query)
    await sandbox.set_var("volumes", dict(sandbox.volume_paths))  # name -> path inside the sandbox
    if keep_context and not paths and not texts and not named:
        return None

    def stage() -> StagedContext:
        try:
            return stage_context(
                staging,
                paths=paths,
                texts=texts,
                volumes=volumes,
                roots=roots,
                include_hidden=include_hidden,
                converter=converter,
                named=named,
            )
        finally:  # its parser process ends with the staging
            if converter is not None:
                converter.close()

    staged = await asyncio.to_thread(stage)
    await sandbox.put_text("context", staged.path)
    images = {image.name: image for image in staged.images}
    for index, source in enumerate(s for s in staged.sources if s.kind == "image"):
        source.file = f"inputs/images/{index}-{image_file_name(source.name)}"  # open(file, "rb") in the code
        await sandbox.put_file(source.file, images[source.name].path)
    await sandbox.set_var("sources", [s.to_dict() for s in staged.sources])
    return staged
