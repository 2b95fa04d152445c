"""Export an event log as a Chrome / Perfetto trace (JSON), one track per actor.

Invariant: the trace is a pure function of the messages; every span is a complete event
(``"ph": "X"``) with a non-negative duration on the track of the component that did the
work — the trainer (steps, publishes), each replica (generations, weight loads, switches,
validations) — plus instant events (``"ph": "i"``) for commands and coordinator facts.
Open the file at ui.perfetto.dev or chrome://tracing.

    python -m shunter.bench.report.trace runs/<run_id>/events.bin trace.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from shunter.events import (
    Command,
    Message,
    ModeChanged,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepEnd,
    ValidateEnd,
    WeightsLoaded,
    WeightsReady,
    read_log,
    tag_of,
)


def to_trace(messages: Iterable[Message]) -> dict:
    msgs = list(messages)
    t0 = min((m.wall_time for m in msgs), default=0.0)
    tids: dict[str, int] = {}
    events: list[dict] = []

    def tid(track: str) -> int:
        if track not in tids:
            tids[track] = len(tids) + 1
            events.append({"ph": "M", "pid": 1, "tid": tids[track], "name": "thread_name", "args": {"name": track}})
        return tids[track]

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    def span(track: str, name: str, end: float, dur: float, args: dict | None = None) -> None:
        dur = max(0.0, dur)
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": tid(track),
                "name": name,
                "ts": us(end - dur),
                "dur": round(dur * 1e6, 3),
                "args": args or {},
            }
        )

    open_gen: dict[tuple[str, str], float] = {}
    for m in msgs:
        match m:
            case SampleBegin() | SampleResumed():
                open_gen[(m.replica_id, m.sample_id)] = m.wall_time
            case SampleEnd() | SampleAborted():
                sid = m.sample.sample_id if isinstance(m, SampleEnd) else m.sample_id
                began = open_gen.pop((m.replica_id, sid), None)
                if began is not None:
                    name = "generate" if isinstance(m, SampleEnd) else f"generate (cut: {m.reason})"
                    span(f"{m.replica_id}/samples", name, m.wall_time, m.wall_time - began, {"sample": sid})
            case StepEnd():
                span("trainer", f"step {m.step}", m.wall_time, m.duration_s, dict(m.metrics))
            case WeightsReady():
                span("trainer", f"publish v{m.version}", m.wall_time, m.duration_s, {"nbytes": m.nbytes})
            case WeightsLoaded():
                span(m.replica_id, f"load v{m.version}", m.wall_time, m.duration_s, {"interrupted": m.interrupted})
            case ModeChanged():
                span(m.replica_id, f"to {m.mode}", m.wall_time, m.duration_s, dict(m.detail))
            case ValidateEnd():
                span(m.source, "validate", m.wall_time, m.duration_s, dict(m.metrics))
            case Command():
                events.append(
                    {
                        "ph": "i",
                        "s": "t",
                        "pid": 1,
                        "tid": tid(f"{m.source or 'user'} commands"),
                        "name": tag_of(m),
                        "ts": us(m.wall_time),
                    }
                )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(messages: Iterable[Message], path: str | Path) -> Path:
    p = Path(path)
    p.write_text(json.dumps(to_trace(messages)))
    return p


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m shunter.bench.report.trace EVENTS_BIN OUT_JSON")
    print(write_trace(read_log(sys.argv[1]), sys.argv[2]))
