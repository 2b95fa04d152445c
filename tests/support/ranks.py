"""Trainer ranks as real processes for the unit tier: N spawned processes joined in one gloo
group (``RankGroup.join``), each running a function of this or another importable module, with
a bound on the whole run (a rank that hangs fails the test instead of holding CI).

``run_ranks(fn, world, *args)`` calls ``fn(group, *args)`` on every rank and returns each
rank's return value, by rank; an exception on any rank fails with that rank's traceback.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def _rank_main(rank: int, world: int, port: int, out: str, fn: Callable[..., Any], args: tuple, timeout_s: float):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from shunter.engine.trainer.rank_group import RankGroup

    group = None
    try:
        group = RankGroup.join(rank, world, "127.0.0.1", port, device="cpu", timeout_s=timeout_s)
        result: Any = ("ok", fn(group, *args))
    except BaseException:  # noqa: BLE001 - carried to the parent with its traceback
        result = ("error", traceback.format_exc())
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    if group is not None and result[0] == "ok":
        import torch.distributed as dist

        dist.barrier()  # no rank tears its connections down while another still reads from them
        group.close()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """``fn(group, *args)`` on ``world`` spawned ranks; their results by rank."""
    from shunter.engine.trainer.rank_group import free_port

    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(
            _rank_main,
            args=(world, free_port(), out, fn, args, timeout_s / 2),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        try:
            import time

            deadline = time.monotonic() + timeout_s
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world} trainer ranks did not finish within {timeout_s}s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        results = []
        for r in range(world):
            status, value = pickle.loads(Path(out, f"rank{r}.pkl").read_bytes())
            if status != "ok":
                raise AssertionError(f"trainer rank {r} failed:\n{value}")
            results.append(value)
        return results
