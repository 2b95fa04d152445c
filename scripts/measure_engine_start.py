"""How long one vLLM engine takes to start on this machine, and its decode rate on the tiny model
(issue 30's CI-time study): ``VLLMBackend.start()`` then the best of 4 rounds of 256 requests x 12
tokens. ``--worker-in-core`` runs vLLM's CPU worker inside the engine-core process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the "uni" executor) — the shape a shunter replica runs
(``actors/rollout_worker.py`` sets it); without it, vLLM's own default (a worker process of its own).
Measured 2026-12-06 (2 cores): 28.5 s / 10.5-12.6k tok/s with vLLM's default, 17.0-20.3 s /
7.6-8.6k tok/s with the worker in the core.

    .venv/bin/python scripts/measure_engine_start.py .shunter/models/sort-tiny [--worker-in-core]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time


async def main(model_dir: str) -> None:
    from shunter.actors.vllm.backend import VLLMBackend
    from shunter.actors.vllm.engine import EngineSpec
    from shunter.engine.replica.backend import GenParams

    b = VLLMBackend(EngineSpec(model_dir=model_dir, max_model_len=32))
    t = time.perf_counter()
    await b.start()
    started = time.perf_counter() - t
    p = GenParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    best = 0.0
    for r in range(4):
        t = time.perf_counter()
        outs = await asyncio.gather(*[b.generate(f"r{r}-{i}", [5, 6, 7, 8, 9, 10], p) for i in range(256)])
        best = max(best, sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t))
    print(f"engine start {started:.1f} s; decode, best of 4 rounds: {best:.0f} tokens/s", flush=True)
    await b.shutdown()


if __name__ == "__main__":
    if "--worker-in-core" in sys.argv:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(main(next(a for a in sys.argv[1:] if not a.startswith("--"))))
