"""The GPU bench's figures (``python -m shunter.bench gpu``, ``bench/gpu/measure.py``), read from a run's
events: weight sync per publish next to its floor, the decode step a load waits for, rollout
tokens/s, a hybrid replica's switch cost, the step time and how a run ended.

Invariant: pure functions of the events (or the event log) they are given: no GPU, no engine,
no clock of their own, so the unit tests check them on synthetic logs.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from shunter.events import (
    LoadWeights,
    ModeChanged,
    Offloaded,
    Onloaded,
    PublishWeights,
    RunEnded,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepEnd,
    WeightsLoaded,
    WeightsReady,
    WeightsSent,
    read_log,
)


def sync_figures(log: Path, floor_gbps: float, floor_s: float | None = None) -> dict:
    """Weight sync per publish from a run's event log, next to the floor: the published bytes
    at the device copy bandwidth, or ``floor_s`` (the NCCL broadcast floor across GPUs)."""
    msgs = list(read_log(log))
    rows = []
    for i, m in enumerate(msgs):
        if not isinstance(m, PublishWeights):
            continue
        ready = next((x for x in msgs[i:] if isinstance(x, WeightsReady)), None)
        if ready is None:
            continue
        loads = [x for x in msgs[i:] if isinstance(x, WeightsLoaded) and x.version == ready.version]
        if not loads:
            continue
        last = max(loads, key=lambda x: x.wall_time)
        cmd = next((x for x in msgs[i:] if isinstance(x, LoadWeights)), None)
        row = {
            "version": ready.version,
            "nbytes": ready.nbytes,
            "transport": ready.transport,
            "publish_s": ready.duration_s,
            "load_s": max(x.duration_s for x in loads),
            "end_to_end_s": last.wall_time - m.wall_time,
            # hops, from the stamps: to the trainer and its publish; back to the coordinator and
            # its policy; to the replica, which cuts its requests in flight and loads
            "to_trainer_and_publish_s": ready.wall_time - m.wall_time,
            # after the publish: on the direct path the trainer -> relay -> replica hops and the load
            "ready_to_loaded_s": last.wall_time - ready.wall_time,
            "replicas_loaded": float(len(loads)),
        }
        if cmd is not None:
            row["load_at"] = cmd.wall_time
            row["back_and_decide_s"] = cmd.wall_time - ready.wall_time
            row["to_replica_and_load_s"] = last.wall_time - cmd.wall_time
        for k in (
            "abort_s",
            "load_s",
            "backend_open_s",
            "backend_load_s",
            "backend_decode_s",
            "backend_recv_s",
            "backend_planned",
            "backend_mapped",
            "backend_rpc_s",
            "backend_reset_s",
            "backend_salted",
        ):
            if k in last.detail:
                row[f"replica_{k}"] = last.detail[k]
        row.update({f"trainer_{k}": float(v) for k, v in ready.detail.items()})  # the publish's parts
        if "arrived_at" in last.detail:  # the hops trainer -> (relay ->) replica, stamp to stamp
            row["to_replica_s"] = last.detail["arrived_at"] - ready.wall_time
        sent = [x for x in msgs[i:] if isinstance(x, WeightsSent) and x.version == ready.version]
        if sent:
            row["trainer_send_s"] = max(x.duration_s for x in sent)
        rows.append(row)
    if not rows:
        return {"error": "no publish reached a replica"}
    steady = rows[1:] or rows  # the first one pays one-time costs (IPC mapping, allocator)
    nbytes = rows[0]["nbytes"]
    if floor_s is None:
        floor_s = nbytes / (floor_gbps * 1e9 / 2)  # read + write
    keys = [k for k in steady[0] if k.endswith("_s") and all(k in r for r in steady)]
    med = {k: statistics.median(r[k] for r in steady) for k in keys}
    planned = [r["replica_backend_planned"] for r in steady if "replica_backend_planned" in r]
    mapped = [r["replica_backend_mapped"] for r in steady if "replica_backend_mapped" in r]
    return {
        **decode_steps(msgs, [r["load_at"] for r in steady if "load_at" in r]),
        **({"planned_share": sum(planned) / len(planned)} if planned else {}),  # loads by the copy plan
        **({"mapped_share": sum(mapped) / len(mapped)} if mapped else {}),  # ... from a buffer mapped before
        "transport": rows[0]["transport"],
        "nbytes": nbytes,
        "copy_gbps": floor_gbps,
        "floor_s": floor_s,
        **{f"median_{k}": v for k, v in med.items()},
        "ratio_to_floor": med["end_to_end_s"] / floor_s,
        "first": rows[0],
        "n": len(rows),
    }


def decode_steps(msgs: list, load_times: list[float]) -> dict:
    """The engine step a weight load must wait for, from the run's own samples: a load lands
    between two engine steps, so a publish at a random moment waits the rest of the step under
    way — half a step on average, at least. With continuous batching every running sequence
    gains one token a step, so the mean step is (sequences in flight, time-averaged) / (tokens
    per second), both over the run's generation window (a prefill chunk makes a step longer:
    this is a lower estimate). ``in_flight_at_load``: sequences generating as each load was
    ordered (median over the steady publishes)."""
    marks = sorted(
        (m.wall_time, 1 if isinstance(m, SampleBegin | SampleResumed) else -1)
        for m in msgs
        if isinstance(m, SampleBegin | SampleResumed | SampleEnd | SampleAborted)
    )
    tokens = sum(len(m.sample.token_ids) for m in msgs if isinstance(m, SampleEnd))
    if len(marks) < 2 or tokens == 0:
        return {}
    area, n, prev, at_load, loads = 0.0, 0, marks[0][0], [], sorted(load_times)
    for t, d in marks:
        while loads and loads[0] < t:
            at_load.append(n)
            loads.pop(0)
        area += n * (t - prev)
        n, prev = n + d, t
    window = marks[-1][0] - marks[0][0]
    if window <= 0:
        return {}
    step = (area / window) / (tokens / window)
    out = {"mean_in_flight": area / window, "decode_tokens_per_s": tokens / window, "decode_step_s": step}
    out["step_wait_floor_s"] = step / 2
    if at_load:
        out["in_flight_at_load"] = float(statistics.median(at_load))
    return out


def rollout_tokens_per_s(events: list) -> dict:
    """Tokens/s over all samples of the run, from the first begin to the last end."""
    begins = [e.wall_time for e in events if isinstance(e, SampleBegin)]
    ends = [e for e in events if isinstance(e, SampleEnd)]
    if not begins or not ends:
        return {"error": "no samples"}
    tokens = sum(len(e.sample.token_ids) for e in ends)
    window = max(e.wall_time for e in ends) - min(begins)
    return {"samples": len(ends), "tokens": tokens, "window_s": window, "tokens_per_s": tokens / window}


def switch_figures(events: list) -> dict:
    out: dict = {}
    for mode in ("trainer", "rollout"):
        ch = [e for e in events if isinstance(e, ModeChanged) and e.mode == mode][1:] or [
            e for e in events if isinstance(e, ModeChanged) and e.mode == mode
        ]
        if ch:
            out[f"to_{mode}_s"] = statistics.median(e.duration_s for e in ch)
            for k in ch[0].detail:
                out[f"to_{mode}_{k}"] = statistics.median(e.detail.get(k, 0.0) for e in ch)
    for cls, name in ((Offloaded, "offload"), (Onloaded, "onload")):
        xs = [e for e in events if isinstance(e, cls)]
        if xs:
            out[f"{name}_s"] = statistics.median(e.duration_s for e in xs)
            out[f"{name}_bytes"] = max(e.nbytes for e in xs)
    return out


def step_time(events: list, warmup: int = 2) -> float:
    """The run's pace once started: mean gap between optimizer steps past the first
    ``warmup`` steps. A mean, not a median: under a staleness bound or a lending policy steps
    often come in a rhythm of short and long gaps, and the median would report the short one."""
    ends = [e.wall_time for e in events if isinstance(e, StepEnd)][warmup:]
    return (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan")


def how_ended(events: list) -> str:
    e = next((x for x in reversed(events) if isinstance(x, RunEnded)), None)
    return "none" if e is None else f"{e.reason} after {e.steps} steps{': ' + e.error[:300] if e.error else ''}"
