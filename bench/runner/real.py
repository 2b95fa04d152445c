"""The sync-vs-async comparison with the real engine: vLLM (CPU build) replicas and the
torch trainer as Ray actors, on the tiny model and the built-in task.

Invariant: each variant is a full ``Engine`` run of the same config but for its policy and
replicas, measured by the same event-log analysis as the simulator; variants of one seed
run back to back in one process, so the ratio is side by side.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from shunter.bench.analysis.summary import summarize
from shunter.bench.runner.results import aggregate, result_json
from shunter.bench.runner.scenario_file import Scenario
from shunter.engine.config.load import load_config, merge

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sort_separate.toml"


async def _one(cfg) -> tuple[dict[str, float], list]:
    from shunter import Engine

    events = []
    t0 = time.perf_counter()
    async with Engine(cfg) as engine:
        async for ev in engine.events():
            events.append(ev)
    total = time.perf_counter() - t0
    m = summarize(events)
    m["total_s"] = total  # the whole run as its user waits for it: cluster, actors and engine start included
    steps = [e for e in events if type(e).__name__ == "StepEnd"]
    if steps:
        k = max(1, len(steps) // 5)
        rewards = [e.metrics["batch/reward_mean"] for e in steps]
        m["reward_last"] = sum(rewards[-k:]) / k
        m["reward_avg"] = sum(rewards) / len(rewards)  # reward per step, averaged over the run
        for key in (
            "trainer/pg_clipfrac",
            "trainer/is_truncated_frac",
            "trainer/is_masked_frac",
            "trainer/mismatch_kl",
            "trainer/is_ratio_max",
        ):  # off-policy figures, averaged over steps
            vals = [e.metrics[key] for e in steps if key in e.metrics]
            if vals:
                m[key.split("/", 1)[1] + "_avg"] = sum(vals) / len(vals)
    return m, events


def curve(events: list) -> dict[str, list[float]]:
    """Per optimizer step: wall time since the run began, sampled reward, staleness."""
    t0 = next((e.wall_time for e in events if type(e).__name__ in ("RunStarted", "RunResumed")), None)
    steps = [e for e in events if type(e).__name__ == "StepEnd"]
    t0 = steps[0].wall_time if t0 is None and steps else t0
    return {
        "step": [float(e.step) for e in steps],
        "wall_s": [e.wall_time - t0 for e in steps],
        "reward": [e.metrics["batch/reward_mean"] for e in steps],
        "staleness_mean": [e.metrics.get("batch/staleness_mean", 0.0) for e in steps],
        "staleness_max": [e.metrics.get("batch/staleness_max", 0.0) for e in steps],
        "is_masked_frac": [e.metrics.get("trainer/is_masked_frac", 0.0) for e in steps],
        "is_truncated_frac": [e.metrics.get("trainer/is_truncated_frac", 0.0) for e in steps],
        "pg_clipfrac": [e.metrics.get("trainer/pg_clipfrac", 0.0) for e in steps],
    }


MINIMAL = "minimal_loop"
"""A variant whose ``policy`` is this runs ``shunter.bench.runner.minimal_loop`` instead of the engine."""


def engine_parts(events: list) -> dict[str, float]:
    """A run's time in the parts the minimal loop reports (``train_s``, ``publish_s``,
    ``load_s``: summed over the run; ``first_step_s``: the wait for the first batch), so the
    two sit side by side — the trainer's steps take longer when it shares the cores with
    generation, which overlaps them."""
    kinds: dict[str, list] = {}
    for e in events:
        kinds.setdefault(type(e).__name__, []).append(e)
    loads: dict[int, float] = {}
    for e in kinds.get("WeightsLoaded", []):
        loads[e.version] = max(loads.get(e.version, 0.0), e.duration_s)
    return {
        "train_s": sum(e.duration_s for e in kinds.get("StepEnd", [])),
        "publish_s": sum(e.duration_s for e in kinds.get("WeightsReady", [])),
        "load_s": sum(loads.values()),
        "samples": float(len(kinds.get("SampleEnd", []))),
    }


def run_real(sc: Scenario) -> dict:
    per: dict[str, list[dict[str, float]]] = {v.name: [] for v in sc.variant}
    curves: dict[str, list[dict]] = {v.name: [] for v in sc.variant}
    for seed in sc.scenario.seeds:
        for v in sc.variant:
            standalone = 0 if v.policy == "colocated" else 1
            hybrid = 1 if (v.policy in ("colocated", "lend_when_idle") or v.hybrid) else 0
            over = merge(
                sc.engine,
                {
                    "run": {
                        "policy": "separate" if v.policy == MINIMAL else v.policy,  # the minimal loop has none
                        "policy_options": v.policy_options,
                        "seed": seed,
                        "progress": False,
                    },
                    "rollout": {
                        "standalone_replicas": standalone,
                        "hybrid_replicas": hybrid,
                        "max_staleness": v.max_staleness,
                    },
                },
            )
            cfg = load_config(EXAMPLE, merge(over, v.engine))
            if v.policy == MINIMAL:  # the yardstick: the same work in a hand-written loop
                from shunter.bench.runner.minimal_loop import run_minimal

                m, events = asyncio.run(run_minimal(cfg)), []
            else:
                m, events = asyncio.run(_one(cfg))
                m.update(engine_parts(events))
            per[v.name].append(m)
            if events:
                curves[v.name].append({"seed": seed, **curve(events)})
            print(
                f"  {v.name:<28} seed {seed}: {m['step_s']:.3f} s/step, "
                f"trainer idle {m.get('trainer_idle_frac', 0):.0%}, "
                f"rollout idle {m.get('rollout_idle_frac', 0):.0%}, reward (last fifth) {m.get('reward_last', 0):.3f}, "
                f"per step {m.get('reward_avg', 0):.3f}, staleness {m.get('staleness_mean', 0):.2f}, "
                f"train {m.get('train_s', 0):.1f} s, publish + load {m.get('publish_s', 0) + m.get('load_s', 0):.1f} s",
                flush=True,
            )
    base = sc.scenario.baseline
    if base:
        for runs in per.values():
            for m, b in zip(runs, per[base], strict=True):
                m[f"speedup_vs_{base}"] = b["wall_s"] / m["wall_s"]
                m[f"time_vs_{base}"] = m["wall_s"] / b["wall_s"]
                if "total_s" in m and "total_s" in b:
                    m[f"total_time_vs_{base}"] = m["total_s"] / b["total_s"]
                if "reward_avg" in m and b.get("reward_avg"):
                    m[f"reward_vs_{base}"] = m["reward_avg"] / b["reward_avg"]
    out = result_json(sc, {name: aggregate(runs) for name, runs in per.items()})
    if base:  # the parity figure: mean over seeds of the reward per step, variant / baseline
        mean = {n: sum(r.get("reward_avg", 0.0) for r in runs) / len(runs) for n, runs in per.items() if runs}
        out["reward_per_step_vs_baseline"] = {n: v / mean[base] for n, v in mean.items() if mean.get(base)}
    out["curves"] = curves
    return out
