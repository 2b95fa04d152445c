"""Drive training from your own loop while shunter keeps rollout running in the background.

    python -m examples.custom_loop [STEPS]

The engine generates continuously (``run.trainer_driver = "user"``: no built-in train
steps); this loop takes each ready mini-batch, trains it on the trainer actor with its own
loss (plain REINFORCE with GRPO advantages, below), and publishes weights every second
step — exactly when it decides to.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from shunter import Engine
from shunter.engine.config import load_config, merge

CONFIG = Path(__file__).with_name("sort_separate.toml")


def reinforce_loss(logp, old_logp, advantages, mask, ref_logp, cfg):
    """Token-level REINFORCE: -A * log pi(token). Same signature as the built-in loss."""
    per_token = -(advantages * logp) * mask
    loss = per_token.sum() / mask.sum().clamp(min=1)
    return loss, {"reinforce_loss": float(loss.detach())}


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
