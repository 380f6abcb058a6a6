"""Named local volumes: folders with durable memory/, artifacts/, buffers/, meta/."""

from fleet_rlm.volumes.local import DURABLE_ROOTS, LocalVolumes, VolumeError, parse_volume_ref, volume_uri

__all__ = ["DURABLE_ROOTS", "LocalVolumes", "VolumeError", "parse_volume_ref", "volume_uri"]
