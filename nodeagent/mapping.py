"""Which GPU indices each pod holds, from whichever source the node offers. Pure.

The device plugin, not the extender, decides which physical GPU a container
gets; the kubelet's PodResources API says which (by UUID), for every pod on
the node. Without that socket the agent falls back to the UUIDs the worker
library reports (``gpuUuids``: what ``NVIDIA_VISIBLE_DEVICES`` showed the
trainer), and in ``--simulate`` mode, where there are neither real devices nor
a kubelet, to the extender's placement block: the block's GPUs on this node
handed to the job's pods on this node in worker-index order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from powerflow.nodeagent.pods import PodKey, PodView

from powerflow.core import contract, untrusted
from powerflow.core.devices import GpuInfo


def indices_of(uuids: Iterable[str], infos: Iterable[GpuInfo]) -> tuple[int, ...]:
    """The indices of the node's GPUs among ``uuids`` (unknown UUIDs are skipped)."""
    by_uuid = {i.uuid: i.index for i in infos}
    return tuple(sorted({by_uuid[u] for u in uuids if u in by_uuid}))


def block_on_node(annotations: Mapping[str, str], node: str) -> tuple[int, ...] | None:
    """GPU indices of the placement annotation's block on ``node`` (None: none readable)."""
    raw = annotations.get(contract.PLACEMENT_ANNOTATION)
    if raw is None:
        return None
    try:
        block = untrusted.parse_block(raw, "placement annotation")
    except untrusted.UntrustedTextError:
        return None
    return tuple(sorted(gpu for where, gpu in block if where == node))


def placement_gpus(
    pods: Mapping[PodKey, PodView], blocks: Mapping[PodKey, tuple[int, ...]]
) -> dict[PodKey, tuple[int, ...]]:
    """One GPU per pod from the job's block on this node, in worker-index order.

    Pods of one gang carry the same block; the block's GPUs on this node go to
    the gang's pods on this node sorted by worker index (then name), one each
    (``nvidia.com/gpu: 1`` per worker pod).
    """
    gangs: dict[tuple[str, str, int | None], list[PodView]] = {}
    for key, view in pods.items():
        if view.active and key in blocks:
            gangs.setdefault(view.job_key, []).append(view)
    out: dict[PodKey, tuple[int, ...]] = {}
    for members in gangs.values():
        members.sort(
            key=lambda v: (v.worker_index if v.worker_index is not None else 1 << 30, v.name)
        )
        gpus = blocks[members[0].key]
        for view, gpu in zip(members, gpus, strict=False):
            out[view.key] = (gpu,)
    return out
