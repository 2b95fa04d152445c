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
  decoding, and with another process's kernels on the GPU (``bench/gpu_rpc.py``);
- ``relay_sync``, ``fanout``: weights straight from the trainer to the replicas (directly, through
  the host's relay, and through the coordinator for comparison), with requests in flight; 1, 2
  and 4 replicas on the device (``bench/gpu_relay.py``).

Across two GPUs of one host (issue 7; a config with ``weight_transport = "nccl"``, e.g.
``examples/gpu2_qwen05b.toml``):

- ``nccl_floor``: the published bytes broadcast GPU 0 -> GPU 1 by two processes over the
  weight group (``engine.weight_group``), nothing loaded: one raw broadcast of the whole
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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shunter.engine.config import EngineConfig, load_config, merge
from shunter.events import (
    LoadWeights,
    ModeChanged,
    Offloaded,
    Onloaded,
    PublishWeights,
    RunEnded,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepEnd,
    WeightsLoaded,
    WeightsReady,
    WeightsSent,
    read_log,
)

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
)


def machine() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "host_cpus": os.cpu_count()}
    for mod in ("vllm", "ray", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable: {e}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return out


def copy_floor_gbps(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) on this GPU."""
    import torch

    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        b.copy_(a)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / repeats
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / dt / 1e9


async def _run(cfg: EngineConfig, *, user_rollout_s: float = 0.0, user_samples: int = 0) -> tuple[list, Path]:
    """One engine run; with ``user_rollout_s`` the trainer never runs (user driver): the
    replicas fill the buffer up to the staleness gate and the run is stopped once
    ``user_samples`` samples have ended, or after ``user_rollout_s`` at the latest."""
    from shunter import Engine

    events = []
    async with Engine(cfg) as engine:
        if user_rollout_s:
            enough = asyncio.Event()

            async def collect():
                ended = 0
                async for ev in engine.events():
                    events.append(ev)
                    ended += isinstance(ev, SampleEnd)
                    if user_samples and ended >= user_samples:
                        enough.set()

            task = asyncio.create_task(collect())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(enough.wait(), user_rollout_s)
            await engine.stop("measured")
            await task
        else:
            async for ev in engine.events():
                events.append(ev)
        out = engine.out_dir
    return events, out


def run(cfg: EngineConfig, **kw) -> tuple[list, Path]:
    _wait_for_free_gpu()
    return asyncio.run(_run(cfg, **kw))


def _wait_for_free_gpu(timeout_s: float = 120.0, used_below: float = 0.05) -> None:
    """A run's killed actors give their GPU memory back some seconds after the run ends;
    starting the next run before that makes its vLLM engines fail their memory check."""
    import torch

    if not torch.cuda.is_available():
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = [1 - free / total for free, total in map(torch.cuda.mem_get_info, range(torch.cuda.device_count()))]
        if max(used) < used_below:
            return
        time.sleep(2.0)


def sync_figures(log: Path, floor_gbps: float, floor_s: float | None = None) -> dict:
    """Weight sync per publish from a run's event log, next to the floor: the published bytes
    at the device copy bandwidth, or ``floor_s`` (the NCCL broadcast floor across GPUs)."""
    msgs = list(read_log(log))
    rows = []
    for i, m in enumerate(msgs):
        if not isinstance(m, PublishWeights):
            continue
        ready = next((x for x in msgs[i:] if isinstance(x, WeightsReady)), None)
        if ready is None:
            continue
        loads = [x for x in msgs[i:] if isinstance(x, WeightsLoaded) and x.version == ready.version]
        if not loads:
            continue
        last = max(loads, key=lambda x: x.wall_time)
        cmd = next((x for x in msgs[i:] if isinstance(x, LoadWeights)), None)
        row = {
            "version": ready.version,
            "nbytes": ready.nbytes,
            "transport": ready.transport,
            "publish_s": ready.duration_s,
            "load_s": max(x.duration_s for x in loads),
            "end_to_end_s": last.wall_time - m.wall_time,
            # hops, from the stamps: to the trainer and its publish; back to the coordinator and
            # its policy; to the replica, which cuts its requests in flight and loads
            "to_trainer_and_publish_s": ready.wall_time - m.wall_time,
            # after the publish: on the direct path the trainer -> relay -> replica hops and the load
            "ready_to_loaded_s": last.wall_time - ready.wall_time,
            "replicas_loaded": float(len(loads)),
        }
        if cmd is not None:
            row["load_at"] = cmd.wall_time
            row["back_and_decide_s"] = cmd.wall_time - ready.wall_time
            row["to_replica_and_load_s"] = last.wall_time - cmd.wall_time
        for k in (
            "abort_s",
            "load_s",
            "backend_open_s",
            "backend_load_s",
            "backend_decode_s",
            "backend_recv_s",
            "backend_planned",
            "backend_mapped",
            "backend_rpc_s",
            "backend_reset_s",
            "backend_salted",
        ):
            if k in last.detail:
                row[f"replica_{k}"] = last.detail[k]
        row.update({f"trainer_{k}": float(v) for k, v in ready.detail.items()})  # the publish's parts
        if "arrived_at" in last.detail:  # the hops trainer -> (relay ->) replica, stamp to stamp
            row["to_replica_s"] = last.detail["arrived_at"] - ready.wall_time
        sent = [x for x in msgs[i:] if isinstance(x, WeightsSent) and x.version == ready.version]
        if sent:
            row["trainer_send_s"] = max(x.duration_s for x in sent)
        rows.append(row)
    if not rows:
        return {"error": "no publish reached a replica"}
    steady = rows[1:] or rows  # the first one pays one-time costs (IPC mapping, allocator)
    nbytes = rows[0]["nbytes"]
    if floor_s is None:
        floor_s = nbytes / (floor_gbps * 1e9 / 2)  # read + write
    keys = [k for k in steady[0] if k.endswith("_s") and all(k in r for r in steady)]
    med = {k: statistics.median(r[k] for r in steady) for k in keys}
    planned = [r["replica_backend_planned"] for r in steady if "replica_backend_planned" in r]
    mapped = [r["replica_backend_mapped"] for r in steady if "replica_backend_mapped" in r]
    return {
        **decode_steps(msgs, [r["load_at"] for r in steady if "load_at" in r]),
        **({"planned_share": sum(planned) / len(planned)} if planned else {}),  # loads by the copy plan
        **({"mapped_share": sum(mapped) / len(mapped)} if mapped else {}),  # ... from a buffer mapped before
        "transport": rows[0]["transport"],
        "nbytes": nbytes,
        "copy_gbps": floor_gbps,
        "floor_s": floor_s,
        **{f"median_{k}": v for k, v in med.items()},
        "ratio_to_floor": med["end_to_end_s"] / floor_s,
        "first": rows[0],
        "n": len(rows),
    }


def decode_steps(msgs: list, load_times: list[float]) -> dict:
    """The engine step a weight load must wait for, from the run's own samples: a load lands
    between two engine steps, so a publish at a random moment waits the rest of the step under
    way — half a step on average, at least. With continuous batching every running sequence
    gains one token a step, so the mean step is (sequences in flight, time-averaged) / (tokens
    per second), both over the run's generation window (a prefill chunk makes a step longer:
    this is a lower estimate). ``in_flight_at_load``: sequences generating as each load was
    ordered (median over the steady publishes)."""
    marks = sorted(
        (m.wall_time, 1 if isinstance(m, SampleBegin | SampleResumed) else -1)
        for m in msgs
        if isinstance(m, SampleBegin | SampleResumed | SampleEnd | SampleAborted)
    )
    tokens = sum(len(m.sample.token_ids) for m in msgs if isinstance(m, SampleEnd))
    if len(marks) < 2 or tokens == 0:
        return {}
    area, n, prev, at_load, loads = 0.0, 0, marks[0][0], [], sorted(load_times)
    for t, d in marks:
        while loads and loads[0] < t:
            at_load.append(n)
            loads.pop(0)
        area += n * (t - prev)
        n, prev = n + d, t
    window = marks[-1][0] - marks[0][0]
    if window <= 0:
        return {}
    step = (area / window) / (tokens / window)
    out = {"mean_in_flight": area / window, "decode_tokens_per_s": tokens / window, "decode_step_s": step}
    out["step_wait_floor_s"] = step / 2
    if at_load:
        out["in_flight_at_load"] = float(statistics.median(at_load))
    return out


def rollout_tokens_per_s(events: list) -> dict:
    """Tokens/s over all samples of the run, from the first begin to the last end."""
    begins = [e.wall_time for e in events if isinstance(e, SampleBegin)]
    ends = [e for e in events if isinstance(e, SampleEnd)]
    if not begins or not ends:
        return {"error": "no samples"}
    tokens = sum(len(e.sample.token_ids) for e in ends)
    window = max(e.wall_time for e in ends) - min(begins)
    return {"samples": len(ends), "tokens": tokens, "window_s": window, "tokens_per_s": tokens / window}


def raw_vllm(
    model_dir: str,
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    temperature: float,
    max_model_len: int,
    gpu_memory_utilization: float,
    engine_args: dict,
    ignore_eos: bool = False,
) -> dict:
    """Raw vLLM offline generation of the same requests, in a child process."""
    return _in_child(
        "--raw",
        {
            "model_dir": model_dir,
            "prompts": prompts,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization,
            "engine_args": engine_args,
            "ignore_eos": ignore_eos,
        },
    )


def _in_child(flag: str, spec: dict) -> dict:
    """Run one measurement in a fresh process (its GPU memory is freed when it exits); its
    last JSON line is the result, else the error it printed."""
    out = subprocess.run(
        [sys.executable, "-m", "shunter.bench.gpu", flag, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode or not line:
        return {"error": (out.stderr or out.stdout)[-2000:]}
    return json.loads(line[-1])


def child_backend(spec: dict, **over: Any) -> Any:
    """The ``VLLMBackend`` a measurement child starts, from the spec its parent sent (the
    config's model, context and memory share, engine args; ``over``: fields to change)."""
    from shunter.actors.vllm_backend import EngineSpec, VLLMBackend

    kw: dict = {
        "model_dir": spec["model_dir"],
        "max_model_len": spec["max_model_len"],
        "gpu_memory_utilization": spec["gpu_memory_utilization"],
        "extra": spec["engine_args"],
        **over,
    }
    return VLLMBackend(EngineSpec(**kw))


def core_alone(spec: dict) -> dict:
    """The replica's rollout core (``RolloutCore`` + ``VLLMBackend``) alone in one process, no
    Ray and no coordinator, on the same requests as the raw baseline: tells whether a gap to
    raw vLLM is in the core or between coordinator and replica."""
    return _in_child("--core", spec)


def _core_child(spec: dict) -> dict:
    from transformers import AutoTokenizer

    from shunter.actors.rollout import _Tok
    from shunter.engine.rollout import RolloutCore
    from shunter.events import Generate, PromptSpec, SampleEnd, SamplingSpec, Stamper

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    async def go() -> dict:
        be = child_backend(spec, stream_interval=spec.get("stream_interval", 16))
        await be.start()
        core = RolloutCore(
            "core", be, _Tok(AutoTokenizer.from_pretrained(spec["model_dir"])), lambda *a: 0.0, Stamper("bench", "core")
        )
        sp = SamplingSpec(
            max_tokens=spec["max_tokens"], temperature=spec["temperature"], ignore_eos=spec.get("ignore_eos", False)
        )

        def gen(i: int, ids: list[int]) -> Generate:
            # the prompt goes in as token ids through a resume of empty samples (no re-tokenising)
            from shunter.events import Sample

            return Generate(
                group_id=i,
                prompt=PromptSpec(prompt_id=i, text=""),
                n=0,
                sampling=sp,
                resume=[
                    Sample(
                        sample_id=f"{i}.{k}",
                        group_id=i,
                        prompt_id=i,
                        prompt_token_ids=ids,
                        max_tokens=spec["max_tokens"],
                    )
                    for k in range(spec["n"])
                ],
            )

        t0 = time.perf_counter()
        outs = await asyncio.gather(*(core.generate(gen(i, p)) for i, p in enumerate(spec["prompts"])))
        dt = time.perf_counter() - t0
        ends = [e for evs in outs for e in evs if isinstance(e, SampleEnd)]
        tokens = sum(len(e.sample.token_ids) for e in ends)
        await be.shutdown()
        return {"samples": len(ends), "tokens": tokens, "window_s": dt, "tokens_per_s": tokens / dt}

    return asyncio.run(go())


def _transports_child(spec: dict) -> dict:
    """Publish from a real ``Trainer`` (fp32 master weights -> flat bf16 buffer -> IPC
    handles) and load into one vLLM engine that has both paths; alternate the paths."""
    import torch

    from shunter.engine import weight_transport as wt
    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer import Trainer

    # the handles must be opened by another process: vLLM's engine core runs in its own
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    # the trainer keeps no publisher of its own ("safetensors"); this one serves both wire formats
    t = Trainer(TrainerConfig(weight_transport="safetensors"), spec["model_dir"])
    t.setup()
    pub = wt.CudaIpcPublisher()

    async def go() -> dict:
        be = child_backend(spec, weight_transfer="ipc", extra={**spec["engine_args"], "dtype": "bfloat16"})
        await be.start()
        rows: dict[str, list[dict]] = {wt.CUDA_IPC: [], wt.VLLM_IPC: []}
        for _ in range(spec.get("rounds", 8)):
            for wire in rows:
                with torch.no_grad():
                    for p_ in t.model.parameters():
                        p_.mul_(1.0 + 1e-3)  # new weights every time
                t0 = time.perf_counter()
                items = wt.unique_tensors(t.model.state_dict())
                payload = pub.publish(items, torch.bfloat16, wire=wire)
                t1 = time.perf_counter()
                await be.load_weights(payload)
                t2 = time.perf_counter()
                rows[wire].append(
                    {
                        "publish_s": t1 - t0,
                        "load_s": t2 - t1,
                        "total_s": t2 - t0,
                        **{f"replica_{k}": v for k, v in be.last_load.items() if isinstance(v, float)},
                    }
                )
        await be.shutdown()
        out = {"nbytes": sum(x.numel() for _, x in items) * torch.bfloat16.itemsize}
        for wire, rs in rows.items():
            steady = rs[1:]
            out[wire] = {k: statistics.median(r[k] for r in steady) for k in steady[0]}
            out[wire]["first"] = rs[0]
        return out

    return asyncio.run(go())


def _raw_child(spec: dict) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=spec["model_dir"],
        max_model_len=spec["max_model_len"],
        seed=0,
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        **spec["engine_args"],
    )
    sp = SamplingParams(
        n=1,
        max_tokens=spec["max_tokens"],
        temperature=spec["temperature"],
        logprobs=0,
        detokenize=False,
        ignore_eos=spec.get("ignore_eos", False),
    )
    reqs = [{"prompt_token_ids": p} for p in spec["prompts"] for _ in range(spec["n"])]
    t0 = time.perf_counter()
    outs = llm.generate(reqs, sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"samples": len(outs), "tokens": tokens, "window_s": dt, "tokens_per_s": tokens / dt}


def switch_figures(events: list) -> dict:
    out: dict = {}
    for mode in ("trainer", "rollout"):
        ch = [e for e in events if isinstance(e, ModeChanged) and e.mode == mode][1:] or [
            e for e in events if isinstance(e, ModeChanged) and e.mode == mode
        ]
        if ch:
            out[f"to_{mode}_s"] = statistics.median(e.duration_s for e in ch)
            for k in ch[0].detail:
                out[f"to_{mode}_{k}"] = statistics.median(e.detail.get(k, 0.0) for e in ch)
    for cls, name in ((Offloaded, "offload"), (Onloaded, "onload")):
        xs = [e for e in events if isinstance(e, cls)]
        if xs:
            out[f"{name}_s"] = statistics.median(e.duration_s for e in xs)
            out[f"{name}_bytes"] = max(e.nbytes for e in xs)
    return out


def step_time(events: list, warmup: int = 2) -> float:
    """The run's pace once started: mean gap between optimizer steps past the first
    ``warmup`` steps. A mean, not a median: under a staleness bound or a lending policy steps
    often come in a rhythm of short and long gaps, and the median would report the short one."""
    ends = [e.wall_time for e in events if isinstance(e, StepEnd)][warmup:]
    return (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else float("nan")


def measure(config: str, parts: tuple[str, ...], out: Path) -> dict:
    bad = [x for x in parts if x not in PARTS and not x.startswith("sync_")]
    if bad:
        raise SystemExit(f"unknown part(s) {bad}; known: {', '.join(PARTS)}, sync_<weight transport>")
    base = load_config(config)
    res: dict = {"machine": machine(), "config": config, "when": time.strftime("%Y-%m-%d %H:%M:%S")}

    def cfg(over: dict) -> EngineConfig:
        from shunter.engine.config import from_dict

        return from_dict(merge(json.loads(json.dumps(_plain(base))), over))

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1, default=str))

    import torch

    floor = copy_floor_gbps() if torch.cuda.is_available() else float("nan")  # the rollout part also runs on CPU
    res["copy_gbps"] = floor
    m = base.model
    if m.build_tiny:  # parts that start vLLM outside an engine run need the model built
        from shunter.engine.tiny_model import build_tiny_model

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
                res[part]["ended"] = _ended(events)
            elif part in ("relay_sync", "fanout"):
                from shunter.bench.gpu_relay import fanout, relay_sync

                res[part] = (relay_sync if part == "relay_sync" else fanout)(cfg, run, sync_figures, floor, _ended)
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

                from shunter.actors.vllm_backend import EngineSpec
                from shunter.engine.tasks import load_task

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
                res["switch"] = {**switch_figures(events), "step_s": step_time(events), "ended": _ended(events)}
            elif part == "transports":
                r = base.rollout
                tr = _in_child(
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
            elif part == "rpc":  # bench/gpu_rpc.py: the engine-core round trip a load waits for
                r = base.rollout
                res["rpc"] = _in_child(
                    "--rpc",
                    {
                        "model_dir": base.model.path,
                        "max_model_len": r.max_model_len,
                        "gpu_memory_utilization": r.gpu_memory_utilization,
                        "engine_args": dict(r.engine_args),
                    },
                )
            elif part == "nccl_floor":
                res["nccl_floor"] = nccl_floor(_published_nbytes(base), int(base.trainer.weight_bucket_mb * (1 << 20)))
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
                    "colocated_ended": _ended(col),
                    "lend_ended": _ended(lend),
                }
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others
            import traceback

            res[part] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
        res.setdefault(part, {})["part_s"] = time.perf_counter() - t0
        save()
    return res


def _published_nbytes(cfg: EngineConfig) -> int:
    """Bytes one publish moves for the config's model (bf16, tied tensors once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.model.path))
    return 2 * sum(p.numel() for p in model.parameters())  # parameters() lists a tied tensor once


def nccl_floor(nbytes: int, bucket_bytes: int, reps: int = 10) -> dict:
    """Two processes on GPUs 0 and 1 broadcast ``nbytes`` over a weight group (no load)."""
    import torch.multiprocessing as mp

    from shunter.engine.weight_group import listen_socket

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

    from shunter.actors import vllm_nccl
    from shunter.engine.weight_group import make_group, recv_flat, send_flat

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

    from shunter.bench.analysis import summarize

    events, run_dir = run(cfg(two_gpu_overrides(part)))
    log = run_dir / "events.bin"
    with open(log, "rb") as src, gzip.open(out.parent / f"events_{part}.bin.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    res = {"step_s": step_time(events), "ended": _ended(events), "summary": summarize(read_log(log))}
    from shunter.events import ComponentPlaced

    res["placed"] = {
        e.component: {"bundle": e.bundle, "gpu_ids": e.gpu_ids} for e in events if isinstance(e, ComponentPlaced)
    }
    if part == "separate2":
        res["sync"] = sync_figures(log, copy_gbps, floor_s=nccl_floor_s)
    return res


def _ended(events: list) -> str:
    e = next((x for x in reversed(events) if isinstance(x, RunEnded)), None)
    return "none" if e is None else f"{e.reason} after {e.steps} steps{': ' + e.error[:300] if e.error else ''}"


def _plain(cfg: EngineConfig) -> dict:
    import msgspec

    return msgspec.to_builtins(cfg)


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
        from shunter.bench.gpu_rpc import rpc_child

        print(json.dumps(rpc_child(json.loads(a.rpc))))
        return 0
    if a.transports:
        print(json.dumps(_transports_child(json.loads(a.transports))))
        return 0
    if a.raw:
        print(json.dumps(_raw_child(json.loads(a.raw))))
        return 0
    if a.core:
        print(json.dumps(_core_child(json.loads(a.core))))
        return 0
    res = measure(a.config, tuple(x for x in a.parts.split(",") if x), Path(a.out))
    print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
