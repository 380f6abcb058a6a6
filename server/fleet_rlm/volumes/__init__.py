"""Named volumes with durable memory/, artifacts/, buffers/, meta/: local folders or Daytona volumes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleet_rlm.volumes.local import DURABLE_ROOTS, LocalVolumes, VolumeError, parse_volume_ref, volume_uri

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

__all__ = ["DURABLE_ROOTS", "LocalVolumes", "VolumeError", "parse_volume_ref", "volume_uri", "volumes_for"]


def volumes_for(settings: Settings) -> Any:
    """The volume store the sandbox setting implies: Daytona volumes for ``daytona``, else folders."""
    if settings.sandbox == "daytona":
        from fleet_rlm.volumes.daytona import DaytonaVolumes

        return DaytonaVolumes(settings)
    return LocalVolumes.from_settings(settings)
