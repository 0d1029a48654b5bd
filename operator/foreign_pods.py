"""A watch-fed cache of the cluster's foreign GPU pods (``ForeignGpuPods``).

GPUs are cluster-wide: a bound, non-terminal pod that requests
``nvidia.com/gpu`` and is not PowerFlow's (no ``powerflow.io/job`` label)
occupies its GPUs, and every pass must plan around it. Listing those pods in
every pass would page through all of the cluster's bound pods (a field
selector cannot see resources) at up to one pass per debounce; on a big
cluster that is the heaviest request the operator makes. So, as an informer
does, the operator lists them once and then watches:

- LIST then WATCH of pods with the label selector ``!powerflow.io/job`` and
  the field selector ``spec.nodeName!=`` (a bound pod never becomes unbound,
  so no pod silently leaves the selection; the phase is checked here, on each
  event, since a pod that finishes is a MODIFIED event), in all namespaces;
- only pods that request GPUs and are not finished are kept: memory is one
  body per foreign GPU pod, not per pod;
- the watch (``powerflow.kubeapi.watch.ListWatch``, shared with the node
  agent) resumes from the last ``resourceVersion`` seen (bookmarks included)
  when the server ends it (``timeoutSeconds``); a ``410 Gone`` (too old)
  relists; other errors are tried again after a back-off (1 s doubling to 30 s,
  each wait up to half longer at random, or the answer's ``Retry-After``);
- a foreign GPU pod arriving or leaving the set is a scheduling event
  (``on_change``); other pods' changes are not.

The synchronous ``kubernetes`` client streams in a daemon thread of its own;
results reach the event loop with ``call_soon_threadsafe``, so the set is
only ever touched there. Until the first LIST has arrived, ``pods`` is
``None`` and the caller lists directly.
"""

from __future__ import annotations

from collections.abc import Callable

import kubernetes
from powerflow.operator.bodies import PodBody

from powerflow.core import contract
from powerflow.kubeapi.watch import ListWatch

LABELS = f"!{contract.JOB_LABEL}"
FIELDS = "spec.nodeName!="
TERMINAL = frozenset({"Succeeded", "Failed"})
WATCH_TIMEOUT_S = 300
"""``timeoutSeconds`` of each watch (the server ends it; the cache resumes)."""


class ForeignGpuPods:
    """The foreign GPU pods, kept current by a LIST and a WATCH (see the module)."""

    def __init__(
        self,
        core: kubernetes.client.CoreV1Api,
        list_pages: Callable[..., tuple[list[PodBody], str]],
        is_gpu_pod: Callable[[PodBody], bool],
    ) -> None:
        self.core = core
        self._list_pages = list_pages
        self._is_gpu_pod = is_gpu_pod
        self._pods: dict[tuple[str, str], PodBody] | None = None
        self._on_change: Callable[[str], None] = lambda _reason: None
        self._watch: ListWatch[PodBody] | None = None

    @property
    def lists(self) -> int:
        """How many times the pods were listed (the first LIST and each relist)."""
        return 0 if self._watch is None else self._watch.lists

    def pods(self) -> tuple[PodBody, ...] | None:
        """The foreign GPU pods now; ``None`` before the first LIST arrived."""
        return None if self._pods is None else tuple(self._pods.values())

    def start(self, on_change: Callable[[str], None]) -> None:
        """Start listing and watching (call from the event loop that gets the news)."""
        self._on_change = on_change
        watch = ListWatch(
            "foreign-gpu-pods",
            self.core.list_pod_for_all_namespaces,
            self._replace,
            self._event,
            selection={"label_selector": LABELS, "field_selector": FIELDS},
            lister=self._list_pages,
            timeout_s=WATCH_TIMEOUT_S,
        )
        self._watch = watch
        watch.start()

    def stop(self) -> None:
        """Stop watching: the open stream is shut down, the thread ends on its own."""
        if self._watch is not None:
            self._watch.stop()

    # -- the event loop ----------------------------------------------------------------------

    def _keeps(self, pod: PodBody) -> bool:
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, dict) else None
        return phase not in TERMINAL and self._is_gpu_pod(pod)

    def _replace(self, items: list[PodBody]) -> None:
        new = {_key(p): p for p in items if self._keeps(p)}
        before = self._pods
        self._pods = new
        if before is not None and set(before) != set(new):
            self._on_change("foreign GPU pods relisted")

    def _event(self, kind: str, pod: PodBody) -> None:
        if self._pods is None:
            return
        key = _key(pod)
        had = key in self._pods
        if kind != "DELETED" and self._keeps(pod):
            self._pods[key] = pod
        else:
            self._pods.pop(key, None)
        if had != (key in self._pods):
            self._on_change(f"foreign GPU pod {key[0]}/{key[1]} {kind}")


def _key(pod: PodBody) -> tuple[str, str]:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
