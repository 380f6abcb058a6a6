"""Settings (values with their source; secrets only as set or not) and the connection tests."""

from __future__ import annotations

import asyncio
from typing import Any

from fleet_rlm import config as cfg
from fleet_rlm.web import models as m
from fleet_rlm.web.api import Call, Routes

routes = Routes("settings")


def _listing() -> m.SettingList:
    return m.SettingList(settings=[m.Setting(**row) for row in cfg.describe_settings()])


@routes.add("GET", "/api/settings", "Every setting, where its value comes from, which secrets are set",
            response=m.SettingList)  # fmt: skip
async def get_settings(_call: Call) -> m.SettingList:
    return await asyncio.to_thread(_listing)


@routes.add("PUT", "/api/settings", "Save settings (secrets to the OS keyring); they apply to the next run",
            body_kind="object", response=m.SettingList)  # fmt: skip
async def put_settings(call: Call) -> m.SettingList:
    await asyncio.to_thread(cfg.save_settings, call.body, running=True)
    await call.state.refresh_settings()
    return await asyncio.to_thread(_listing)


@routes.add("POST", "/api/check/model", "Connection test: one short call to the configured model",
            response=m.Check)  # fmt: skip
async def check_model(call: Call) -> dict[str, Any]:
    from fleet_rlm.core.doctor import check_model

    await call.state.refresh_settings()
    return await check_model(call.engine.settings)


@routes.add("POST", "/api/check/sandbox", "Connection test: start the configured sandbox and run a line",
            response=m.Check)  # fmt: skip
async def check_sandbox(call: Call) -> dict[str, Any]:
    from fleet_rlm.core.doctor import check_sandbox

    await call.state.refresh_settings()
    return await check_sandbox(call.engine.settings)
