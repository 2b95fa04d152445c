"""Config builders the tests share: each returns a checked ``EngineConfig`` for one kind of run,
with ``**over`` merged section by section over its defaults.

- :func:`cfg`: a small run over the in-process fakes (``fakes.local_run``) — 2 standalone
  replicas, groups of 4, mini-batches of 8 samples, a publish every 2 steps, 6 steps, validation
  every 2 steps on 8 prompts;
- :func:`sim_config` (with the cost model :data:`SMALL`): a run of the simulated cluster
  (``shunter.bench.sim.cluster.run_sim``) at small scale;
- :data:`KEEP_COST`: the simulated workload of the straggler-lane and keep-mode tests;
- :func:`e2e_config`: the sort example (``examples/sort_separate.toml``) on the tiny model, for
  end-to-end runs with real vLLM and torch.
"""

from __future__ import annotations

from pathlib import Path

from shunter.bench.sim.cost_model import CostModel
from shunter.engine.config import from_dict, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sort_separate.toml"


def cfg(**over):
    base = {
        "run": {"total_steps": 6, "policy": "separate"},
        "rollout": {
            "standalone_replicas": 2,
            "n_samples_per_prompt": 4,
            "max_tokens": 12,
            "max_staleness": 1,
            "max_in_flight_per_replica": 16,
        },
        "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 2, "train_batch_size": 16},
        "validation": {"every": 2, "prompts": 8},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    return from_dict(base)


SMALL = CostModel(
    prompt_tokens=16,
    decode_step_s=0.01,
    decode_step_s_per_seq=1e-4,
    length_median=60,
    length_sigma=0.8,
    train_step_s=0.2,
    train_s_per_token=1e-4,
    weight_bytes=1e9,
)


def sim_config(policy="separate", standalone=2, hybrid=0, eta=1, steps=4, inflight=64, options=None, **rollout):
    return from_dict(
        {
            "run": {"total_steps": steps, "policy": policy, "stall_timeout_s": 3600.0, "policy_options": options or {}},
            "rollout": {
                "standalone_replicas": standalone,
                "hybrid_replicas": hybrid,
                "n_samples_per_prompt": 4,
                "max_tokens": 512,
                "max_model_len": 1024,
                "max_staleness": eta,
                "max_in_flight_per_replica": inflight,
                **rollout,
            },
            "trainer": {"ppo_mini_batch_size": 32, "parameter_sync_step": 2, "train_batch_size": 64},
            "validation": {"every": 0},
        }
    )


def e2e_config(tiny_model, tmp_path, **over):
    base = {"run": {"output_dir": str(tmp_path), "progress": False}, "model": {"path": tiny_model, "build_tiny": ""}}
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    return load_config(EXAMPLE, base)


KEEP_COST = CostModel(
    prompt_tokens=32,
    decode_step_s=0.01,
    decode_step_s_per_seq=1e-4,
    decode_s_per_kv_token=1e-7,
    prefill_s_per_token=1e-4,
    length_median=150,
    length_sigma=1.2,
    train_step_s=0.2,
    train_s_per_token=1e-5,
    weight_bytes=1e9,
    kv_tokens=20_000,
)
"""A long-tailed simulated workload whose replicas hold a KV cache of 20,000 tokens: the straggler
lane and ``weight_update = "keep"`` tests run on it."""
