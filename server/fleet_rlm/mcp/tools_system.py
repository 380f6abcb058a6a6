"""doctor: what is configured, what is missing, and how to fix it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from mcp.types import ToolAnnotations
from pydantic import Field

from fleet_rlm.mcp.models import DoctorReport
from fleet_rlm.mcp.views import user_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.mcp.provider import EngineProvider


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    @server.tool(
        title="Check the setup",
        description=(
            "Check fleet-rlm's setup: the model (FLEET_LM_MODEL and friends), sandbox isolation, "
            "key storage and the run store, each with a fix when something is wrong. Call it when "
            "a run fails with a configuration error. offline=false also sends the model one tiny "
            "request to prove it answers."
        ),
        annotations=ToolAnnotations(
            title="Doctor",
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=True,
        ),
    )
    async def doctor(
        offline: Annotated[bool, Field(description="Skip contacting the model.")] = True,
    ) -> DoctorReport:
        from fleet_rlm.config import load_settings
        from fleet_rlm.core.doctor import doctor_report

        with user_errors():
            # Settings only: doctor must work even when the engine could not start.
            engine = provider.current
            settings = engine.settings if engine is not None else load_settings()
            checks = await doctor_report(settings, offline=offline)
        return DoctorReport(ok=all(bool(c.get("ok")) for c in checks.values()), checks=checks)
