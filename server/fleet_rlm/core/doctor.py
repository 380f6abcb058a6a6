"""What is configured, what is missing, and how to fix it: shared by CLI `doctor` and MCP `doctor`."""

from __future__ import annotations

from typing import Any

from fleet_rlm import config as cfg
from fleet_rlm.core.telemetry import telemetry_check
from fleet_rlm.errors import FleetError

_FIX = "change what the detail names, then run doctor again"


async def _check_model(settings: cfg.Settings, offline: bool) -> dict[str, Any]:
    if not settings.lm_model:
        return {"ok": False, "detail": "no model set", "fix": "set FLEET_LM_MODEL (e.g. openai/gpt-4o-mini)"}
    where = settings.lm_api_base or "provider default endpoint"
    if offline:  # no runtime import either: --offline stays fast
        return {"ok": True, "detail": f"{settings.lm_model} at {where} (not contacted: --offline)"}
    from fleet_rlm.core.lm import build_lm, explain_lm_error, metered, preflight

    lm = None
    try:
        lm = build_lm(settings)  # a model string LiteLLM cannot route fails here
        lm.num_retries = 0
        doubts = await preflight(lm)  # the same check a run makes first: unknown model, closed port
        _, usage = await metered(lambda: lm.acall(prompt="Reply with the word OK.", max_tokens=5))
    except FleetError as exc:
        return {"ok": False, "detail": exc.message, "fix": _FIX}
    except Exception as exc:
        return {"ok": False, "detail": explain_lm_error(exc, lm), "fix": _FIX}
    latency = f", answered in {usage.latency:.2f}s" if usage else ""
    return {"ok": True, "detail": f"{settings.lm_model} at {where}{latency}" + "".join(f"; {d}" for d in doubts)}


async def check_model(settings: cfg.Settings) -> dict[str, Any]:
    """The model connection test alone: one short call, as a run's first would make."""
    return await _check_model(settings, offline=False)


async def check_sandbox(settings: cfg.Settings) -> dict[str, Any]:
    """The sandbox connection test: start one of the configured backend and run a line of code in it."""
    import tempfile
    import time
    from pathlib import Path

    from fleet_rlm.core.run import open_sandbox, sandbox_spec

    fix = "run `fleet-rlm doctor` for the sandbox's checks, or set FLEET_SANDBOX=local"
    settings.make_home()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(dir=settings.work_root, prefix="check-") as tmp:
            async with open_sandbox(settings, sandbox_spec(settings, Path(tmp) / "repl", {})) as box:
                result = await box.execute("print(6 * 7)", timeout=60)
                isolation = getattr(box, "isolation", "unknown")
    except Exception as exc:  # any failure to start is the answer to "does the sandbox work?"
        return {"ok": False, "detail": f"the {settings.sandbox} sandbox did not start: {exc}", "fix": fix}
    if result.error or result.stdout.strip() != "42":
        return {"ok": False, "detail": f"the {settings.sandbox} sandbox ran code wrongly: {result.error}", "fix": fix}
    seconds = time.monotonic() - started
    return {"ok": True, "detail": f"{settings.sandbox} sandbox (isolation: {isolation}) ran code in {seconds:.2f}s"}


async def doctor_report(settings: cfg.Settings, offline: bool = False) -> dict[str, dict[str, Any]]:
    from fleet_rlm.sandbox.base import SandboxError, get_backend

    report: dict[str, dict[str, Any]] = {"model": await _check_model(settings, offline)}
    try:  # each backend checks itself (isolation, caps, credentials)
        report.update(get_backend(settings.sandbox).doctor(settings))
    except SandboxError as exc:  # every run would fail: ``blocking`` makes doctor fail too
        report["sandbox"] = {"ok": False, "blocking": True, "detail": str(exc), "fix": cfg.sandbox_setting_fix()}
    report["keyring"] = _check_keyring(settings)
    withheld = cfg.withheld_keys(settings)
    if withheld:  # a model moved away from its key: its calls go out without one
        report["keys"] = {"ok": False, "detail": "; ".join(withheld.values()),
                          "fix": "give each key again for its model's endpoint, or point the model back"}  # fmt: skip
    report["store"] = {"ok": True, "detail": str(settings.store_path), "exists": settings.store_path.exists()}
    report["git"] = _check_git()
    report["otel"] = telemetry_check(settings)
    return report


def _check_git() -> dict[str, Any]:
    """git clones repositories for the workspace agent's add_context_from_repo (nothing else needs it)."""
    import shutil

    found = shutil.which("git")
    if found:
        return {"ok": True, "detail": found}
    return {"ok": False, "detail": "git is not installed: the agent cannot pull repositories in",
            "fix": "install git (e.g. apt install git), or never ask the agent for repositories"}  # fmt: skip


def _check_keyring(settings: cfg.Settings) -> dict[str, Any]:
    """A missing keyring is a problem only when a key has nowhere else to come from."""
    usable, backend = cfg.keyring_status()
    if usable:
        return {"ok": True, "detail": backend}
    if settings.lm_api_key is not None or settings.lm_api_base:  # key in the environment, or a local server
        return {"ok": True, "detail": f"{backend}: not usable, not needed (key in the environment, or a local server)"}
    return {
        "ok": False,
        "detail": backend,
        "fix": "set keys as environment variables, or install and unlock a Secret Service",
    }
