"""What is configured, what is missing, and how to fix it: shared by CLI `doctor` and MCP `doctor`."""

from __future__ import annotations

import os
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
    from fleet_rlm.sandbox.local import detect_isolation

    report: dict[str, dict[str, Any]] = {"model": await _check_model(settings, offline)}
    level, detail = detect_isolation()
    sandbox: dict[str, Any] = {"ok": level == "bwrap", "isolation": level, "detail": detail}
    if level != "bwrap":
        sandbox["fix"] = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) to isolate code"
    elif os.geteuid() == 0:
        sandbox["detail"] += "; running as root, so the process-count cap is not enforced"
    report["sandbox"] = sandbox
    usable, backend = cfg.keyring_status()
    report["keyring"] = {"ok": usable, "detail": backend}
    if not usable:
        report["keyring"]["fix"] = "set keys as environment variables, or install and unlock a Secret Service"
    report["store"] = {"ok": True, "detail": str(settings.store_path),
                       "exists": settings.store_path.exists()}
    daytona = {"api_key": settings.daytona_api_key is not None, "api_url": settings.daytona_api_url,
               "target": settings.daytona_target}
    report["daytona"] = {"ok": settings.sandbox != "daytona", "detail": daytona}
    if settings.sandbox == "daytona":
        report["daytona"]["fix"] = "the Daytona sandbox is not available in this version: set FLEET_SANDBOX=local"
    return report
