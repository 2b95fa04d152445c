"""The GPU bench's parts across two GPUs of one host (``python -m shunter.bench gpu``,
``bench/gpu/measure.py``; issue 7): the NCCL broadcast floor (``nccl_floor``) and one run of the
two-GPU comparison (``separate2``, ``colocated2``, ``lend2``), its event log kept beside the JSON.

Invariant: every two-GPU part is the base config plus ``two_gpu_overrides(part)`` only, the same
changes the simulator comparison (``bench/gpu/sim_vs_real.py``) applies, so measurement and prediction
run the same config.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from shunter.bench.gpu.figures import how_ended, step_time, sync_figures
from shunter.bench.gpu.runs import run
from shunter.events import read_log


def nccl_floor(nbytes: int, bucket_bytes: int, reps: int = 10) -> dict:
    """Two processes on GPUs 0 and 1 broadcast ``nbytes`` over a weight group (no load)."""
    import torch.multiprocessing as mp

    from shunter.engine.weights.group import listen_socket

    sock, port = listen_socket()
    sock.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_nccl_floor_child, args=(rank, port, nbytes, bucket_bytes, reps, q)) for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        out = q.get(timeout=300)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    if "error" not in out:
        out["floor_s"] = out["raw_broadcast_s"]
        out["broadcast_gbps"] = nbytes / out["raw_broadcast_s"] / 1e9
    return out


def _nccl_floor_child(rank: int, port: int, nbytes: int, bucket_bytes: int, reps: int, q) -> None:
    import torch

    from shunter.actors.vllm import nccl as vllm_nccl
    from shunter.engine.weights.group import make_group, recv_flat, send_flat

    vllm_nccl.register()

    try:
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        g = make_group("nccl", "127.0.0.1", port, rank, 2, 120.0, device=dev)
        flat = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev)
        raw, framed = [], []
        for i in range(reps + 3):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            g.broadcast([flat.view(torch.uint8)], 0, time.monotonic() + 60)
            t1 = time.perf_counter()
            if rank == 0:
                send_flat(g, flat, i, bucket_bytes=bucket_bytes, timeout_s=60)
            else:
                recv_flat(g, flat, i, timeout_s=60)
            t2 = time.perf_counter()
            if i >= 3:
                raw.append(t1 - t0)
                framed.append(t2 - t1)
        g.close()
        if rank == 0:
            q.put(
                {
                    "nbytes": nbytes,
                    "bucket_bytes": bucket_bytes,
                    "reps": reps,
                    "raw_broadcast_s": statistics.median(raw),
                    "framed_s": statistics.median(framed),
                    "raw_all_s": raw,
                }
            )
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        if rank == 0:
            q.put({"error": f"{type(e).__name__}: {e}"})


def two_gpu_overrides(part: str) -> dict:
    """The config changes of one two-GPU part (over e.g. ``examples/gpu2_qwen05b.toml``)."""
    return {
        "separate2": {"run": {"policy": "separate"}, "rollout": {"standalone_replicas": 1, "hybrid_replicas": 0}},
        "colocated2": {
            "run": {"policy": "colocated"},
            "trainer": {"gpus": 2},
            "rollout": {"standalone_replicas": 0, "hybrid_replicas": 2, "max_staleness": 0},
        },
        "lend2": {"run": {"policy": "lend_when_idle"}, "rollout": {"standalone_replicas": 1, "hybrid_replicas": 1}},
    }[part]


def two_gpu_run(part: str, cfg, out: Path, nccl_floor_s: float | None, copy_gbps: float) -> dict:
    """One run of the two-GPU comparison (see the module docstring); keeps its event log."""
    import gzip
    import shutil

    from shunter.bench.analysis.summary import summarize

    events, run_dir = run(cfg(two_gpu_overrides(part)))
    log = run_dir / "events.bin"
    with open(log, "rb") as src, gzip.open(out.parent / f"events_{part}.bin.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    res = {"step_s": step_time(events), "ended": how_ended(events), "summary": summarize(read_log(log))}
    from shunter.events import ComponentPlaced

    res["placed"] = {
        e.component: {"bundle": e.bundle, "gpu_ids": e.gpu_ids} for e in events if isinstance(e, ComponentPlaced)
    }
    if part == "separate2":
        res["sync"] = sync_figures(log, copy_gbps, floor_s=nccl_floor_s)
    return res
