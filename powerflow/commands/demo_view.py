"""The live view of ``powerflow demo``: what a person watches while the twin runs.

Pure: the DLJobs and Events as the API server returns them, the GPUs' readings and
the budget go in (``Frame``), a rich renderable comes out (``render``). The view
shows what a user of a cluster would see with ``kubectl get dljobs`` and
``kubectl get events`` (phase, GPUs, clock and progress as the operator writes
them in each DLJob's status; the operator's Events), beside what only the twin
knows: every GPU's power and clock, and the cluster's power against the budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

EVENTS_SHOWN = 8
"""The newest events in the view (a terminal's height is the limit)."""

PHASE_STYLES = {
    "Pending": "yellow",
    "Profiling": "cyan",
    "Running": "green",
    "Rescaling": "magenta",
    "Succeeded": "bold green",
    "Failed": "bold red",
}


@dataclass(frozen=True)
class JobRow:
    """One DLJob as its status says (``gpus``/``frequency_mhz`` None: no allocation yet)."""

    name: str
    model: str
    phase: str
    gpus: int | None
    nodes: tuple[str, ...]
    frequency_mhz: int | None
    iterations: int
    total: int


@dataclass(frozen=True)
class NodeRow:
    """One node's GPUs as the twin reads them: busy (training) or not, clock, power."""

    name: str
    busy: tuple[bool, ...]
    clocks_mhz: tuple[int, ...]
    power_w: float


@dataclass(frozen=True)
class Frame:
    """Everything one picture of the view shows."""

    title: str
    elapsed_s: float
    jobs: tuple[JobRow, ...]
    waiting: int
    """Jobs of the trace not submitted yet."""
    nodes: tuple[NodeRow, ...]
    budget_w: float
    events: tuple[str, ...]

    @property
    def power_w(self) -> float:
        return sum(n.power_w for n in self.nodes)

    @property
    def done(self) -> int:
        return sum(j.phase in ("Succeeded", "Failed") for j in self.jobs)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def job_row(body: Mapping[str, Any]) -> JobRow:
    """A DLJob's line: the operator's status (a field it has not written yet is blank)."""
    meta, spec, status = (_dict(body.get(k)) for k in ("metadata", "spec", "status"))
    alloc = _dict(status.get("allocation"))
    total = _int(spec.get("iterations")) or 0
    phase = str(status.get("phase") or "")
    done = _int(_dict(status.get("progress")).get("iterations")) or 0
    if phase == "Succeeded":
        done = total
    gpus = _int(alloc.get("gpus"))
    stopped = bool(alloc.get("stopped")) or phase in ("Succeeded", "Failed")
    nodes = alloc.get("nodes")
    return JobRow(
        name=str(meta.get("name", "")),
        model=str(spec.get("model", "")),
        phase=phase or "New",
        gpus=None if stopped else gpus,
        nodes=() if stopped or not isinstance(nodes, list) else tuple(map(str, nodes)),
        frequency_mhz=None if stopped else _int(alloc.get("frequencyMHz")),
        iterations=min(done, total) if total else done,
        total=total,
    )


def job_rows(items: Iterable[Mapping[str, Any]]) -> tuple[JobRow, ...]:
    return tuple(sorted((job_row(i) for i in items), key=lambda r: r.name))


def event_line(event: Mapping[str, Any], at_s: float) -> str:
    """``12.3 s  j00-gpt2  Profiling: profiling on 1 GPUs ...``: the demo's time when it
    first saw the event, the object, the reason and the message (Warnings marked)."""
    obj = _dict(event.get("involvedObject"))
    mark = "! " if event.get("type") == "Warning" else ""
    text = f"{mark}{event.get('reason', '')}: {event.get('message', '')}"
    return f"{at_s:7.1f} s  {obj.get('name', '?')}  {text}"


def new_events(items: Iterable[Mapping[str, Any]], seen: set[str]) -> list[Mapping[str, Any]]:
    """The events not in ``seen`` (their uids, updated), oldest first: in the order
    the API server stored them (``resourceVersion``), which is the operator's."""

    def order(e: Mapping[str, Any]) -> tuple[int, str]:
        version = str(_dict(e.get("metadata")).get("resourceVersion", ""))
        return (int(version) if version.isdigit() else 0, version)

    fresh = []
    for event in items:
        meta = _dict(event.get("metadata"))
        key = str(meta.get("uid") or meta.get("name") or id(event))
        if key not in seen:
            seen.add(key)
            fresh.append(event)
    return sorted(fresh, key=order)


ENDED = ("Succeeded", "Failed")


def shown_jobs(jobs: tuple[JobRow, ...], limit: int | None) -> tuple[JobRow, ...]:
    """At most ``limit`` jobs, the ended ones left out first (in name order): on a
    terminal, rich cuts a view taller than the screen at its bottom."""
    if limit is None or len(jobs) <= limit:
        return jobs
    running = [j for j in jobs if j.phase not in ENDED]
    ended = [j for j in jobs if j.phase in ENDED]
    keep = set(map(id, running[:limit] + ended[: max(0, limit - len(running))]))
    return tuple(j for j in jobs if id(j) in keep)


JOB_WIDTH = 16
NODES_WIDTH = 8
BAR_WIDTH = 8
"""The jobs' table's widths: with its numbers (a trace's job names, ``node-N`` nodes,
iterations to 100,000) it fits 80 columns."""


def _jobs_table(frame: Frame, limit: int | None) -> Table:
    table = Table(title=f"DLJobs ({frame.done}/{len(frame.jobs) + frame.waiting} done)")
    # Within 80 columns: a job's name and its nodes wrap (one node a line), its
    # numbers never do.
    table.add_column("job", max_width=JOB_WIDTH, overflow="fold")
    table.add_column("phase", no_wrap=True)
    table.add_column("GPUs", justify="right", no_wrap=True)
    table.add_column("nodes", max_width=NODES_WIDTH, overflow="fold")
    table.add_column("MHz", justify="right", no_wrap=True)
    table.add_column("progress", no_wrap=True)
    table.add_column("iterations", justify="right", no_wrap=True)
    shown = shown_jobs(frame.jobs, limit)
    for j in shown:
        share = j.iterations / j.total if j.total else 0.0
        table.add_row(
            j.name,
            Text(j.phase, style=PHASE_STYLES.get(j.phase, "")),
            "-" if j.gpus is None else str(j.gpus),
            " ".join(j.nodes) or "-",
            "-" if j.frequency_mhz is None else str(j.frequency_mhz),
            Group(ProgressBar(total=max(j.total, 1), completed=j.iterations, width=BAR_WIDTH)),
            f"{j.iterations}/{j.total} {share:.0%}",
        )
    notes = []
    if len(shown) < len(frame.jobs):
        notes.append(f"{len(frame.jobs) - len(shown)} not shown")
    if frame.waiting:
        notes.append(f"{frame.waiting} more to be submitted at their trace times")
    table.caption = "; ".join(notes) or None
    return table


def _nodes_table(frame: Frame) -> Table:
    table = Table(title="GPUs (# training, . idle)")
    table.add_column("node", no_wrap=True)
    table.add_column("GPUs", no_wrap=True)
    table.add_column("clocks MHz", no_wrap=True)
    table.add_column("power W", justify="right")
    for n in frame.nodes:
        gpus = Text()
        for busy in n.busy:
            gpus.append("#" if busy else ".", style="green" if busy else "dim")
        clocks = " ".join(f"{c:4d}" for c in n.clocks_mhz)
        table.add_row(n.name, gpus, clocks, f"{n.power_w:,.0f}")
    return table


def _power(frame: Frame) -> Table:
    grid = Table.grid(padding=(0, 1))
    share = frame.power_w / frame.budget_w if frame.budget_w > 0 else 0.0
    style = "red" if share > 1 else "green"
    grid.add_row(
        Text("cluster power", style="bold"),
        ProgressBar(total=1.0, completed=min(share, 1.0), width=40, complete_style=style),
        Text(f"{frame.power_w:,.0f} W of a {frame.budget_w:,.0f} W budget ({share:.0%})"),
    )
    return grid


def render(frame: Frame, height: int | None = None) -> RenderableType:
    """The whole view: title line, jobs, GPUs, power against the budget, events;
    ``height``: the terminal's lines, which the jobs' table gives way to (None: all)."""
    head = Text(f"{frame.title}   t = {frame.elapsed_s:,.1f} s", style="bold")
    recent = frame.events[-EVENTS_SHOWN:]
    events = Text("\n".join(recent) or "(none yet)")
    limit = None
    if height is not None:
        # Every line but the jobs' rows: title; the jobs' table's title, borders,
        # header and caption; the GPUs' table; the power line; the events' panel.
        other = 1 + 6 + 5 + len(frame.nodes) + 1 + 2 + max(1, len(recent))
        limit = max(1, height - other)
    return Group(
        head,
        _jobs_table(frame, limit),
        _nodes_table(frame),
        _power(frame),
        Panel(events, title="events", title_align="left"),
    )
