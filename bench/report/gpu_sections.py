"""The bench report's GPU sections (``bench/report/markdown.py``): the one-GPU measurements
(``python -m shunter.bench gpu``), the two-GPU ones and the simulator's comparison with them
(``python -m shunter.bench gpu-sim``), each a Markdown table.

Invariant: a section shows only what its result JSON holds and names the config, the versions,
the results file and the commands it came from.
"""

from __future__ import annotations

from pathlib import Path


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
