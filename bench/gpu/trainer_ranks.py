"""``trainer_ranks``: the torch trainer alone — no Ray, no replicas — taking optimizer steps on a
fixed batch of the config's shape, as today's one-process trainer, as FSDP2 on one rank, and as
FSDP2 on 2, 4 ... ranks up to the devices here: step time and peak memory per rank, side by side.

Each variant runs in fresh processes (spawned, one per rank, joined in one group as the trainer
ranks of a run are), so no variant inherits another's allocator state. The batch: the config's
``trainer.ppo_mini_batch_size`` samples of a 16-token prompt and a ``rollout.max_tokens``-token
response of random ids, in groups of ``rollout.n_samples_per_prompt``; micro-batches as the
config says. Step time: the median of ``steps`` steps after one warm-up step. Peak memory: on
CUDA ``torch.cuda.max_memory_allocated`` (the allocator's peak over the build and the steps); on
CPU the growth of the process's peak resident set over them (``ru_maxrss``; it counts the
allocator's and libraries' pages too — a coarse figure, labelled as such).

    python -m shunter.bench gpu --config examples/gpu_fsdp2.toml --parts trainer_ranks
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.trainer.rank_group import free_port


def _batch(cfg: EngineConfig, vocab: int) -> list:
    from shunter.events import Sample

    rng = random.Random(cfg.run.seed)
    n, per = cfg.trainer.ppo_mini_batch_size, cfg.rollout.n_samples_per_prompt
    out = []
    for i in range(n):
        toks = [rng.randrange(2, vocab) for _ in range(cfg.rollout.max_tokens)]
        out.append(
            Sample(
                sample_id=f"0.{i}",
                group_id=i // per,
                prompt_id=i // per,
                prompt_token_ids=[rng.randrange(2, vocab) for _ in range(16)],
                token_ids=toks,
                logprobs=[-1.0] * len(toks),
                versions=[0] * len(toks),
                max_tokens=len(toks),
                reward=rng.random(),
            )
        )
    return out


def _rank(rank: int, world: int, port: int, cfg_bytes: bytes, model_dir: str, variant: str, steps: int, out: str):
    import msgspec
    import torch

    from shunter.engine.config.load import from_dict
    from shunter.engine.trainer.rank_group import RankGroup
    from shunter.engine.trainer.trainer import Trainer

    cfg = from_dict(msgspec.msgpack.decode(cfg_bytes))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    device = f"cuda:{rank}" if cuda else "cpu"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    group = (
        RankGroup.join(
            rank, world, "127.0.0.1", port, device=device, timeout_s=cfg.trainer.collective_timeout_s, shard_alone=True
        )
        if variant == "fsdp"
        else RankGroup()
    )
    tcfg = msgspec.structs.replace(cfg.trainer, device=device, world_size=world)
    tr = Trainer(tcfg, model_dir, seed=cfg.run.seed, group=group)
    tr.setup()
    batch = _batch(cfg, tr.model.config.vocab_size)
    times = []
    for k in range(steps + 1):
        t0 = time.perf_counter()
        tr.train_step(batch)
        if cuda:
            torch.cuda.synchronize()
        if k:  # the first step warms up
            times.append(time.perf_counter() - t0)
    peak = (
        torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    )
    Path(out, f"rank{rank}.json").write_text(json.dumps({"step_s": statistics.median(times), "peak_bytes": peak}))
    group.close()


def trainer_ranks(cfg: EngineConfig, steps: int = 5) -> dict:
    """The variants' figures: ``{"plain_1": {...}, "fsdp_1": {...}, "fsdp_2": {...}, ...}``, each
    with the median step time (the slowest rank's) and every rank's peak memory."""
    import msgspec
    import torch
    import torch.multiprocessing as mp

    devices = torch.cuda.device_count() if torch.cuda.is_available() else os.cpu_count() or 1
    top = max(1, min(devices, cfg.trainer.world_size if cfg.trainer.world_size > 1 else devices))
    worlds = [w for w in (1, 2, 4, 8, 16) if w <= top]
    res: dict = {
        "memory": "torch.cuda.max_memory_allocated" if torch.cuda.is_available() else "peak RSS growth (coarse)",
        "samples": cfg.trainer.ppo_mini_batch_size,
        "response_tokens": cfg.rollout.max_tokens,
    }
    data = msgspec.msgpack.encode(msgspec.to_builtins(cfg))
    for variant, world in [("plain", 1)] + [("fsdp", w) for w in worlds]:
        with tempfile.TemporaryDirectory() as out:
            mp.start_processes(
                _rank,
                args=(world, free_port(), data, cfg.model.path, variant, steps, out),
                nprocs=world,
                join=True,
                start_method="spawn",
            )
            ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
        res[f"{variant}_{world}"] = {
            "step_s": max(r["step_s"] for r in ranks),
            "peak_gib_per_rank": [round(r["peak_bytes"] / (1 << 30), 3) for r in ranks],
        }
    return res
