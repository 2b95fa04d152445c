"""Fault soak: many whole runs (real coordinator, policies, buffer, rollout core, checkpoint
store; fakes for vLLM and torch) under random fault schedules — replicas killed, trainer
deaths, coordinator crashes — each resumed from its last checkpoint. Prints what was
injected and what was lost (the RELIABILITY figures come from here):

    .venv/bin/python -m tests.support.fault_soak --runs 200 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.support.configs import cfg
from tests.support.fakes import ACTIONS, run_with_faults


def soak(runs: int, seed: int, total_steps: int = 10) -> dict:
    rng = random.Random(seed)
    out: Counter = Counter()
    fired: list[str] = []
    t0 = time.perf_counter()
    for _ in range(runs):
        schedule = [(rng.randint(1, total_steps), rng.choice(ACTIONS)) for _ in range(rng.randint(1, 4))]
        staleness, on_stale = rng.randint(0, 2), rng.choice(["wait", "drop"])
        policy, replicas = rng.choice(
            [
                ("separate", {"standalone_replicas": 3}),
                ("lend_when_idle", {"standalone_replicas": 2, "hybrid_replicas": 1}),
                ("colocated", {"standalone_replicas": 0, "hybrid_replicas": 3}),
            ]
        )
        c = cfg(
            run={
                "total_steps": total_steps,
                "checkpoint_every": 2,
                "policy": policy,
                "policy_options": {"switch_cost_prior_s": 0.0} if policy == "lend_when_idle" else {},
            },
            validation={"every": 0},
            rollout={**replicas, "max_staleness": staleness, "on_stale": on_stale},
        )
        root = Path(tempfile.mkdtemp())
        try:
            batches, steps, attempts, coord = asyncio.run(run_with_faults(c, schedule, root, fired=fired))
        except Exception as e:
            raise RuntimeError(
                f"run {out['runs']}: policy {policy}, max_staleness {staleness}, on_stale {on_stale}, "
                f"faults {schedule}: {type(e).__name__}: {e}"
            ) from e
        finally:
            shutil.rmtree(root, ignore_errors=True)
        out["runs"] += 1
        out["runs_completed"] += coord.ended is not None and coord.ended.reason == "completed"
        out["restarts_from_checkpoint"] += attempts - 1
        groups = Counter(p for b in batches for p in b)
        n = c.rollout.n_samples_per_prompt
        out["groups_trained"] += len(groups)
        out["groups_trained_twice_or_in_part"] += sum(v != n for v in groups.values())
        out["steps_missing"] += abs(len(batches) - total_steps)
        k = coord.buffer.counters()
        out["groups_unaccounted"] += k["dispatched"] - (k["trained"] + k["dropped"] + k["in_flight"] + k["ready"])
        out["groups_dropped_failed"] += k.get("dropped_failed", 0)
        out["samples_over_staleness_bound"] += sum(e.metrics["batch/staleness_max"] > staleness for e in steps)
        if on_stale == "wait":
            out["wait_mode_prompts_skipped"] += len(groups) != (max(groups) + 1 if groups else 0)
    out.update({f"injected_{a}": v for a, v in Counter(fired).items()})
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return dict(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    res = soak(a.runs, a.seed)
    print(json.dumps(res, indent=1))
    lost = (
        res["groups_trained_twice_or_in_part"]
        + res["groups_unaccounted"]
        + res["steps_missing"]
        + res["samples_over_staleness_bound"]
        + res["groups_dropped_failed"]
        + res.get("wait_mode_prompts_skipped", 0)
    )
    return 0 if lost == 0 and res["runs_completed"] == res["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
