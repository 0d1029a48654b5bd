"""GPU records: what an operator pass pays to read the nodes' GPU records back.

Each node of 8 H100s carries the record of its agent's report
(``contract.GPU_REPORT_ANNOTATION``, as the operator writes it). Measured, in CPU
time (``time.process_time``, best of 5), for ``operator/discovered.py``:

- the first pass after a restart: every record read (``read_records``: parsed,
  bounded, ``node_spec``), which the pass runs in a worker thread; without the
  memo of records taken or refused, every pass would pay this;
- each later pass that finds the records unchanged (``unread`` and
  ``unrecorded``, on the event loop): a lookup per node, nothing parsed.

    python -m benchmarks gpu_records
"""

from __future__ import annotations

import time
from collections.abc import Callable

from powerflow.operator.discovered import DiscoveredGpus, read_records, record_of
from rich.console import Console
from rich.table import Table

from powerflow.core import contract
from powerflow.core.gpu_facts import GpuFacts, GpuReport, encode_record
from powerflow.core.gpus import GPU_SPECS

GPUS = 8
SIZES = (100, 1000, 5000)


def nodes(count: int, now_s: float) -> list[dict[str, object]]:
    h100 = GPU_SPECS["H100-SXM"]
    facts = tuple(
        GpuFacts(g, "NVIDIA H100 80GB HBM3", h100.clocks_mhz, 700.0, 200.0, 700.0)
        for g in range(GPUS)
    )
    out: list[dict[str, object]] = []
    for i in range(count):
        name = f"gpu-node-{i:05d}"
        record = encode_record(GpuReport(name, facts), now_s)
        meta = {"name": name, "annotations": {contract.GPU_REPORT_ANNOTATION: record}}
        out.append({"metadata": meta})
    return out


def cpu_ms(call: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        call()
        best = min(best, time.process_time() - start)
    return 1e3 * best


def main() -> None:
    now = time.time()
    table = Table(title=f"GPU records of nodes of {GPUS} H100s: CPU ms per pass (best of 5)")
    for column in ("nodes", "first pass: read every record", "later passes: unchanged"):
        table.add_column(column, justify="right")
    for count in SIZES:
        bodies = nodes(count, now)
        pending = [(name, text) for name, text in map(record_of, bodies) if text is not None]
        first = cpu_ms(lambda pending=pending: read_records(pending, now))
        kept = DiscoveredGpus()
        kept.restore(bodies)
        assert len(kept.specs()) == count

        def later(kept: DiscoveredGpus = kept, bodies: list[dict[str, object]] = bodies) -> None:
            assert kept.unread(bodies) == []
            kept.unrecorded(bodies)

        steady = cpu_ms(later)
        table.add_row(f"{count:,}", f"{first:,.1f}", f"{steady:,.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
