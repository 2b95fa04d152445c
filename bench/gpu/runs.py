"""The GPU bench's ground (``python -m shunter.bench gpu``, ``bench/gpu/measure.py``): the machine's
details, the device copy floor, one engine run (waiting first for the GPU's memory to come back
from the last one) and the bytes one publish moves.

Invariant: ``run`` starts an engine run only once the GPU is free of the previous run's actors
(their memory given back), so each part measures on a device nothing else holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import time
from pathlib import Path

from shunter.engine.config.engine_config import EngineConfig
from shunter.events import SampleEnd


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


async def run_engine(cfg: EngineConfig, *, user_rollout_s: float = 0.0, user_samples: int = 0) -> tuple[list, Path]:
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
    return asyncio.run(run_engine(cfg, **kw))


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


def published_nbytes(cfg: EngineConfig) -> int:
    """Bytes one publish moves for the config's model (bf16, tied tensors once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg.model.path))
    return 2 * sum(p.numel() for p in model.parameters())  # parameters() lists a tied tensor once
