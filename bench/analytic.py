"""Closed-form step time of the synchronous (``colocated``) schedule under a cost model.

Invariant: this module does not run the engine; it adds up the cost model's terms for the
schedule the ``colocated`` policy issues, so comparing it with a simulated run checks that
the engine adds no waits of its own (the simulator's acceptance check: within 2 %).

One cycle (= one train batch = ``parameter_sync_step`` optimizer steps), with every response
of length ``L`` (``length_sigma = 0``) spread evenly over ``R`` replicas
(``max_in_flight_per_replica = train_batch_size / R``):

    wake (+ load, except in the first cycle, whose replicas already hold version 0)
    + prefill_s_per_token * P + L * step_s(train_batch_size / R)      generate
    + max(sleep_s, offload_s)                                          rollout to sleep, trainer onload
    + parameter_sync_step * train_s(ppo_mini_batch_size * (P + L))     train
    + publish_s                                                        publish
"""

from __future__ import annotations

from shunter.bench.sim import CostModel
from shunter.engine.config import EngineConfig


def colocated_run_s(cfg: EngineConfig, cost: CostModel) -> float:
    r, t = cfg.rollout, cfg.trainer
    replicas = r.hybrid_replicas
    if cost.length_sigma != 0 or cost.lengths_file:
        raise ValueError("the closed form needs fixed lengths (length_sigma = 0, no lengths_file)")
    if t.train_batch_size % replicas or r.max_in_flight_per_replica != t.train_batch_size // replicas:
        raise ValueError("the closed form needs an even spread: max_in_flight_per_replica = train_batch_size / R")
    length = min(int(cost.length_median), r.max_tokens)
    p = cost.prompt_tokens
    generate = cost.prefill_s_per_token * p + length * cost.step_s(t.train_batch_size // replicas)
    train = t.parameter_sync_step * cost.train_s(t.ppo_mini_batch_size * (p + length))
    cycle = cost.wake_s + generate + max(cost.sleep_s, cost.offload_s) + train + cost.publish_s()
    cycles = cfg.run.total_steps // t.parameter_sync_step
    return cycles * cycle + (cycles - 1) * cost.load_s
