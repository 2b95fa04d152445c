"""A ``kill -9`` of vLLM's engine core process while the backend waits on it for a utility call
(a weight load) makes that call raise ``EngineDead`` within seconds — vLLM fails the output
streams of its requests when the core dies, but not the future of a utility call in flight.

The engine core runs in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, vLLM's default).
It is stopped (SIGSTOP) so that the weight load is surely in flight when the kill lands, then
killed (SIGKILL), as an operator or the OOM killer would. Run by
``tests/e2e/test_vllm_backend.py`` in its own process; exit status 0 iff the checks passed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path


async def run(model_dir: Path) -> list[str]:
    import psutil
    from safetensors.torch import save
    from transformers import AutoModelForCausalLM

    from shunter.actors.vllm.backend import VLLMBackend
    from shunter.actors.vllm.engine import EngineSpec
    from shunter.engine.replica.backend import EngineDead, GenParams

    fails: list[str] = []
    # float32: vLLM's CPU build picks bfloat16 where the CPU reports AMX, and on a VM that reports
    # it without enabling it the engine's worker process dies of SIGILL on its first step (seen
    # 2026-12-04); the check is about the core's death, not the dtype
    be = VLLMBackend(
        EngineSpec(model_dir=str(model_dir), seed=0, max_model_len=64, max_num_seqs=4, extra={"dtype": "float32"})
    )
    await be.start()
    r = await be.generate("warm", [5, 6, 7], GenParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    if len(r.token_ids) != 4:
        fails.append(f"the engine did not generate before the kill: {r}")
    cores = [p for p in psutil.Process().children(recursive=True) if "EngineCore" in " ".join(p.cmdline()) + p.name()]
    if len(cores) != 1:
        return [*fails, f"expected one engine core process, found {[(p.pid, p.name()) for p in cores]}"]
    core = cores[0]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    blob = save({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()})
    os.kill(core.pid, signal.SIGSTOP)  # it cannot answer: the load below is surely in flight
    load = asyncio.ensure_future(be.load_weights(blob))
    done, _ = await asyncio.wait({load}, timeout=2.0)
    if done:
        fails.append(f"the weight load returned while the engine core was stopped: {load.result()!r}")
    t0 = time.monotonic()
    os.kill(core.pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(load, 30.0)
        fails.append("the weight load returned after the engine core was killed")
    except EngineDead as e:
        took = time.monotonic() - t0
        print(f"EngineDead after {took:.2f}s: {e}")
        if took > 5.0:
            fails.append(f"EngineDead came {took:.1f}s after the kill (expected within 5 s)")
        if "load_weights" not in str(e):
            fails.append(f"the error does not say which call the death cut: {e}")
    except TimeoutError:
        fails.append("the weight load still hung 30 s after the engine core was killed")
    try:
        await asyncio.wait_for(be.generate("after", [5, 6], GenParams(max_tokens=2)), 30.0)
        fails.append("generate() on a dead engine returned")
    except EngineDead:
        pass
    except TimeoutError:
        fails.append("generate() on a dead engine hung")
    await be.shutdown()
    return fails


def main() -> int:
    from shunter.engine.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as d:
        model_dir = build_tiny_model(Path(d) / "m", sft_steps=0)
        fails = asyncio.run(run(model_dir))
    for f in fails:
        print("FAIL:", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
