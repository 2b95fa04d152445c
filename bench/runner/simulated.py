"""A ``sim`` scenario run (:func:`run_scenario`): each variant on the simulated cluster, once per seed,
with its figures, its true bound and its gap to the best split.

Invariants: a scenario is a TOML file loaded into the Structs of ``bench/runner/scenario_file.py``
(unknown keys are errors); every variant runs once per seed with the same engine settings and cost model, so
each ratio (``speedup_vs_<baseline>``) compares two runs of the same seed side by side;
the JSON written holds the scenario itself, the machine, the package versions and the
commit, and for every metric its min / median / max over the seeds.

GPU accounting of a simulated variant (``gpus`` in total, ``gpus_per_replica`` each):

- ``colocated``: every GPU hosts a hybrid replica and the trainer trains on all of them;
- ``separate``: ``trainer_gpus`` train, the rest host standalone replicas;
- ``lend_when_idle`` (and other policies with ``hybrid = true``): as ``separate``, plus a
  hybrid replica on every ``gpus_per_replica`` trainer GPUs.

The trainer trains data parallel on its GPUs (``cost.trainer_gpus``: time per token divided
over them, plus the gradient all-reduce ``cost.grad_bytes`` costs on that many).

Every variant's result carries the true bound (``shunter.bench.analysis.bound``) of its own GPUs and
schedule — ``bound_s``, ``frac_of_bound``; ``stale_bound_s``, ``frac_of_stale_bound`` at the
variant's staleness bound — and ``best_split_bound_s``: the least overlapped bound over every
trainer:rollout split of the same GPUs for the same work (the ceiling a better split could
reach), ``frac_of_best_split_bound`` and ``gap_<part>_s``: the distance to it cut into named
parts that add up (``shunter.bench.analysis.gap``). The replicas' capacity is the cost model's
(``bound.ModelMachine``: at most ``max_in_flight_per_replica`` sequences and ``kv_tokens`` of context per decode step).

The scenario file's Structs and :func:`load` live in ``bench/runner/scenario_file.py``, the figures
and the result JSON in ``bench/runner/results.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec

from shunter.bench.analysis import bound
from shunter.bench.analysis.analytic import colocated_run_s
from shunter.bench.analysis.gap import Gaps
from shunter.bench.analysis.summary import Summary
from shunter.bench.runner.results import (
    aggregate,
    capacity_used,
    loop_figures,
    result_json,
    rollout_ledger,
)
from shunter.bench.runner.scenario_file import Scenario, Variant
from shunter.bench.sim.cluster import run_sim
from shunter.bench.sim.cost_model import CostModel
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.load import from_dict, merge


def variant_setup(sc: Scenario, v: Variant) -> tuple[EngineConfig, CostModel]:
    gpr, gpus = sc.cluster.gpus_per_replica, sc.cluster.gpus
    if v.policy == "colocated":
        trainer_gpus, standalone, hybrid = gpus, 0, gpus // gpr
    else:
        trainer_gpus = v.trainer_gpus
        if not 0 < trainer_gpus < gpus:
            raise ValueError(f"variant {v.name!r}: trainer_gpus must be in 1..{gpus - 1}, got {trainer_gpus}")
        standalone = (gpus - trainer_gpus) // gpr
        hybrid = trainer_gpus // gpr if (v.hybrid or v.policy == "lend_when_idle") else 0
    data = merge(
        sc.engine,
        {
            "run": {"policy": v.policy, "policy_options": v.policy_options, "progress": False},
            "rollout": {"standalone_replicas": standalone, "hybrid_replicas": hybrid, "max_staleness": v.max_staleness},
            "validation": {"every": 0},
        },
    )
    data = merge(data, v.engine)
    data["run"].setdefault("stall_timeout_s", 36_000.0)
    try:
        cost = msgspec.convert({**msgspec.to_builtins(sc.cost), **v.cost, "trainer_gpus": trainer_gpus}, CostModel)
    except msgspec.ValidationError as e:
        raise ValueError(f"variant {v.name!r}: cost: {e}") from None
    cfg = from_dict(data, origin=f"{sc.scenario.name}/{v.name}")
    need = cost.prompt_tokens + cfg.rollout.max_tokens
    if cost.kv_tokens and cost.kv_tokens < need:
        raise ValueError(
            f"scenario {sc.scenario.name}: cost.kv_tokens = {cost.kv_tokens} cannot hold one sequence of "
            f"prompt_tokens + rollout.max_tokens = {need} tokens (vLLM refuses to start such an engine)"
        )
    return cfg, cost


def schedule_of(v: Variant) -> bound.Schedule:
    if v.policy == "colocated":
        return "serial"
    return "lending" if (v.hybrid or v.policy == "lend_when_idle") else "overlapped"


def bound_batch(sc: Scenario) -> int:
    """The batch the bound's replica may run: the largest ``max_in_flight_per_replica`` the
    scenario or any of its variants allows. A variant that admits fewer sequences (to keep its
    stragglers fast or its KV cache from preempting) is measured against the same machine as
    the others: a lower cap never loosens its bound."""
    own = from_dict(sc.engine, origin=sc.scenario.name).rollout.max_in_flight_per_replica
    return max([own, *(variant_setup(sc, v)[0].rollout.max_in_flight_per_replica for v in sc.variant)])


def fleet(sc: Scenario, v: Variant, cfg: EngineConfig, cost: CostModel) -> bound.Fleet:
    """The variant's replicas, as the cost model has them (``variant_setup``'s GPU accounting)."""
    r = cfg.rollout
    always = r.standalone_replicas if v.policy != "colocated" else r.hybrid_replicas
    return bound.Fleet(
        machine=bound.ModelMachine(cost, bound_batch(sc)),  # the variant's own cap is among them
        replicas=always,
        lendable=r.hybrid_replicas if schedule_of(v) == "lending" else 0,
        gpus=sc.cluster.gpus,
        trainer_gpus=cost.trainer_gpus,
        gpus_per_replica=sc.cluster.gpus_per_replica,
        steps_per_version=cfg.trainer.parameter_sync_step,
    )


def gate(cfg: EngineConfig) -> bound.Gate | None:
    """The staleness gate a run in ``on_stale = "wait"`` mode keeps (None in drop mode)."""
    if cfg.rollout.on_stale != "wait":
        return None
    return bound.Gate(cfg.rollout.admit_bound, cfg.trainer.parameter_sync_step)  # admit_staleness where set


def split_bounds(
    sc: Scenario, cost: CostModel, work: list[bound.StepWork], machine: bound.Machine, first_at: float = 0.0
) -> dict[int, float]:
    """The overlapped bound of this work at every trainer:rollout split of the scenario's GPUs,
    by trainer GPUs: the per-token part of each step rescales with the trainer GPUs (data
    parallel) and the all-reduce is the one on that many GPUs; the fixed part
    (``train_step_s``) and the publish do not change. ``first_at``: no first step before then.

    The documented rule for choosing a split (``rule_split_trainer_gpus``, docs/benchmarks.md)
    is the least of these bounds *given the run's own first step*: no online schedule makes the
    first batch as short as the bound's (its longest sample alone, every other one at a full
    batch), and a split whose trainer is the bottleneck pays that wait in full, while one whose
    rollout is hides it under generation the run needs anyway. The least bound without it
    (``best_split_bound_s``) stays the yardstick."""
    k0 = cost.trainer_gpus
    fixed0 = cost.train_step_s + cost.allreduce_s()
    gen = bound.generation(work, machine)  # the same for every split
    out = {}
    for k in range(1, sc.cluster.gpus):
        replicas = (sc.cluster.gpus - k) // sc.cluster.gpus_per_replica
        if replicas < 1:
            continue
        fixed = cost.train_step_s + msgspec.structs.replace(cost, trainer_gpus=k).allreduce_s()
        scaled = [w._replace(step_s=fixed + max(0.0, w.step_s - fixed0) * k0 / k) for w in work]
        out[k] = bound.overlapped_s(scaled, machine, replicas, first_at=first_at, gen=gen)
    return out


def run_scenario(sc: Scenario, *, log=print, out_dir: Path | None = None) -> dict:
    if sc.scenario.kind != "sim":
        raise ValueError(f"scenario {sc.scenario.name!r}: kind {sc.scenario.kind!r} has its own runner")
    per_seed: dict[str, list[dict[str, float]]] = {v.name: [] for v in sc.variant}
    for v in sc.variant:  # every variant's settings checked before the first one runs
        variant_setup(sc, v)
    for seed in sc.scenario.seeds:
        for v in sc.variant:
            cfg, cost = variant_setup(sc, v)
            summary, gaps = Summary(), Gaps()
            draw = sc.scenario.timeline and out_dir is not None and seed == sc.scenario.seeds[0]
            with tempfile.TemporaryDirectory(prefix="shunter-bench-") as tmp:
                charge = sc.scenario.charge_coordinator if v.charge_coordinator is None else v.charge_coordinator
                r = run_sim(
                    cfg,
                    cost,
                    seed=seed,
                    keep=draw,
                    sinks=[summary, gaps],
                    charge_coordinator=charge,
                    out_dir=Path(tmp) if sc.scenario.production_sinks else None,
                    replicas_per_relay=max(1, sc.cluster.gpus_per_node // sc.cluster.gpus_per_replica),
                )
            if draw:
                from shunter.bench.report.timeline import plot_timeline

                slug = "".join(c if c.isalnum() else "-" for c in v.name).strip("-")
                plot_timeline(
                    r.messages,
                    out_dir / f"{sc.scenario.name}-timeline-{slug}.png",
                    title=f"{sc.scenario.name}: {v.name} (seed {seed})",
                )
            if r.ended.reason != "completed":
                raise RuntimeError(f"{sc.scenario.name}/{v.name} seed {seed}: {r.ended.reason}: {r.ended.error}")
            m = summary.result()
            work = summary.work()
            fl = fleet(sc, v, cfg, cost)
            m.update(bound.figures(work, fl, schedule_of(v), m["wall_s"], gate(cfg), m.get("first_step_s")))
            splits = split_bounds(sc, cost, work, fl.machine)
            m["best_split_bound_s"] = min(splits.values())
            m["best_split_trainer_gpus"] = float(min(splits, key=splits.__getitem__))
            if "first_step_s" in m:
                given = split_bounds(sc, cost, work, fl.machine, first_at=m["first_step_s"])
                m["rule_split_trainer_gpus"] = float(min(given, key=given.__getitem__))
            m["frac_of_best_split_bound"] = m["best_split_bound_s"] / m["wall_s"]
            parts = gaps.parts(work, fl, schedule_of(v), m["best_split_bound_s"], gate(cfg))
            m.update({f"gap_{k}_s": x for k, x in parts.items()})  # wall - best split bound, by cause
            capacity_used(m, work, fl)
            rollout_ledger(m, r.books, cost, fl.machine)
            m["simulator_wall_s"] = r.simulator_wall_s
            if r.kv_occupancy is not None:
                m["kv_occupancy"] = r.kv_occupancy
            m["messages"] = float(r.handled)
            m.update(loop_figures(r, summary.samples))
            m["replicas"] = float(cfg.rollout.standalone_replicas + cfg.rollout.hybrid_replicas)
            if v.policy == "colocated" and cost.length_sigma == 0 and not cost.lengths_file:
                m["analytic_wall_s"] = colocated_run_s(cfg, cost)
                m["sim_over_analytic"] = r.sim_s / m["analytic_wall_s"]
            per_seed[v.name].append(m)
            if m["frac_of_bound"] > 1.001:  # a run faster than its lower bound: the bound is wrong
                log(f"  WARNING {v.name} seed {seed}: {m['frac_of_bound']:.1%} of its bound — not a lower bound")
            log(
                f"  {v.name:<32} seed {seed}: step {m['step_s']:.2f} s (sim), trainer idle "
                f"{m['trainer_idle_frac']:.1%}, rollout idle {m['rollout_idle_frac']:.1%}, {m['frac_of_bound']:.0%} of "
                f"its bound; coordinator {r.coordinator_cpu_s:.2f} s CPU{' (charged)' if charge else ''}, "
                f"{r.coordinator_wall_s:.2f} s wall (never charged) [simulated in {r.simulator_wall_s:.1f} s]"
            )
    if sc.scenario.baseline:
        base = per_seed[sc.scenario.baseline]
        for runs in per_seed.values():
            for m, b in zip(runs, base, strict=True):
                m[f"speedup_vs_{sc.scenario.baseline}"] = b["wall_s"] / m["wall_s"]
                # what the variant's own bound, and the best split's, would give over the baseline
                m[f"bound_speedup_vs_{sc.scenario.baseline}"] = b["wall_s"] / m["bound_s"]
                m[f"best_split_speedup_vs_{sc.scenario.baseline}"] = b["wall_s"] / m["best_split_bound_s"]
    for name, ref in sc.scenario.pairs:
        for m, b in zip(per_seed[name], per_seed[ref], strict=True):
            m["time_vs_reference"] = m["wall_s"] / b["wall_s"]
    return result_json(sc, {name: aggregate(runs) for name, runs in per_seed.items()})
