"""The names of the figures a scenario's result holds, by kind (:func:`known`), and the names
retired from results (:data:`RETIRED`): what a scenario's ``[[acceptance]]`` may name, checked
when the file loads (``bench/runner/scenario_file.py``), never after the run.

Invariant: every figure a runner writes is named here (a run of a shipped scenario and every
result JSON in ``bench/results/`` are checked against it in ``tests/unit/bench``), and a
retired name is never a figure again — it says what replaced it.
"""

from __future__ import annotations

from shunter.bench.analysis.gap import PARTS

_SUMMARY = {  # bench/analysis/summary.py: from a run's messages, simulated or real
    "wall_s",
    "steps",
    "step_s",
    "trainer_busy_s",
    "trainer_idle_frac",
    "rollout_idle_frac",
    "rollout_tokens",
    "rollout_tokens_per_s",
    "switches",
    "rollout_avail_s",
    "first_step_s",
    "trainer_idle_steady_frac",
    "rollout_idle_after_first_frac",
    "rollout_idle_steady_frac",
    "staleness_mean",
    "ahead_batches",
    "publish_s",
    "sync_s",
}

SIM = frozenset(
    _SUMMARY
    | {  # bench/analysis/bound.py, gap.py and bench/runner/simulated.py
        "bound_s",
        "frac_of_bound",
        "bound_first_step_s",
        "first_step_bound_s",
        "frac_of_first_step_bound",
        "stale_bound_s",
        "frac_of_stale_bound",
        "best_split_bound_s",
        "best_split_trainer_gpus",
        "rule_split_trainer_gpus",
        "frac_of_best_split_bound",
        "analytic_wall_s",
        "sim_over_analytic",
        "time_vs_reference",
        "replicas",
        "messages",
        "kv_occupancy",
        "simulator_wall_s",
        *(f"gap_{part}_s" for part in PARTS),
    }
    | {  # bench/runner/results.py: capacity_used, rollout_ledger, loop_figures
        "rollout_work_frac",
        *(f"rollout_{k}_frac" for k in ("packing", "recompute", "stopped", "other")),
        "coordinator_cpu_s",
        "coordinator_share",
        "coordinator_wall_s",
        "coordinator_wall_share",
        "decode_cpu_s",
        "facts_per_cpu_s",
        "messages_per_cpu_s",
        "samples_per_cpu_s",
        "inbox_messages",
        "offered_facts_per_s",
        "latency_p50_ms",
        "latency_p99_ms",
        "max_turn_ms",
        "gc_pause_s",
        "gc_in_turns_s",
        "relays",
        "relay_facts_per_message",
        "relay_cpu_s_max",
        "relay_share_max",
    }
)

REAL = frozenset(
    _SUMMARY
    | {  # bench/runner/real.py and minimal_loop.py
        "total_s",
        "reward_avg",
        "reward_last",
        *(f"{k}_avg" for k in ("pg_clipfrac", "is_truncated_frac", "is_masked_frac", "mismatch_kl", "is_ratio_max")),
        "generate_s",
        "score_s",
        "train_s",
        "load_s",
        "samples",
    }
)

OVERHEAD = frozenset(
    {  # bench/runner/overhead.py
        "replicas",
        "messages",
        "facts_per_cpu_s",
        "latency_p50_ms",
        "latency_p99_ms",
        "coordinator_share",
        "ray_calls_per_s_sequential",
        "ray_calls_per_s_pipelined",
        "ingest_events_per_s",
        "ingest_batch",
    }
)

BY_KIND = {"sim": SIM, "real": REAL, "overhead": OVERHEAD}

AGAINST_BASELINE = {  # kind -> figures named after the scenario's baseline variant: f"{prefix}{baseline}"
    "sim": ("speedup_vs_", "bound_speedup_vs_", "best_split_speedup_vs_"),
    "real": ("speedup_vs_", "time_vs_", "total_time_vs_", "reward_vs_"),
    "overhead": (),
}

RETIRED = {
    "events_per_s": "facts_per_cpu_s (it always counted facts: a relay's report is ~3 of them; "
    "until 2026-12-07 per second of the coordinator's wall time, since per CPU-second)",
    "offered_events_per_s": "offered_facts_per_s",
    "cpu_s": "simulator_wall_s (the simulation's own wall time, never CPU time)",
    "ideal_step_s": "bound_s (the true bound, 2026-12-01)",
    "overlap_frac_of_ideal": "frac_of_bound (the true bound, 2026-12-01)",
}
"""Names results once held -> what replaced them (old result JSONs still hold them)."""


def known(kind: str, baseline: str = "") -> frozenset[str]:
    """The figures a ``kind`` scenario's result may hold (with its ``baseline``'s ratios)."""
    names = BY_KIND.get(kind, frozenset())
    if baseline:
        names = names | {prefix + baseline for prefix in AGAINST_BASELINE.get(kind, ())}
    return names
