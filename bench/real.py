"""The sync-vs-async comparison with the real engine: vLLM (CPU build) replicas and the
torch trainer as Ray actors, on the tiny model and the built-in task.

Invariant: each variant is a full ``Engine`` run of the same config but for its policy and
replicas, measured by the same event-log analysis as the simulator; variants of one seed
run back to back in one process, so the ratio is side by side.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from shunter.bench.analysis import summarize
from shunter.bench.scenario import Scenario, aggregate, result_json
from shunter.engine.config import load_config, merge

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sort_separate.toml"


async def _one(cfg) -> tuple[dict[str, float], list]:
    from shunter import Engine

    events = []
    async with Engine(cfg) as engine:
        async for ev in engine.events():
            events.append(ev)
    m = summarize(events)
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
                    "run": {"policy": v.policy, "policy_options": v.policy_options, "seed": seed, "progress": False},
                    "rollout": {
                        "standalone_replicas": standalone,
                        "hybrid_replicas": hybrid,
                        "max_staleness": v.max_staleness,
                    },
                },
            )
            m, events = asyncio.run(_one(load_config(EXAMPLE, merge(over, v.engine))))
            per[v.name].append(m)
            curves[v.name].append({"seed": seed, **curve(events)})
            print(
                f"  {v.name:<28} seed {seed}: {m['step_s']:.3f} s/step, trainer idle {m['trainer_idle_frac']:.0%}, "
                f"rollout idle {m['rollout_idle_frac']:.0%}, reward (last fifth) {m.get('reward_last', 0):.3f}, "
                f"per step {m.get('reward_avg', 0):.3f}, staleness {m.get('staleness_mean', 0):.2f}",
                flush=True,
            )
    base = sc.scenario.baseline
    if base:
        for runs in per.values():
            for m, b in zip(runs, per[base], strict=True):
                m[f"speedup_vs_{base}"] = b["wall_s"] / m["wall_s"]
                if "reward_avg" in m and b.get("reward_avg"):
                    m[f"reward_vs_{base}"] = m["reward_avg"] / b["reward_avg"]
    out = result_json(sc, {name: aggregate(runs) for name, runs in per.items()})
    if base:  # the parity figure: mean over seeds of the reward per step, variant / baseline
        mean = {n: sum(r.get("reward_avg", 0.0) for r in runs) / len(runs) for n, runs in per.items() if runs}
        out["reward_per_step_vs_baseline"] = {n: v / mean[base] for n, v in mean.items() if mean.get(base)}
    out["curves"] = curves
    return out
