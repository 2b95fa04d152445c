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
        m["reward_last"] = sum(e.metrics["batch/reward_mean"] for e in steps[-k:]) / k
    return m, events


def run_real(sc: Scenario) -> dict:
    per: dict[str, list[dict[str, float]]] = {v.name: [] for v in sc.variant}
    for seed in sc.scenario.seeds:
        for v in sc.variant:
            standalone = 0 if v.policy == "colocated" else 1
            hybrid = 1 if (v.policy in ("colocated", "lend_when_idle") or v.hybrid) else 0
            over = merge(sc.engine, {"run": {"policy": v.policy, "policy_options": v.policy_options, "seed": seed,
                                             "progress": False},
                                     "rollout": {"standalone_replicas": standalone, "hybrid_replicas": hybrid,
                                                 "max_staleness": v.max_staleness}})
            m, _ = asyncio.run(_one(load_config(EXAMPLE, merge(over, v.engine))))
            per[v.name].append(m)
            print(f"  {v.name:<28} seed {seed}: {m['step_s']:.3f} s/step, trainer idle {m['trainer_idle_frac']:.0%}, "
                  f"rollout idle {m['rollout_idle_frac']:.0%}, reward (last fifth) {m.get('reward_last', 0):.3f}")
    if sc.scenario.baseline:
        for runs in per.values():
            for m, b in zip(runs, per[sc.scenario.baseline], strict=True):
                m[f"speedup_vs_{sc.scenario.baseline}"] = b["wall_s"] / m["wall_s"]
    return result_json(sc, {name: aggregate(runs) for name, runs in per.items()})
