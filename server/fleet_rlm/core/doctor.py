"""What is configured, what is missing, and how to fix it: shared by CLI `doctor` and MCP `doctor`."""

from __future__ import annotations

from typing import Any

from fleet_rlm import config as cfg


async def _check_model(settings: cfg.Settings, offline: bool) -> dict[str, Any]:
    if not settings.lm_model:
        return {"ok": False, "detail": "no model set", "fix": "set FLEET_LM_MODEL (e.g. openai/gpt-4o-mini)"}
    where = settings.lm_api_base or "provider default endpoint"
    if offline:
        return {"ok": True, "detail": f"{settings.lm_model} at {where} (not contacted: --offline)"}
    from fleet_rlm.core.lm import build_lm, explain_lm_error, metered

    lm = build_lm(settings)
    lm.num_retries = 0
    try:
        _, usage = await metered(lambda: lm.acall(prompt="Reply with the word OK.", max_tokens=5))
    except Exception as exc:
        return {"ok": False, "detail": explain_lm_error(exc, lm), "fix": "see the message"}
    latency = f", answered in {usage.latency:.2f}s" if usage else ""
    return {"ok": True, "detail": f"{settings.lm_model} at {where}{latency}"}


async def doctor_report(settings: cfg.Settings, offline: bool = False) -> dict[str, dict[str, Any]]:
    from fleet_rlm.sandbox.base import SandboxError, get_backend

    report: dict[str, dict[str, Any]] = {"model": await _check_model(settings, offline)}
    try:  # each backend checks itself (isolation, caps, credentials)
        report.update(get_backend(settings.sandbox).doctor(settings))
    except SandboxError as exc:
        report["sandbox"] = {"ok": False, "detail": str(exc), "fix": "set FLEET_SANDBOX=local"}
    usable, backend = cfg.keyring_status()
    report["keyring"] = {"ok": usable, "detail": backend}
    if not usable:
        report["keyring"]["fix"] = "set keys as environment variables, or install and unlock a Secret Service"
    report["store"] = {"ok": True, "detail": str(settings.store_path), "exists": settings.store_path.exists()}
    return report
