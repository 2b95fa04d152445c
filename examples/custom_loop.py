"""Drive training from your own loop while shunter keeps rollout running in the background.

    python -m examples.custom_loop [STEPS]

The engine generates continuously (``run.trainer_driver = "user"``: no built-in train
steps); this loop takes each ready mini-batch, trains it on the trainer actor with its own
loss (REINFORCE with a per-prompt baseline, below), and publishes weights every second
step — exactly when it decides to. A loss that fails raises ``UserCodeError`` here with the
loss's own error first; the run goes on and the batch can be trained again.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import torch

from shunter import Engine, LossInput
from shunter.engine.config import load_config, merge

CONFIG = Path(__file__).with_name("sort_separate.toml")


def reinforce_loss(inp: LossInput) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level REINFORCE with each prompt's mean reward as the baseline:
    -(r - mean_group(r)) * log pi(token), averaged over the response tokens."""
    groups, index = torch.unique(inp.group_ids, return_inverse=True)
    sums = torch.zeros(len(groups), device=inp.rewards.device).index_add_(0, index, inp.rewards)
    counts = torch.zeros(len(groups), device=inp.rewards.device).index_add_(0, index, torch.ones_like(inp.rewards))
    baseline = (sums / counts)[index]
    advantage = (inp.rewards - baseline)[:, None]
    loss = -(advantage * inp.logp * inp.mask).sum() / inp.mask.sum().clamp(min=1)
    return loss, {"reinforce_loss": float(loss.detach()), "baseline_mean": float(baseline.mean())}


async def main(steps: int = 6, overrides: dict | None = None) -> list[float]:
    over = merge({"run": {"trainer_driver": "user", "progress": False}}, overrides or {})
    cfg = load_config(CONFIG, over)
    rewards = []
    async with Engine(cfg) as engine:
        for step in range(1, steps + 1):
            batch = await engine.next_batch(timeout_s=120)
            end = await engine.train(batch, loss_fn="examples.custom_loop:reinforce_loss")
            rewards.append(end.metrics["batch/reward_mean"])
            print(f"step {end.step}: reward {rewards[-1]:.3f}, loss {end.metrics['trainer/reinforce_loss']:.4f}")
            if step % 2 == 0:
                ready = await engine.publish_weights()
                print(f"published version {ready.version} ({ready.nbytes / 1e6:.1f} MB)")
        await engine.stop("custom loop done")
    return rewards


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 6))
