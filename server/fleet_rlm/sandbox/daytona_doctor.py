"""``fleet-rlm doctor`` rows for the Daytona backend: credentials, API reachable, snapshot present."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from fleet_rlm.config import sandbox_setting_fix
from fleet_rlm.sandbox import daytona_client as dc

TIMEOUT = 30.0


async def _probe(settings: Any) -> dict[str, dict[str, Any]]:
    from daytona import DaytonaNotFoundError

    rows: dict[str, dict[str, Any]] = {}
    async with dc.client(settings) as daytona:
        started = time.monotonic()  # the request, not the SDK's import
        try:
            volumes = await dc.retrying(lambda: daytona.volume.list(), safe=True)
        except Exception as exc:
            fix = "check DAYTONA_API_URL and DAYTONA_API_KEY; `fleet-rlm daytona smoke`"
            rows["daytona_api"] = {"ok": False, "blocking": True, "detail": dc.explain(exc, "answer"), "fix": fix}
            return rows
        url = settings.daytona_api_url or "https://app.daytona.io/api"
        rows["daytona_api"] = {"ok": True, "detail": f"{url} answered in {time.monotonic() - started:.2f}s "
                                                     f"({len(volumes)} volume(s))"}  # fmt: skip
        name = dc.snapshot_name(settings)
        try:
            snap = await daytona.snapshot.get(name)
            state = str(getattr(snap.state, "value", snap.state))
            rows["daytona_snapshot"] = {"ok": state == "active", "detail": f"{name}: {state}"}
        except DaytonaNotFoundError:
            rows["daytona_snapshot"] = {"ok": False, "detail": f"snapshot {name} is not registered",
                                        "fix": "run `fleet-rlm daytona setup` (the first run would otherwise "
                                               "register it, which takes minutes)"}  # fmt: skip
    return rows


def doctor(settings: Any) -> dict[str, dict[str, Any]]:
    """Rows for doctor; blocking when nothing can run (no key, no API)."""
    key = settings.daytona_api_key.get_secret_value() if settings.daytona_api_key else ""
    network = "blocked" if settings.daytona_network == "block" else "ALLOWED (FLEET_DAYTONA_NETWORK=allow)"
    rows: dict[str, dict[str, Any]] = {
        "sandbox": {"ok": True, "isolation": "daytona", "detail": f"Daytona sandboxes; network egress {network}"},
    }
    if not key:  # every run would be refused: the sandbox row itself fails, with both ways out
        fix = "export DAYTONA_API_KEY=... (https://app.daytona.io/dashboard/keys), or use the local sandbox: "
        detail = "FLEET_SANDBOX=daytona but DAYTONA_API_KEY is not set"
        rows["sandbox"] = {"ok": False, "blocking": True, "isolation": "daytona", "detail": detail,
                           "fix": fix + sandbox_setting_fix()}  # fmt: skip
        return rows
    rows["daytona_credentials"] = {"ok": True, "detail": "DAYTONA_API_KEY is set"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # doctor may run inside an event loop
        try:
            rows.update(pool.submit(asyncio.run, asyncio.wait_for(_probe(settings), TIMEOUT)).result())
        except Exception as exc:
            rows["daytona_api"] = {"ok": False, "blocking": True, "detail": dc.explain(exc, "answer")}
    return rows
