"""GPU measurements on one device (issue 5), each part in one run, saved as one JSON with
the machine's details:

- ``sync``: weight sync — ``PublishWeights`` -> last ``WeightsLoaded`` per version, split
  into publish (trainer side) and load (replica side), next to the copy floor measured in
  the same run (the published bytes at this GPU's device-to-device copy bandwidth);
  ``sync_<transport>`` (e.g. ``sync_vllm_ipc``) the same with that ``trainer.weight_transport``;
- ``rollout``: rollout tokens/s inside the engine vs raw vLLM (``LLM.generate``) on the
  same model, prompts and sampling;
- ``switch``: a hybrid replica's switch cost both ways (sleep, wake, weight load, memory
  freed / taken) and the trainer's offload / onload;
- ``policies``: step time of ``colocated`` vs ``lend_when_idle`` on one GPU;
- ``transports``: the two IPC weight paths side by side on one engine, in one process —
  shunter's worker extension (``cuda_ipc``) and vLLM's own weight-transfer engine
  (``vllm_ipc``) — publish and load split into their parts, without Ray or the coordinator;
- ``rpc``: the round trip of vLLM's engine-core calls a load makes, around no work, idle,
  decoding, and with another process's kernels on the GPU (``bench/gpu/engine_rpc.py``);
- ``relay_sync``, ``fanout``: weights straight from the trainer to the replicas (directly, through
  the host's relay, and through the coordinator for comparison), with requests in flight; 1, 2
  and 4 replicas on the device (``bench/gpu/weights_direct.py``).

The trainer alone (issue 47): ``trainer_ranks`` — today's one-process trainer, FSDP2 on one rank
and FSDP2 on 2, 4 ... ranks up to the GPUs here (``trainer.world_size`` at most): step time and
peak memory per rank on one fixed batch of the config's shape (``bench/gpu/trainer_ranks.py``;
runs on CPU too, with a coarse memory figure).

Across two GPUs of one host (issue 7; a config with ``weight_transport = "nccl"``, e.g.
``examples/gpu2_qwen05b.toml``):

- ``nccl_floor``: the published bytes broadcast GPU 0 -> GPU 1 by two processes over the
  weight group (``engine.weights.group``), nothing loaded: one raw broadcast of the whole
  buffer (the floor) and shunter's header + buckets;
- ``separate2``: trainer on GPU 0, a standalone replica on GPU 1: weight sync over NCCL vs
  that floor (``nccl_floor`` first), step time, idle fractions;
- ``colocated2``: the synchronous baseline on the same two GPUs (``trainer.gpus = 2``: a
  hybrid replica on each, the trainer on GPU 0): step time, idle fractions;
- ``lend2``: ``lend_when_idle`` — a hybrid replica beside the trainer on GPU 0, a standalone
  one on GPU 1: step time, idle fractions.

Each run's event log is kept beside the JSON (``events_<part>.bin.gz``) for the simulator
comparison (``python -m shunter.bench gpu-sim``).

    python -m shunter.bench gpu --config examples/gpu_qwen05b.toml --out bench/results/gpu_h200.json

The parts live beside this module: ``bench/gpu/runs.py`` (the
machine, the copy floor, one engine run), ``bench/gpu/figures.py`` (figures from a run's events),
``bench/gpu/children.py`` (measurements in a child process) and ``bench/gpu/two_gpus.py`` (the
two-GPU parts); this module keeps the list of parts, ``measure`` and the entry point.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from shunter.bench.gpu.children import (
    core_alone,
    core_child,
    in_child,
    raw_child,
    raw_vllm,
    transports_child,
)
from shunter.bench.gpu.figures import (
    how_ended,
    rollout_tokens_per_s,
    step_time,
    switch_figures,
    sync_figures,
)
from shunter.bench.gpu.runs import copy_floor_gbps, machine, published_nbytes, run
from shunter.bench.gpu.two_gpus import nccl_floor, two_gpu_run
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.load import load_config, merge

PARTS = (
    "sync",
    "live_sync",
    "live_sync_abort",
    "rollout",
    "switch",
    "policies",
    "transports",
    "rpc",
    "nccl_floor",
    "separate2",
    "colocated2",
    "lend2",
    "relay_sync",
    "fanout",
    "trainer_ranks",
)


def measure(config: str, parts: tuple[str, ...], out: Path) -> dict:
    bad = [x for x in parts if x not in PARTS and not x.startswith("sync_")]
    if bad:
        raise SystemExit(f"unknown part(s) {bad}; known: {', '.join(PARTS)}, sync_<weight transport>")
    base = load_config(config)
    res: dict = {"machine": machine(), "config": config, "when": time.strftime("%Y-%m-%d %H:%M:%S")}

    def cfg(over: dict) -> EngineConfig:
        import msgspec

        from shunter.engine.config.load import from_dict

        return from_dict(merge(json.loads(json.dumps(msgspec.to_builtins(base))), over))

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1, default=str))

    import torch

    floor = copy_floor_gbps() if torch.cuda.is_available() else float("nan")  # the rollout part also runs on CPU
    res["copy_gbps"] = floor
    m = base.model
    if m.build_tiny:  # parts that start vLLM outside an engine run need the model built
        from shunter.engine.models.tiny import build_tiny_model

        build_tiny_model(m.path, m.build_tiny, seed=base.run.seed, sft_steps=m.sft_steps, preset=m.preset)
    for part in parts:
        t0 = time.perf_counter()
        try:
            if part in ("sync", "live_sync") or part.startswith("sync_"):
                # sync_<transport>: that weight transport; live_sync: staleness 8, so the replica
                # is still generating as each load lands (its requests cut and resumed: vLLM 0.26
                # cannot pause them with their KV cache)
                over: dict = {"run": {"policy": "separate"}}
                if part.startswith("sync_"):
                    over["trainer"] = {"weight_transport": part.removeprefix("sync_")}
                if part == "live_sync":
                    over["rollout"] = {"max_staleness": 8}
                events, run_dir = run(cfg(over))
                res[part] = sync_figures(run_dir / "events.bin", floor)
                res[part]["ended"] = how_ended(events)
            elif part in ("relay_sync", "fanout"):
                from shunter.bench.gpu.weights_direct import fanout, relay_sync

                res[part] = (relay_sync if part == "relay_sync" else fanout)(cfg, run, sync_figures, floor, how_ended)
            elif part == "rollout":
                r = base.rollout
                # The same closed batch for all three, each timed from its first request to its
                # last token on an engine that was just started (no side warms up with requests
                # the others do not make): as many groups as the staleness gate lets start
                # without training, all of them in flight at once as the raw baseline submits
                # them, no held-out validation sharing the replica.
                # SHUNTER_ROLLOUT_GROUPS: a smaller batch for a shorter call (three engine starts
                # and three passes over the batch: ~5 min for 128 groups of 8 x 1024 tokens on an H200)
                groups = (
                    int(os.environ.get("SHUNTER_ROLLOUT_GROUPS", 0))
                    or 4 * base.groups_per_mini_batch * base.trainer.parameter_sync_step
                )
                samples = groups * r.n_samples_per_prompt
                over = {
                    "run": {"trainer_driver": "user", "policy": "separate"},
                    "validation": {"every": 0},
                    "rollout": {
                        "standalone_replicas": 1,
                        "hybrid_replicas": 0,
                        "max_staleness": 3,
                        "length_dist": "",  # fixed lengths: the raw baseline cannot draw ours
                        "max_in_flight_per_replica": max(r.max_in_flight_per_replica, samples),
                    },
                }
                events, _ = run(
                    cfg(over), user_rollout_s=float(os.environ.get("SHUNTER_ROLLOUT_S", "300")), user_samples=samples
                )
                eng = rollout_tokens_per_s(events)
                from transformers import AutoTokenizer

                from shunter.actors.vllm.engine import EngineSpec
                from shunter.engine.tasks.base import load_task

                tok = AutoTokenizer.from_pretrained(base.model.path)
                task = load_task(base.task.name)
                it = task.train_prompts(base.run.seed)
                prompts = [tok.encode(next(it).text, add_special_tokens=False) for _ in range(groups)]
                # the engine's replicas run vLLM with EngineSpec's max_num_seqs unless engine_args say otherwise
                seqs = dict(r.engine_args).get("max_num_seqs", EngineSpec.__dataclass_fields__["max_num_seqs"].default)
                raw = raw_vllm(
                    base.model.path,
                    prompts,
                    r.n_samples_per_prompt,
                    r.max_tokens,
                    r.temperature,
                    r.max_model_len,
                    r.gpu_memory_utilization,
                    {"max_num_seqs": seqs, **r.engine_args},
                    r.ignore_eos,
                )
                core = core_alone(
                    {
                        "model_dir": base.model.path,
                        "prompts": prompts,
                        "n": r.n_samples_per_prompt,
                        "max_tokens": r.max_tokens,
                        "temperature": r.temperature,
                        "max_model_len": r.max_model_len,
                        "gpu_memory_utilization": r.gpu_memory_utilization,
                        "engine_args": dict(r.engine_args),
                        "ignore_eos": r.ignore_eos,
                        "stream_interval": r.stream_interval,
                    }
                )
                res["rollout"] = {
                    "engine": eng,
                    "raw_vllm": raw,
                    "core_alone": core,
                    "efficiency": eng.get("tokens_per_s", 0) / raw["tokens_per_s"] if raw.get("tokens_per_s") else None,
                }
            elif part == "switch":
                events, _ = run(
                    cfg({"run": {"policy": "colocated"}, "rollout": {"standalone_replicas": 0, "hybrid_replicas": 1}})
                )
                res["switch"] = {**switch_figures(events), "step_s": step_time(events), "ended": how_ended(events)}
            elif part == "transports":
                r = base.rollout
                tr = in_child(
                    "--transports",
                    {
                        "model_dir": base.model.path,
                        "max_model_len": r.max_model_len,
                        "gpu_memory_utilization": r.gpu_memory_utilization,
                        "engine_args": dict(r.engine_args),
                    },
                )
                if "error" not in tr and not math.isnan(floor):
                    tr["floor_s"] = tr["nbytes"] / (floor * 1e9 / 2)
                    for wire in ("cuda_ipc", "vllm_ipc"):
                        tr[wire]["ratio_to_floor"] = tr[wire]["total_s"] / tr["floor_s"]
                res["transports"] = tr
            elif part == "rpc":  # bench/gpu/engine_rpc.py: the engine-core round trip a load waits for
                r = base.rollout
                res["rpc"] = in_child(
                    "--rpc",
                    {
                        "model_dir": base.model.path,
                        "max_model_len": r.max_model_len,
                        "gpu_memory_utilization": r.gpu_memory_utilization,
                        "engine_args": dict(r.engine_args),
                    },
                )
            elif part == "trainer_ranks":  # bench/gpu/trainer_ranks.py: the trainer alone, plain and FSDP2 by ranks
                from shunter.bench.gpu.trainer_ranks import trainer_ranks

                res[part] = trainer_ranks(base)
            elif part == "nccl_floor":
                res["nccl_floor"] = nccl_floor(published_nbytes(base), int(base.trainer.weight_bucket_mb * (1 << 20)))
            elif part in ("separate2", "colocated2", "lend2"):
                res[part] = two_gpu_run(part, cfg, out, res.get("nccl_floor", {}).get("floor_s"), floor)
            elif part == "policies":
                col, _ = run(
                    cfg({"run": {"policy": "colocated"}, "rollout": {"standalone_replicas": 0, "hybrid_replicas": 2}})
                )
                lend, _ = run(
                    cfg(
                        {
                            "run": {"policy": "lend_when_idle"},
                            "rollout": {"standalone_replicas": 1, "hybrid_replicas": 1},
                        }
                    )
                )
                a, b = step_time(col), step_time(lend)
                res["policies"] = {
                    "colocated_step_s": a,
                    "lend_when_idle_step_s": b,
                    "ratio_sync_over_lend": a / b,
                    "colocated_ended": how_ended(col),
                    "lend_ended": how_ended(lend),
                }
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others
            import traceback

            res[part] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        res.setdefault(part, {})["part_s"] = time.perf_counter() - t0
        save()
    return res


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m shunter.bench gpu", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="examples/gpu_qwen05b.toml")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--out", default="bench/results/gpu.json")
    p.add_argument("--raw", help=argparse.SUPPRESS)
    p.add_argument("--core", help=argparse.SUPPRESS)
    p.add_argument("--transports", help=argparse.SUPPRESS)
    p.add_argument("--rpc", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rpc:
        from shunter.bench.gpu.engine_rpc import rpc_child

        print(json.dumps(rpc_child(json.loads(a.rpc))))
        return 0
    if a.transports:
        print(json.dumps(transports_child(json.loads(a.transports))))
        return 0
    if a.raw:
        print(json.dumps(raw_child(json.loads(a.raw))))
        return 0
    if a.core:
        print(json.dumps(core_child(json.loads(a.core))))
        return 0
    res = measure(a.config, tuple(x for x in a.parts.split(",") if x), Path(a.out))
    print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
