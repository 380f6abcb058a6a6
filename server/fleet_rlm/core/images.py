"""Images for sub-calls: what ``llm_query(prompt, images=[...])`` may send, checked and read on the host.

An item of ``images`` is a source name from ``sources`` (or that entry itself), read from the host's own
copy made at staging (``ImageSource.path``, in the run's scratch folder, which no sandbox can write), or
bytes the code made, which cross the host-call bridge as ``{BYTES_TAG: base64}`` (sandbox/worker.py).
The host never opens a path the code names. Every check is made here, on the host: the sandbox's code
could forge a call past any check made inside it. Images reach the model as chat content parts
(``image_url`` with a ``data:`` URL, which LiteLLM translates for each provider); the root prompt only
ever sees their names.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_rlm.core.context import MAX_IMAGE_BYTES, StagedContext
from fleet_rlm.core.inputs.documents import image_type
from fleet_rlm.sandbox.base import BYTES_TAG

MB = 1024 * 1024
MAX_CALL_IMAGES = 8  # images one sub-call may carry
MAX_CALL_BYTES = 40 * MB  # and their bytes together (base64 makes it 53 MB on the wire, under a message's 64)
KINDS = "a PNG, JPEG, GIF or WebP image"


class ImageUnreadable(ValueError):
    """A staged image's host copy is gone or changed (the run's scratch folder was tampered with)."""


@dataclass(frozen=True)
class ImageRef:
    """One image a sub-call sends: a staged source (read from ``path`` when the call goes out) or bytes."""

    label: str  # the source's name, or "images[i]" for bytes
    mime: str
    size: int
    path: Path | None = None
    data: bytes | None = None

    def read(self) -> bytes:
        """The image's bytes: the code's, or the host's copy, checked to be the one staged."""
        if self.data is not None:
            return self.data
        assert self.path is not None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise ImageUnreadable(f"the image {self.label} cannot be read on the host ({exc.strerror})") from None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ImageUnreadable(f"the image {self.label} is no longer a file on the host")
            data = fh.read(self.size + 1)
        if len(data) != self.size:
            raise ImageUnreadable(f"the image {self.label} changed on the host since the context was staged")
        return data


def resolve(items: Any, staged: StagedContext | None, *, where: str = "images") -> list[ImageRef]:
    """The images one sub-call asks for, checked against the caps; ``ValueError``/``TypeError`` say why not."""
    if items is None:
        return []
    if isinstance(items, (str, bytes, bytearray, dict)) or not isinstance(items, (list, tuple)):
        raise TypeError(
            f"{where} must be a list of images (source names from `sources`, or bytes), not {type(items).__name__}: "
            f"e.g. {where}=[sources[3]['name']]"
        )
    if len(items) > MAX_CALL_IMAGES:
        raise ValueError(
            f"{where} has {len(items)} images, over the limit of {MAX_CALL_IMAGES} per sub-call; "
            "spread them over several calls (llm_query_batched)"
        )
    refs = [_one(item, f"{where}[{i}]", staged) for i, item in enumerate(items)]
    total = sum(r.size for r in refs)
    if total > MAX_CALL_BYTES:
        raise ValueError(
            f"{where} holds {total / MB:.1f} MB of images, over the {MAX_CALL_BYTES // MB} MB limit of one sub-call; "
            "spread them over several calls (llm_query_batched)"
        )
    return refs


def resolve_batch(images: Any, count: int, staged: StagedContext | None) -> list[list[ImageRef] | str]:
    """Per prompt of a batch: its images, or why they cannot be sent (that slot's error alone)."""
    if images is None:
        return [[] for _ in range(count)]
    if not isinstance(images, (list, tuple)) or len(images) != count:
        size = f"{len(images)} lists" if isinstance(images, (list, tuple)) else f"of type {type(images).__name__}"
        raise ValueError(
            f"llm_query_batched: images must hold one list of images per prompt ({count} prompts, got {size}), "
            "e.g. images=[[name], [], [png_bytes]]"
        )
    out: list[list[ImageRef] | str] = []
    for i, item in enumerate(images):
        try:
            out.append(resolve(item, staged, where=f"images[{i}]") if item else [])
        except (TypeError, ValueError) as exc:
            out.append(str(exc))
    return out


def _one(item: Any, where: str, staged: StagedContext | None) -> ImageRef:
    if isinstance(item, dict) and BYTES_TAG in item:
        return _from_bytes(_decoded(item, where), where)
    if isinstance(item, dict) and isinstance(item.get("name"), str):  # an entry of `sources` itself
        item = item["name"]
    if isinstance(item, str):
        return _from_source(item, where, staged)
    if isinstance(item, (bytes, bytearray, memoryview)):  # an in-process sandbox hands bytes over as they are
        return _from_bytes(bytes(item), where)
    raise TypeError(
        f"{where} is of type {type(item).__name__}, not an image: give a source name from `sources` or bytes"
    )


def _decoded(item: dict[str, Any], where: str) -> bytes:
    text = item[BYTES_TAG]
    if len(item) != 1 or not isinstance(text, str):
        raise TypeError(f"{where} is of type dict, not an image: give a source name from `sources` or bytes")
    if len(text) * 3 // 4 > MAX_IMAGE_BYTES + 3:  # refused before decoding a giant
        raise ValueError(_too_large(where, len(text) * 3 // 4))
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: its bytes arrived damaged (not base64)") from None


def _too_large(where: str, size: int) -> str:
    return (
        f"{where} is {size / MB:.1f} MB, over the {MAX_IMAGE_BYTES // MB} MB limit of one image; "
        "send a smaller or downscaled one"
    )


def _from_bytes(data: bytes, where: str) -> ImageRef:
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(_too_large(where, len(data)))
    mime = image_type(data[:16])
    if mime is None:
        raise ValueError(f"{where} is not {KINDS} (its first bytes say so)")
    return ImageRef(where, mime, len(data), data=data)


def _from_source(name: str, where: str, staged: StagedContext | None) -> ImageRef:
    images = staged.images if staged is not None else []
    found = next((i for i in images if i.name == name), None)
    if found is not None:
        return ImageRef(found.name, found.mime, found.size, path=found.path)
    text_source = staged is not None and any(s.name == name for s in staged.sources)
    name = name if len(name) <= 300 else name[:300] + "..."  # quoted in the error: a name, not a payload
    if text_source:
        raise ValueError(f"{where}: {name!r} is a text source, not an image (its text is in `context`)")
    if staged is None:
        raise ValueError(
            f"{where}: no image named {name!r}: this run goes on with the context of an earlier run in its session, "
            "whose images are not kept; give the context again, or pass the image's bytes"
        )
    if not images:
        raise ValueError(
            f"{where}: no image named {name!r}: this REPL's context has no images (a child RLM sees only the text "
            "passed to it); pass the image's bytes instead"
        )
    names = ", ".join(repr(i.name) for i in images[:10]) + (" ..." if len(images) > 10 else "")
    raise ValueError(f"{where}: no image named {name!r} in `sources`; its images are {names}")


def content(prompt: str, images: Sequence[tuple[str, bytes]]) -> list[dict[str, Any]]:
    """A user message's content: the prompt's text, then each (mime, bytes) as an image part."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    for mime, data in images:
        url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def messages(prompt: str, refs: Sequence[ImageRef]) -> list[dict[str, Any]]:
    """The sub-call's messages, the images read now (off the event loop: up to 40 MB each call)."""
    return [{"role": "user", "content": content(prompt, [(r.mime, r.read()) for r in refs])}]
