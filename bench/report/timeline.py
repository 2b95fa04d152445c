"""A timeline picture of one run: which replica generated when, when the trainer trained.

Invariant: drawn only from the event log (the same intervals ``shunter.bench.analysis.summary`` measures): one
row per replica (green while at least one sample is generating on it, grey while it is
lent to the trainer) and one for the trainer (blue steps, orange publishes).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from shunter.bench.analysis.summary import busy_intervals
from shunter.events import (
    Message,
    ModeChanged,
    ReplicaUp,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepEnd,
    WeightsReady,
)
from shunter.events.vocab import TRAINER


def plot_timeline(messages: Iterable[Message], out: str | Path, title: str = "", max_rows: int = 24) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    msgs = list(messages)
    t0 = min(m.wall_time for m in msgs)
    flight: dict[str, list[tuple[float, int]]] = defaultdict(list)
    lent: dict[str, list[tuple[float, int]]] = defaultdict(list)
    order: list[str] = []
    steps, pubs = [], []
    for m in msgs:
        t = m.wall_time - t0
        match m:
            case ReplicaUp():
                order.append(m.replica_id)
                if m.mode == TRAINER:
                    lent[m.replica_id].append((0.0, 1))
            case ModeChanged():
                lent[m.replica_id].append((t, 1 if m.mode == TRAINER else -1))
            case SampleBegin() | SampleResumed():
                flight[m.replica_id].append((t, 1))
            case SampleEnd() | SampleAborted():
                flight[m.replica_id].append((t, -1))
            case StepEnd():
                steps.append((t - m.duration_s, m.duration_s))
            case WeightsReady():
                pubs.append((t - m.duration_s, m.duration_s))
    end = max(m.wall_time for m in msgs) - t0
    rows = order[:max_rows]
    fig, ax = plt.subplots(figsize=(10, 0.3 * (len(rows) + 1) + 1.2))
    for i, rid in enumerate(rows):
        changes = lent[rid] + ([(end, -1)] if sum(d for _, d in lent[rid]) > 0 else [])
        ax.broken_barh(busy_intervals(changes), (i - 0.4, 0.8), color="#cccccc")
        ax.broken_barh(busy_intervals(flight[rid]), (i - 0.3, 0.6), color="#55a868")
    y = len(rows)
    ax.broken_barh(steps, (y - 0.4, 0.8), color="#4c72b0")
    ax.broken_barh(pubs, (y - 0.4, 0.8), color="#dd8452")
    ax.set_yticks(list(range(len(rows))) + [y], rows + ["trainer"])
    ax.set_xlabel("seconds" + (f" (first {max_rows} of {len(order)} replicas)" if len(order) > max_rows else ""))
    ax.set_xlim(0, end)
    ax.set_title(
        (title + " — " if title else "")
        + "generating (green), asleep on the trainer side (grey), train step (blue), publish (orange)",
        fontsize=9,
    )
    fig.tight_layout()
    p = Path(out)
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p
