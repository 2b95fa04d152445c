"""Closed-form step time of the synchronous (``colocated``) schedule under a cost model.

Invariant: this module does not run the engine; it adds up the cost model's terms for the
schedule the ``colocated`` policy issues, so comparing it with a simulated run checks that
the engine adds no waits of its own (the simulator's acceptance check: within 2 %).

One cycle (= one train batch = ``parameter_sync_step`` optimizer steps), with every response
of length ``L`` (``length_sigma = 0``) spread evenly over ``R`` replicas
(``max_in_flight_per_replica = train_batch_size / R``):

    wake (+ load, except in the first cycle, whose replicas already hold version 0)
    + b * w + L * step_s(b) + (b * w / chunk_s) * decode_step_s        generate
      (b = train_batch_size / R requests per replica, each prefilling P tokens in w seconds,
      first come first served, chunk_s of prefill per step: the last joins after b * w / chunk_s
      steps that also decode the earlier ones, and the batch drains as it filled)
    + max(sleep_s, offload_s)                                          rollout to sleep, trainer onload
    + parameter_sync_step * train_s(ppo_mini_batch_size * (P + L))     train
    + publish_s                                                        publish
"""

from __future__ import annotations

from shunter.bench.sim.cost_model import CostModel
from shunter.bench.sim.replica_model import prefill_s
from shunter.engine.config.engine_config import EngineConfig


def colocated_run_s(cfg: EngineConfig, cost: CostModel) -> float:
    r, t = cfg.rollout, cfg.trainer
    replicas = r.hybrid_replicas
    if cost.length_sigma != 0 or cost.lengths_file:
        raise ValueError("the closed form needs fixed lengths (length_sigma = 0, no lengths_file)")
    if t.train_batch_size % replicas or r.max_in_flight_per_replica != t.train_batch_size // replicas:
        raise ValueError("the closed form needs an even spread: max_in_flight_per_replica = train_batch_size / R")
    if cost.decode_s_per_kv_token or cost.kv_tokens:
        raise ValueError("the closed form leaves attention cost and the KV limit out (set them to 0)")
    length = min(int(cost.length_median), r.max_tokens)
    b = t.train_batch_size // replicas
    w = prefill_s(cost, cost.prompt_tokens)
    ramp = b * w / prefill_s(cost, cost.prefill_chunk_tokens) if w else 0.0  # steps until the last joins
    if ramp > length:
        raise ValueError("the closed form needs the prefill of a batch to take fewer steps than its decode")
    generate = b * w + length * cost.step_s(b) + ramp * cost.decode_step_s
    p = cost.prompt_tokens
    train = t.parameter_sync_step * cost.train_s(t.ppo_mini_batch_size * (p + length))
    cycle = cost.wake_s + generate + max(cost.sleep_s, cost.offload_s) + train + cost.publish_s()
    cycles = cfg.run.total_steps // t.parameter_sync_step
    return cycles * cycle + (cycles - 1) * cost.load_s
