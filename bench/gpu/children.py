"""The GPU bench's measurements that run in a child process of their own
(``python -m shunter.bench.gpu.measure --raw / --core / --transports``): raw vLLM generation, the
replica's rollout core alone, and the two IPC weight paths side by side.

Invariant: each runs in a fresh process (``in_child``), so its GPU memory is freed when it
exits and it shares the device with no engine run; the parent reads the child's last JSON line,
else the error it printed. This module never imports ``bench/gpu/measure.py`` (the child's entry point
is named by its module path only).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


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
    return in_child(
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


def in_child(flag: str, spec: dict) -> dict:
    """Run one measurement in a fresh process (its GPU memory is freed when it exits); its
    last JSON line is the result, else the error it printed."""
    out = subprocess.run(
        [sys.executable, "-m", "shunter.bench.gpu.measure", flag, json.dumps(spec)],
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
    from shunter.actors.vllm.backend import VLLMBackend
    from shunter.actors.vllm.engine import EngineSpec

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
    return in_child("--core", spec)


def core_child(spec: dict) -> dict:
    from transformers import AutoTokenizer

    from shunter.engine.models.tokenizer import HFTokenizer
    from shunter.engine.replica.core import RolloutCore
    from shunter.events import Generate, PromptSpec, SampleEnd, SamplingSpec, Stamper

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    async def go() -> dict:
        be = child_backend(spec, stream_interval=spec.get("stream_interval", 16))
        await be.start()
        core = RolloutCore(
            "core",
            be,
            HFTokenizer(AutoTokenizer.from_pretrained(spec["model_dir"])),
            lambda *a: 0.0,
            Stamper("bench", "core"),
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


def transports_child(spec: dict) -> dict:
    """Publish from a real ``Trainer`` (fp32 master weights -> flat bf16 buffer -> IPC
    handles) and load into one vLLM engine that has both paths; alternate the paths."""
    import torch

    from shunter.engine.config.trainer import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer
    from shunter.engine.weights import transport as wt

    # the handles must be opened by another process: vLLM's engine core runs in its own
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    # the trainer keeps no publisher of its own ("safetensors"); this one serves both wire formats
    t = Trainer(TrainerConfig(weight_transport="safetensors"), spec["model_dir"])
    t.setup()
    pub = wt.FlatPublisher()

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


def raw_child(spec: dict) -> dict:
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
