"""The doctor report, disk use of FLEET_HOME and the sample input for a first run."""

from __future__ import annotations

import asyncio
from typing import Any

from fleet_rlm.core import housekeeping
from fleet_rlm.core.sample import SAMPLE_QUESTION, sample_path
from fleet_rlm.web import models as m
from fleet_rlm.web.api import Call, Routes

routes = Routes("system")


@routes.add("GET", "/api/doctor", "What is configured, what is missing, how to fix it (model not contacted)")
async def doctor(call: Call) -> dict[str, Any]:
    from fleet_rlm.core.doctor import doctor_report

    return await doctor_report(call.engine.settings, offline=True)


@routes.add("GET", "/api/disk", "Bytes of FLEET_HOME by runs, uploads and volumes", response=m.DiskUse)
async def disk(call: Call) -> dict[str, Any]:
    return await asyncio.to_thread(housekeeping.disk_use, call.engine.settings)


@routes.add("GET", "/api/sample", "The sample input of a source checkout, if runs here can read it",
            response=m.Sample)  # fmt: skip
async def sample(call: Call) -> m.Sample:
    path = await asyncio.to_thread(sample_path, call.engine.settings)
    return m.Sample(path=str(path) if path else None, question=SAMPLE_QUESTION)
