"""Reading text that a tenant or a broken node may have written: a value or one error.

Pod annotations are written by whoever may patch the pod (a tenant's own
workers included), and the node agent, the operator and the extender all read
the same ones. One reader gives the three one set of guarantees: Python's own
decoder, for one, raises ``RecursionError`` (no ``ValueError``) on ``[[[[...``
nested a few thousand deep. The reader they share:

- ``load_json``: orjson, which refuses nesting deeper than 1,024, NaN and
  infinities, raw control characters (NUL) and invalid UTF-8 with one
  ``JSONDecodeError``, after a size check; every failure, whatever raised it,
  is an ``UntrustedTextError`` (a ``ValueError``) naming what was read.
  Integers beyond 64 bits come back as floats (orjson's reading), which the
  type checks of the callers then refuse where an integer is wanted.
- ``parse_block``: the GPU block of ``contract.PLACEMENT_ANNOTATION`` and
  ``contract.PLANNED_BLOCK_ANNOTATION``, ``{"block": [[node, index], ...]}``,
  with string nodes and integer indices below ``MAX_GPU_INDEX``; anything else
  is an ``UntrustedTextError``.

The callers decide what an error means for them (a field left out, a pod
still counted, a log line); none of them can be stopped by what it reads.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from powerflow.core.errors import PowerFlowError
from powerflow.core.policy.snapshot import GpuSlot

MAX_ANNOTATION_BYTES: Final = 256 << 10
"""Kubernetes keeps all of an object's annotations under 256 KiB together, so one
value longer than that did not come from the API server."""
MAX_GPU_INDEX: Final = 1 << 16
"""No node has this many GPUs; a larger index in an annotation is garbage."""
MAX_BLOCK_SLOTS: Final = 1 << 20
"""More GPUs than any cluster has: a longer block is garbage (and each slot costs work)."""


class UntrustedTextError(PowerFlowError, ValueError):
    """Text that is not what its reader accepts; the message names what and why."""


def load_json(raw: str | bytes, what: str, *, max_bytes: int = MAX_ANNOTATION_BYTES) -> Any:
    """``raw`` decoded as JSON, or ``UntrustedTextError`` (module docstring)."""
    if not isinstance(raw, str | bytes):
        raise UntrustedTextError(f"{what}: expected text, got {type(raw).__name__}")
    if len(raw) > max_bytes:
        raise UntrustedTextError(f"{what}: {len(raw)} characters, at most {max_bytes}")
    try:
        return orjson.loads(raw)
    except Exception as exc:  # orjson's JSONDecodeError, or anything a bad input may raise
        why = " ".join(str(exc).split())[:100]
        raise UntrustedTextError(f"{what}: not JSON ({why})") from None


def parse_block(raw: str | bytes, what: str) -> tuple[GpuSlot, ...]:
    """The ``block`` of a placement or planned-block annotation (module docstring)."""
    obj = load_json(raw, what)
    block = obj.get("block") if isinstance(obj, dict) else None
    if not isinstance(block, list):
        raise UntrustedTextError(f'{what}: expected {{"block": [[node, index], ...]}}')
    if len(block) > MAX_BLOCK_SLOTS:
        raise UntrustedTextError(f"{what}: {len(block)} GPUs, at most {MAX_BLOCK_SLOTS}")
    slots: list[GpuSlot] = []
    for slot in block:
        if (
            not isinstance(slot, list)
            or len(slot) != 2
            or type(slot[0]) is not str
            or type(slot[1]) is not int
            or not 0 <= slot[1] < MAX_GPU_INDEX
        ):
            raise UntrustedTextError(
                f"{what}: a GPU must be [node name, index below {MAX_GPU_INDEX}], "
                f"got {orjson.dumps(slot).decode()[:60]}"
            )
        slots.append((slot[0], slot[1]))
    return tuple(slots)
