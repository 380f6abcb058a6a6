"""Named volumes with durable memory/, artifacts/, buffers/, meta/: local folders or Daytona volumes.

``base.Volumes`` is the contract and ``volumes_for(settings)`` the store the sandbox setting names;
local volumes are registered on import, Daytona's on first use (no Daytona SDK import until then).
"""

from __future__ import annotations

from fleet_rlm.volumes.base import Expect, Volumes, register_volumes, volumes_for
from fleet_rlm.volumes.local import LocalVolumes
from fleet_rlm.volumes.paths import DURABLE_ROOTS, parse_volume_ref, volume_uri
from fleet_rlm.volumes.safepath import VolumeChanged, VolumeError, VolumeNotFound

__all__ = [
    "DURABLE_ROOTS", "Expect", "LocalVolumes", "VolumeChanged", "VolumeError", "VolumeNotFound", "Volumes",
    "parse_volume_ref", "register_volumes", "volume_uri", "volumes_for",
]  # fmt: skip
