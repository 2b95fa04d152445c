"""A minimal GRPO loop, the yardstick of the engine's overhead: the same task, model, vLLM
adapter, trainer code, optimizer steps and samples as a shunter run of the config, in one
process — no Ray, no coordinator, no events, no overlap.

Each round: the next ``train_batch_size / n_samples_per_prompt`` training prompts of the task
(the stream a run draws from, same seed), ``n_samples_per_prompt`` samples each, generated
together on one ``VLLMBackend`` (``rollout.max_in_flight_per_replica`` at a time at most, as a
replica holds); rewards by the task; the batch cut into mini-batches of whole groups, one
``Trainer.train_step`` each; every ``parameter_sync_step`` steps a publish and a load into the
engine (the trainer's blob, the replica's load path). What it measures, per part: generation,
scoring, training, publish + load; the wall time from the first round to the last step
(engine start and model build left out, as a run's ``RunStarted`` -> ``RunEnded`` leaves them
out).

Invariant: nothing here is shunter's control plane — only the pieces a hand-written loop
would call (the vLLM adapter, the trainer, the task) — so the ratio to a run of the same
config is what the engine costs, overlap included.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from typing import Any

from shunter.engine.config.engine_config import EngineConfig
from shunter.events import Sample


async def run_minimal(cfg: EngineConfig) -> dict[str, float]:
    """The loop for ``cfg.run.total_steps`` optimizer steps; figures as ``shunter.bench.runner.real`` reports them."""
    from transformers import AutoTokenizer

    from shunter.actors.vllm.backend import VLLMBackend
    from shunter.actors.vllm.engine import EngineSpec
    from shunter.engine.models.folder import check_model_dir
    from shunter.engine.models.tiny import build_tiny_model
    from shunter.engine.replica.backend import GenParams
    from shunter.engine.tasks.base import load_task
    from shunter.engine.trainer.trainer import Trainer

    start = time.perf_counter()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    m, r, t = cfg.model, cfg.rollout, cfg.trainer
    if m.build_tiny:
        build_tiny_model(m.path, m.build_tiny, seed=cfg.run.seed, sft_steps=m.sft_steps, preset=m.preset)
    model_dir = str(check_model_dir(m.path))
    tok = AutoTokenizer.from_pretrained(model_dir)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    trainer = Trainer(t, model_dir, seed=cfg.run.seed, pad_token_id=pad, temperature=r.temperature)
    await asyncio.to_thread(trainer.setup)
    backend = VLLMBackend(
        EngineSpec(
            model_dir=model_dir,
            seed=cfg.run.seed,
            max_model_len=r.max_model_len,
            stream_interval=r.stream_interval,
            extra=r.engine_args,
        )
    )
    await backend.start()
    task = load_task(cfg.task.name)
    prompts = task.train_prompts(cfg.run.seed)
    n = r.n_samples_per_prompt
    per_round, per_step = t.train_batch_size // n, t.ppo_mini_batch_size // n
    params = GenParams(max_tokens=r.max_tokens, temperature=r.temperature, stop_token_ids=(tok.eos_token_id,))
    room = asyncio.Semaphore(r.max_in_flight_per_replica)
    parts = dict.fromkeys(("generate_s", "score_s", "train_s", "publish_s", "load_s"), 0.0)
    rewards: list[float] = []
    steps, group = 0, 0
    t0 = time.perf_counter()
    try:
        while steps < cfg.run.total_steps:
            a = time.perf_counter()
            batch = list(itertools.islice(prompts, per_round))
            ids = [tok.encode(p.text) for p in batch]

            async def one(rid: str, prompt: list[int]) -> Any:
                async with room:
                    return await backend.generate(rid, prompt, params)

            outs = await asyncio.gather(*(one(f"{group + i}.{k}", ids[i]) for i in range(len(batch)) for k in range(n)))
            b = time.perf_counter()
            samples = []
            for j, out in enumerate(outs):
                i, k = divmod(j, n)
                toks = out.token_ids[:-1] if out.token_ids and out.token_ids[-1] == tok.eos_token_id else out.token_ids
                reward = float(task.reward(batch[i].text, tok.decode(toks), batch[i].answer))
                samples.append(
                    Sample(
                        sample_id=f"{group + i}.{k}",
                        group_id=group + i,
                        prompt_id=group + i,
                        prompt_token_ids=ids[i],
                        token_ids=out.token_ids,
                        logprobs=out.logprobs,
                        versions=[trainer.version] * len(out.token_ids),
                        max_tokens=r.max_tokens,
                        reward=reward,
                    )
                )
                rewards.append(reward)
            group += len(batch)
            c = time.perf_counter()
            parts["generate_s"] += b - a
            parts["score_s"] += c - b
            for lo in range(0, len(samples), per_step * n):
                if steps >= cfg.run.total_steps:
                    break
                d = time.perf_counter()
                await asyncio.to_thread(trainer.train_step, samples[lo : lo + per_step * n], t.loss_fn)
                steps += 1
                e = time.perf_counter()
                parts["train_s"] += e - d
                if steps % t.parameter_sync_step == 0 or steps == cfg.run.total_steps:
                    blob = await asyncio.to_thread(trainer.publish)
                    f = time.perf_counter()
                    await backend.load_weights(blob)
                    parts["publish_s"] += f - e
                    parts["load_s"] += time.perf_counter() - f
        wall = time.perf_counter() - t0
    finally:
        await backend.shutdown()
    k = max(1, len(rewards) // 5)
    return {
        "wall_s": wall,
        "total_s": wall + (t0 - start),  # with the model build, the trainer's setup and the engine's start
        "steps": float(steps),
        "step_s": wall / max(1, steps),
        "samples": float(len(rewards)),
        "reward_avg": statistics.fmean(rewards) if rewards else 0.0,
        "reward_last": statistics.fmean(rewards[-k:]) if rewards else 0.0,
        **parts,
    }
