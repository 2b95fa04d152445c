"""Where a replica's weight load waits: the round trip of vLLM's engine-core calls.

A load is a ``collective_rpc`` of the copy into the model's parameters (before requests were
salted by weight epoch, also a ``reset_prefix_cache``). This measures their round trip around no work at all,
on one engine started as a replica starts it (engine core in its own process), under three
conditions: the engine idle; sequences decoding; and the GPU also running another process's
kernels (the trainer's step, on a shared GPU). What a load costs past its own copy is the
largest of these that applies — the part of the sync time no copy path can remove.

    python -m shunter.bench gpu --parts rpc     (on the GPU machine; JSON under "rpc")
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time


def noop(worker: object) -> int:
    """Runs in the worker: nothing (the round trip alone)."""
    return 0


async def _times(call, n: int) -> dict[str, float]:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        xs.append(time.perf_counter() - t0)
    xs.sort()
    return {"median_s": statistics.median(xs), "p90_s": xs[int(0.9 * (len(xs) - 1))], "min_s": xs[0]}


def _busy_gpu(stop: threading.Event) -> None:
    """Another CUDA context's work on the same GPU, back to back (a stand-in for a training step)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(8):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def rpc_child(spec: dict) -> dict:
    from shunter.bench.gpu.children import child_backend
    from shunter.engine.replica.backend import GenParams

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # as in a replica: the engine core in its own process
    n = int(spec.get("n", 20))

    async def go() -> dict:
        be = child_backend(spec)
        await be.start()
        engine = be.engine.require()

        async def rpc() -> None:
            await engine.collective_rpc(noop)

        async def reset() -> None:
            await engine.reset_prefix_cache()

        async def both() -> None:
            await asyncio.gather(rpc(), reset())

        calls = {"noop_rpc": rpc, "reset_prefix_cache": reset, "both": both}

        async def round_(label: str) -> dict:
            return {f"{label}_{name}": await _times(c, n) for name, c in calls.items()}

        out: dict = {}
        await _times(rpc, 3)  # warm
        out.update(await round_("idle"))
        seqs = int(spec.get("in_flight", 64))
        params = GenParams(max_tokens=spec["max_model_len"] - 16, temperature=1.0, ignore_eos=True)
        t0 = time.perf_counter()
        gens = [asyncio.create_task(be.generate(f"r{i}", [1 + i % 97] * 8, params)) for i in range(seqs)]
        await asyncio.sleep(2.0)  # past the prefill: the engine decodes all of them
        out.update(await round_(f"decoding{seqs}"))
        stop = threading.Event()
        th = threading.Thread(target=_busy_gpu, args=(stop,), daemon=True)
        th.start()
        await asyncio.sleep(1.0)
        out.update(await round_(f"decoding{seqs}_gpu_shared"))
        stop.set()
        th.join()
        res = await asyncio.gather(*gens)
        dt = time.perf_counter() - t0
        tokens = sum(len(r.token_ids) for r in res)
        out["decode_tokens_per_s"] = tokens / dt
        out["decode_step_s"] = seqs / (tokens / dt)  # one token per sequence per step (a mean over the run)
        out["in_flight"] = seqs
        await be.shutdown()
        return out

    return asyncio.run(go())
