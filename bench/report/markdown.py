"""Turn result JSONs into a Markdown report with PNG plots (matplotlib, headless).

Invariant: the report shows only what the JSONs hold (medians, with min-max), names the
commit, machine and command of every table, and can be rebuilt from them at any time:

    python -m shunter.bench report bench/results/*.json --out bench/REPORT.md

The parts live beside this module: ``bench/report/plots.py``
(the PNG plots) and ``bench/report/gpu_sections.py`` (the GPU sections); this module keeps the scenario
tables and ``write_report``.
"""

from __future__ import annotations

import json
from pathlib import Path

from shunter.bench.report.gpu_sections import gpu2_section, gpu_section, gpu_sim_section
from shunter.bench.report.plots import plot, plot_curves
from shunter.bench.runner.acceptance import line

COLUMNS = [
    ("speedup_vs_colocated", "speedup vs colocated", "{:.2f}x"),
    ("bound_speedup_vs_colocated", "its bound vs colocated", "{:.2f}x"),
    ("best_split_speedup_vs_colocated", "best split's bound vs colocated", "{:.2f}x"),
    ("step_s", "step (s)", "{:.1f}"),
    ("frac_of_bound", "of its true bound", "{:.0%}"),
    ("frac_of_best_split_bound", "of the best split's bound", "{:.1%}"),
    ("rule_split_trainer_gpus", "trainer GPUs of the rule's split", "{:.0f}"),
    ("frac_of_stale_bound", "of its bound at its staleness", "{:.0%}"),
    ("frac_of_first_step_bound", "of its bound given its first step", "{:.0%}"),
    ("first_step_s", "first batch (s)", "{:.0f}"),
    ("trainer_idle_steady_frac", "trainer idle after the first batch", "{:.1%}"),
    ("rollout_idle_after_first_frac", "rollout idle after it", "{:.1%}"),
    ("rollout_idle_steady_frac", "rollout idle after it, while a group was left", "{:.1%}"),
    ("ahead_batches", "mini-batches begun ahead of the trainer", "{:.1f}"),
    ("rollout_work_frac", "decode capacity used", "{:.0%}"),
    ("kv_occupancy", "KV cache full while generating", "{:.0%}"),
    ("rollout_packing_frac", "decode capacity lost to packing", "{:.1%}"),
    ("rollout_recompute_frac", "to recompute after preemption", "{:.1%}"),
    ("rollout_stopped_frac", "replicas stopped", "{:.1%}"),
    ("rollout_other_frac", "on untrained work and the rest", "{:.1%}"),
    ("trainer_idle_frac", "trainer idle", "{:.0%}"),
    ("rollout_idle_frac", "rollout idle", "{:.0%}"),
    ("staleness_mean", "staleness", "{:.2f}"),
    ("switches", "switches", "{:.0f}"),
    ("reward_avg", "reward per step", "{:.3f}"),
    ("reward_vs_colocated", "reward per step vs colocated", "{:.1%}"),
    ("reward_last", "reward, last fifth", "{:.3f}"),
    ("pg_clipfrac_avg", "PPO clipped", "{:.1%}"),
    ("is_truncated_frac_avg", "TIS truncated", "{:.2%}"),
    ("mismatch_kl_avg", "mismatch KL", "{:.4f}"),
]


def _cell(stats: dict | None, fmt: str) -> str:
    if not stats:
        return ""
    med = fmt.format(stats["median"])
    if stats["min"] != stats["max"]:
        return f"{med} ({fmt.format(stats['min'])}–{fmt.format(stats['max'])})"
    return med


def table(result: dict) -> str:
    metrics = result["metrics"]
    base = result["scenario"]["scenario"].get("baseline", "")
    cols = [
        (k, name.replace("colocated", base or "colocated"), f)
        for k, name, f in COLUMNS
        if any(k.replace("colocated", base or "colocated") in m for m in metrics.values())
    ]
    cols = [(k.replace("colocated", base or "colocated"), n, f) for k, n, f in cols]
    extra = [
        k
        for k in (
            "time_vs_reference",
            "time_vs_minimal loop",
            "total_time_vs_minimal loop",
            "sim_over_analytic",
            "coordinator_share",
            "coordinator_wall_share",
            "facts_per_cpu_s",
            "events_per_s",  # results before 2026-12-07: facts per second of the coordinator's wall time
            "samples_per_cpu_s",
            "messages_per_cpu_s",
            "latency_p50_ms",
            "latency_p99_ms",
            "gc_in_turns_s",
            "publish_s",
            "sync_s",
        )
        if any(k in m for m in metrics.values())
    ]
    head = ["variant"] + [n for _, n, _ in cols] + extra
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in metrics.items():
        row = [name] + [_cell(m.get(k), f) for k, _, f in cols] + [_cell(m.get(k), "{:.4g}") for k in extra]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_report(results: list[Path], out: Path) -> Path:
    parts = [
        "# shunter bench report",
        "",
        "Every figure below is read from the JSON named under its table; rebuild with "
        "`python -m shunter.bench report bench/results/*.json`. Ratios compare runs of the same "
        "seed side by side; cells are medians with min–max over seeds.",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    for path in sorted(results):
        r = json.loads(path.read_text())
        if "scenario" not in r and "sync" in r:  # python -m shunter.bench gpu
            parts += gpu_section(r, path)
            continue
        if "scenario" not in r and "separate2" in r:  # python -m shunter.bench gpu, the two-GPU parts
            parts += gpu2_section(r, path)
            continue
        if "scenario" not in r and "step_time_ratios" in r:  # python -m shunter.bench gpu-sim
            parts += gpu_sim_section(r, path)
            continue
        if "scenario" not in r:  # not a bench result (a chaos soak's report, for one): README says where
            print(f"report: skipping {path}: not a bench scenario result")
            continue
        sc = r["scenario"]["scenario"]
        default_command = f"python -m shunter.bench run bench/scenarios/{sc['name']}.toml"  # results before 'command'
        parts += [
            f"## {sc['name']}",
            "",
            sc.get("description", ""),
            "",
            f"`{r.get('command') or default_command}` — commit {r.get('commit', '?')}, "
            f"{r['machine'].get('cpus')} CPUs, {r['machine'].get('platform', '')}, seeds {sc.get('seeds')}, "
            f"results: `{path.as_posix()}`",
            "",
            table(r),
            "",
        ]
        if r.get("acceptance"):
            parts += ["Acceptance, as the scenario states it:", ""]
            parts += [f"- {line(v)}" for v in r["acceptance"]] + [""]
        if r.get("reward_per_step_vs_baseline"):
            parts += [
                "Reward per step (mean over the run, then over seeds) relative to the baseline: "
                + ", ".join(f"{n} {v:.1%}" for n, v in r["reward_per_step_vs_baseline"].items()),
                "",
            ]
        pngs = (
            plot(r, path.parent)
            + plot_curves(r, path.parent)
            + sorted(path.parent.glob(f"{sc['name']}-timeline-*.png"))
        )
        for png in pngs:
            parts += [
                f"![{png.stem}]({Path('results') / png.name if out.parent == path.parent.parent else png.as_posix()})",
                "",
            ]
    out.write_text("\n".join(parts))
    return out
