"""Turn result JSONs into a Markdown report with PNG plots (matplotlib, headless).

Invariant: the report shows only what the JSONs hold (medians, with min-max), names the
commit, machine and command of every table, and can be rebuilt from them at any time:

    python -m shunter.bench report bench/results/*.json --out bench/REPORT.md
"""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = [
    ("speedup_vs_colocated", "speedup vs colocated", "{:.2f}x"),
    ("bound_speedup_vs_colocated", "its bound vs colocated", "{:.2f}x"),
    ("best_split_speedup_vs_colocated", "best split's bound vs colocated", "{:.2f}x"),
    ("step_s", "step (s)", "{:.1f}"),
    ("frac_of_bound", "of its true bound", "{:.0%}"),
    ("frac_of_best_split_bound", "of the best split's bound", "{:.0%}"),
    ("frac_of_stale_bound", "of its bound at its staleness", "{:.0%}"),
    ("frac_of_first_step_bound", "of its bound given its first step", "{:.0%}"),
    ("first_step_s", "first batch (s)", "{:.0f}"),
    ("trainer_idle_steady_frac", "trainer idle after the first batch", "{:.0%}"),
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
            "events_per_s",
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


def plot(result: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = result["scenario"]["scenario"]["name"]
    metrics = result["metrics"]
    made = []
    base = result["scenario"]["scenario"].get("baseline", "")
    key = f"speedup_vs_{base}"
    if base and any(key in m for m in metrics.values()):
        fig, ax = plt.subplots(figsize=(8, 3.5))
        names = list(metrics)
        med = [metrics[n].get(key, {}).get("median", 0) for n in names]
        lo = [med[i] - metrics[n].get(key, {}).get("min", 0) for i, n in enumerate(names)]
        hi = [metrics[n].get(key, {}).get("max", 0) - med[i] for i, n in enumerate(names)]
        ax.barh(names, med, xerr=[lo, hi], color="#4c72b0")
        ax.axvline(1.0, color="grey", lw=1)
        ax.set_xlabel(f"speedup vs {base} (median, min–max over seeds)")
        made.append(_save(plt, fig, ax, out_dir / f"{name}-speedup.png"))
    if any("trainer_idle_frac" in m for m in metrics.values()):
        fig, ax = plt.subplots(figsize=(8, 3.5))
        names = list(metrics)
        y = range(len(names))
        med = [(metrics[n].get("trainer_idle_frac", {}), metrics[n].get("rollout_idle_frac", {})) for n in names]
        ax.barh([i - 0.2 for i in y], [t.get("median", 0.0) for t, _ in med], 0.4, label="trainer")  # 0: not measured
        ax.barh([i + 0.2 for i in y], [r.get("median", 0.0) for _, r in med], 0.4, label="rollout")
        ax.set_yticks(list(y), names)
        ax.set_xlabel("idle fraction of wall time (median)")
        ax.legend()
        made.append(_save(plt, fig, ax, out_dir / f"{name}-idle.png"))
    if any("gap_split_s" in m for m in metrics.values()):
        from shunter.bench.gap import plot_gaps

        fig, ax = plot_gaps(plt, metrics)
        made.append(_save(plt, fig, ax, out_dir / f"{name}-gap.png"))
    return made


def _smooth(xs: list[float], k: int = 10) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out


def _mean_curve(runs: list[dict], key: str) -> tuple[list[float], list[float]]:
    """Mean over seeds of ``key`` per optimizer step (up to the shortest run)."""
    n = min(len(r["step"]) for r in runs)
    return runs[0]["step"][:n], [sum(r[key][i] for r in runs) / len(runs) for i in range(n)]


def plot_curves(result: dict, out_dir: Path) -> list[Path]:
    """Reward vs optimizer step and vs wall time per variant (mean over seeds, moving average
    of 10 steps); for ``eta=<n> <objective>`` variants, reward per step vs the staleness bound."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, name = result.get("curves") or {}, result["scenario"]["scenario"]["name"]
    curves = {v: runs for v, runs in curves.items() if runs}
    if not curves:
        return []
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (variant, runs) in enumerate(curves.items()):
        color = cmap(i / max(1, len(curves) - 1))
        style = "--" if "decoupled" in variant else "-"
        steps, reward = _mean_curve(runs, "reward")
        _, wall = _mean_curve(runs, "wall_s")
        axes[0].plot(steps, _smooth(reward), style, color=color, label=variant)
        axes[1].plot(wall, _smooth(reward), style, color=color, label=variant)
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("sampled reward")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{name}: mean over seeds, 10-step moving average", fontsize=9)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    made = [out_dir / f"{name}-reward.png"]
    fig.savefig(made[0], dpi=110)
    plt.close(fig)
    by: dict[str, list[tuple[int, float]]] = {}
    for variant, m in result["metrics"].items():
        hit = re.fullmatch(r"eta=(\d+) (\S+)", variant)
        if hit and "reward_avg" in m:
            by.setdefault(hit.group(2), []).append((int(hit.group(1)), m["reward_avg"]["median"]))
    if by:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for obj, pts in by.items():
            pts.sort()
            ax.plot([str(e) for e, _ in pts], [r for _, r in pts], "o-" if obj != "decoupled" else "s--", label=obj)
        ax.set_xlabel("max staleness (versions)")
        ax.set_ylabel("reward per step (median over seeds)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        made.append(out_dir / f"{name}-summary.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def _save(plt, fig, ax, path: Path) -> Path:
    ax.invert_yaxis()  # variants top to bottom in scenario order
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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


def _gpu_table(title: str, r: dict, path: Path, rows: list[tuple[str, str]]) -> list[str]:
    """A GPU section's heading, conditions line (versions, results file, commands) and table."""
    m = r["machine"]
    return [
        f"## {title}",
        "",
        f"`{r.get('config')}`, vLLM {m.get('vllm')}, torch {m.get('torch')}, Ray {m.get('ray')}, {r.get('when')}; "
        f"results: `{path.as_posix()}`; commands: " + "; ".join(f"`{c}`" for c in r.get("commands", [])),
        "",
        "| what | figure |",
        "|---|---|",
        *(f"| {a} | {b} |" for a, b in rows),
    ]


def gpu2_section(r: dict, path: Path) -> list[str]:
    """The two-GPU measurements (``bench gpu --parts nccl_floor,separate2,colocated2,lend2``)."""
    m, fl, sep, col, lend = (
        r["machine"],
        r.get("nccl_floor", {}),
        r["separate2"],
        r.get("colocated2", {}),
        r.get("lend2", {}),
    )
    sy, gib = sep.get("sync", {}), 2**30

    def idle(x: dict) -> str:
        s = x.get("summary", {})
        return f"trainer idle {s.get('trainer_idle_frac', float('nan')):.0%}, rollout idle {s.get('rollout_idle_frac', float('nan')):.0%}"

    rows = [
        (
            "NCCL broadcast floor, GPU 0 -> GPU 1 (same session)",
            f"{fl.get('floor_s', float('nan')) * 1e3:.2f} ms for {fl.get('nbytes', 0) / gib:.2f} GiB "
            f"({fl.get('broadcast_gbps', 0):.0f} GB/s); with shunter's header + {fl.get('bucket_bytes', 0) >> 20} MiB buckets "
            f"{fl.get('framed_s', float('nan')) * 1e3:.2f} ms",
        ),
        (
            "weight sync over NCCL, PublishWeights -> WeightsLoaded (median, separate 1+1)",
            f"{sy.get('median_end_to_end_s', float('nan')) * 1e3:.0f} ms = {sy.get('ratio_to_nccl_floor', 0):.0f}x the broadcast "
            f"floor: publish {sy.get('median_publish_s', 0) * 1e3:.0f} ms, trainer send {sy.get('median_trainer_send_s', 0) * 1e3:.0f} ms, "
            f"replica receive {sy.get('median_replica_backend_recv_s', 0) * 1e3:.1f} ms + load into vLLM "
            f"{sy.get('median_replica_backend_load_s', 0) * 1e3:.0f} ms, cut requests {sy.get('median_replica_abort_s', 0) * 1e3:.0f} ms",
        ),
        (
            "step time: colocated (sync, a hybrid replica on each GPU) / separate (trainer GPU 0, replica GPU 1)",
            f"{col.get('step_s', float('nan')):.2f} s / {sep.get('step_s', float('nan')):.2f} s = "
            f"**{r.get('ratios', {}).get('separate_speedup_over_colocated', float('nan')):.2f}x** speedup of separate",
        ),
        (
            "step time: lend_when_idle (hybrid beside the trainer on GPU 0 + standalone on GPU 1) / separate",
            f"{lend.get('step_s', float('nan')):.2f} s / {sep.get('step_s', float('nan')):.2f} s = "
            f"{r.get('ratios', {}).get('lend_when_idle_over_separate_step', float('nan')):.2f}",
        ),
        (
            "idle fractions (whole run, from the event log)",
            f"separate: {idle(sep)}; colocated: {idle(col)}; lend_when_idle: {idle(lend)}",
        ),
    ]
    out = _gpu_table(f"two GPUs: 2x {m.get('gpu')} ({m.get('host', '')})", r, path, rows)
    if r.get("not_run"):
        out += ["", f"Not run: {r['not_run']}."]
    return out + [""]


def gpu_sim_section(r: dict, path: Path) -> list[str]:
    """The simulator calibrated on real runs vs those runs (``bench gpu-sim``)."""
    rows = []
    for part, v in r["parts"].items():
        cells = [
            f"{v[k]['measured']:.2f} / {v[k]['predicted']:.2f}"
            if "step" in k
            else f"{v[k]['measured']:.0%} / {v[k]['predicted']:.0%}"
            for k in ("steady_step_s", "trainer_idle_frac", "rollout_idle_frac")
        ]
        rows.append(f"| {part} | " + " | ".join(cells) + " |")
    for name, v in r["step_time_ratios"].items():
        st = v["steady_step_s"]
        rows.append(f"| ratio {name} | {st['measured']:.2f} / {st['predicted']:.2f} | | |")
    cm = r["cost_model"]
    return [
        "## the simulator vs the two-GPU runs",
        "",
        f"Cost model calibrated on the runs' own event logs (decode {cm['decode_step_s_per_seq'] * 1e6:.0f} µs per "
        f"sequence per step over {cm['decode_fit_samples']} samples, train {cm['train_s_per_token'] * 1e6:.0f} µs "
        f"per token, load {cm['load_s'] * 1e3:.0f} ms, sleep / wake {cm['sleep_s'] * 1e3:.0f} / {cm['wake_s'] * 1e3:.0f} ms, "
        f"the runs' {r['lengths']['n']} response lengths), then the simulator runs `{r['config']}` with each part's "
        f"changes. `python -m shunter.bench gpu-sim DIR...`; results: `{path.as_posix()}`.",
        "",
        "| part | steady step s (measured / predicted) | trainer idle | rollout idle |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def live_sync_row(ls: dict) -> tuple[str, str]:
    """The sync measured while the replica generates (``bench gpu --parts live_sync``)."""
    return (
        "weight sync with requests in flight (median; `live_sync`)",
        f"{ls.get('median_end_to_end_s', float('nan')) * 1e3:.1f} ms with "
        f"{ls.get('in_flight_at_load', float('nan')):.0f} sequences in flight as the loads were ordered (a "
        f"{ls.get('decode_step_s', float('nan')) * 1e3:.0f} ms decode step): to the trainer + publish "
        f"{ls.get('median_to_trainer_and_publish_s', 0) * 1e3:.1f} ms, back + policy "
        f"{ls.get('median_back_and_decide_s', 0) * 1e3:.1f} ms, to the replica + load "
        f"{ls.get('median_to_replica_and_load_s', 0) * 1e3:.1f} ms",
    )


def gpu_section(r: dict, path: Path) -> list[str]:
    """The one-GPU measurements (``python -m shunter.bench gpu``), as written by it."""
    m, sy, ro, sw, po = (
        r["machine"],
        r.get("sync", {}),
        r.get("rollout", {}),
        r.get("switch", {}),
        r.get("policies", {}),
    )
    gib = 2**30
    rows = [
        (
            "weight sync, PublishWeights -> WeightsLoaded (median)",
            f"{sy.get('median_end_to_end_s', float('nan')) * 1e3:.0f} ms for {sy.get('nbytes', 0) / gib:.2f} GiB over "
            f"{sy.get('transport')}: publish {sy.get('median_publish_s', 0) * 1e3:.0f} ms, replica load "
            f"{sy.get('median_load_s', 0) * 1e3:.0f} ms, the rest RPC and the coordinator",
        ),
        (
            "where the sync time goes (median)",
            f"to the trainer + publish {sy.get('median_to_trainer_and_publish_s', 0) * 1e3:.0f} ms, back to the "
            f"coordinator + policy {sy.get('median_back_and_decide_s', 0) * 1e3:.0f} ms, to the replica + load "
            f"{sy.get('median_to_replica_and_load_s', 0) * 1e3:.0f} ms (map handles "
            f"{sy.get('median_replica_backend_open_s', 0) * 1e3:.1f}, copy into vLLM's parameters "
            f"{sy.get('median_replica_backend_load_s', 0) * 1e3:.1f}"
            + (
                f", the engine-core round trip around them {sy['median_replica_backend_rpc_s'] * 1e3:.0f}"
                if "median_replica_backend_rpc_s" in sy
                else ""
            )
            + "; the rest: cut requests, RPC)",
        ),
        *(
            [("loads made by the verified copy plan (the rest: the model's loader)", f"{sy['planned_share']:.0%}")]
            if "planned_share" in sy
            else []
        ),
        *(
            [("... of them from a buffer mapped before, plan bound (one fused copy)", f"{sy['mapped_share']:.0%}")]
            if "mapped_share" in sy
            else []
        ),
        *(
            [
                (
                    "the engine step a load waits for (same run)",
                    f"{sy['decode_step_s'] * 1e3:.1f} ms a decode step ({sy['mean_in_flight']:.0f} sequences in flight "
                    f"on average, {sy.get('in_flight_at_load', float('nan')):.0f} as loads were ordered, "
                    f"{sy['decode_tokens_per_s']:,.0f} tok/s): a load lands between steps, so it waits "
                    f"{sy['step_wait_floor_s'] * 1e3:.1f} ms on average at least",
                )
            ]
            if "decode_step_s" in sy
            else []
        ),
        (
            "copy floor (same run)",
            f"{sy.get('floor_s', 0) * 1e3:.2f} ms at {r.get('copy_gbps', 0):,.0f} GB/s "
            f"device-to-device; end to end = {sy.get('ratio_to_floor', 0):.0f}x the floor",
        ),
        *([live_sync_row(r["live_sync"])] if "live_sync" in r else []),
        (
            "rollout efficiency (engine / raw vLLM)",
            f"{ro.get('efficiency') or 0:.0%}: {ro.get('engine', {}).get('tokens_per_s', 0):,.0f} vs "
            f"{ro.get('raw_vllm', {}).get('tokens_per_s', 0):,.0f} tok/s",
        ),
        (
            "rollout core alone (one process, no Ray) / raw vLLM",
            f"{ro['core_alone'].get('tokens_per_s', 0) / ro['raw_vllm']['tokens_per_s']:.0%}"
            if ro.get("core_alone", {}).get("tokens_per_s") and ro.get("raw_vllm", {}).get("tokens_per_s")
            else "not measured",
        ),
        (
            "switch to trainer (sleep level 1)",
            f"{sw.get('to_trainer_s', 0) * 1e3:.0f} ms, {sw.get('to_trainer_memory_freed_bytes', 0) / gib:.1f} GiB freed",
        ),
        (
            "switch to rollout (wake + weight load)",
            f"{sw.get('to_rollout_s', 0) * 1e3:.0f} ms (wake {sw.get('to_rollout_wake_s', 0) * 1e3:.0f} ms, load "
            f"{sw.get('to_rollout_load_s', 0) * 1e3:.0f} ms), {sw.get('to_rollout_memory_taken_bytes', 0) / gib:.1f} GiB taken",
        ),
        ("optimizer offload / onload", f"{sw.get('offload_s', 0) * 1e3:.0f} / {sw.get('onload_s', 0) * 1e3:.0f} ms"),
    ]
    tr = r.get("transports", {})
    if tr.get("cuda_ipc") and tr.get("vllm_ipc"):
        a, b = tr["cuda_ipc"], tr["vllm_ipc"]
        rows.append(
            (
                "IPC weight paths side by side (one engine, one process, no Ray; median)",
                f"shunter's extension (cuda_ipc) {a['total_s'] * 1e3:.0f} ms = publish {a['publish_s'] * 1e3:.0f} + "
                f"load {a['load_s'] * 1e3:.0f} (open {a.get('replica_open_s', 0) * 1e3:.0f}, copy into the model "
                f"{a.get('replica_load_s', 0) * 1e3:.0f}, rest: prefix-cache reset + RPC), {a.get('ratio_to_floor', 0):.0f}x "
                f"the floor; vLLM's weight-transfer engine (vllm_ipc) {b['total_s'] * 1e3:.0f} ms = publish "
                f"{b['publish_s'] * 1e3:.0f} + start {b.get('replica_backend_start_s', 0) * 1e3:.0f} + update "
                f"{b.get('replica_backend_load_s', 0) * 1e3:.0f} + finish {b.get('replica_backend_finish_s', 0) * 1e3:.0f}, "
                f"{b.get('ratio_to_floor', 0):.0f}x",
            )
        )
    if po:
        rows.append(
            (
                "step time, colocated (2 hybrid) / lend_when_idle (1 standalone + 1 hybrid)",
                f"{po.get('colocated_2_hybrid_step_s', po.get('colocated_step_s', 0)):.2f} s / "
                f"{po.get('lend_when_idle_1_standalone_1_hybrid_step_s', po.get('lend_when_idle_step_s', 0)):.2f} s"
                f" = {po.get('ratio_sync_over_lend', 0):.2f}",
            )
        )
    out = _gpu_table(f"one GPU: {m.get('gpu')} ({m.get('gpu_memory_gib')} GiB)", r, path, rows)
    if po.get("note"):
        out += ["", f"Note: {po['note']}."]
    if sy.get("copy_path_note"):
        out += ["", f"Copy path: {sy['copy_path_note']}."]
    if ro.get("method"):
        out += ["", f"Rollout method: {ro['method']}."]
    if ro.get("window_note"):
        out += ["", f"Rollout window: {ro['window_note']}."]
    for when, sess in r.get("sessions", {}).items():
        out += ["", f"Session {when} ({sess.get('what')}): {sess.get('config_note')}."]
    if r.get("config_note"):
        out += ["", f"Conditions: {r['config_note']}."]
    return out + [""]
