"""Run the out-of-tree policy in ``examples/custom_policy.py`` by its import string.

python -m examples.custom_policy_run [STEPS]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from shunter import Engine
from shunter.engine.config import load_config, merge
from shunter.events import ModeChanged, RunEnded

CONFIG = Path(__file__).with_name("sort_separate.toml")


async def main(steps: int = 8, overrides: dict | None = None) -> tuple[RunEnded, list[ModeChanged]]:
    over = {
        "run": {"policy": "examples.custom_policy:EagerLendPolicy", "total_steps": steps, "progress": False},
        "rollout": {"standalone_replicas": 1, "hybrid_replicas": 1},
    }
    over = merge(over, overrides or {})
    switches = []
    async with Engine(load_config(CONFIG, over)) as engine:
        async for ev in engine.events():
            if isinstance(ev, ModeChanged):
                switches.append(ev)
                print(f"{ev.replica_id} -> {ev.mode} in {ev.duration_s * 1e3:.1f} ms")
        ended = engine.ended
    print(f"{ended.reason}: {ended.steps} steps, {len(switches)} switches")
    return ended, switches


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
