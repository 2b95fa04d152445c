"""``RankGroup``: the trainer ranks of one run as a torch.distributed group — who this rank is,
the device mesh FSDP2 shards over, and the few collectives the step needs beside FSDP's own.

Invariants: a group of one (``RankGroup()``) has no process group and every collective here is
the identity, so the one-process trainer runs the same code; a group of N is joined by every
rank with the same ``(host, port)`` — rank 0's, found through Ray by the launcher — and every
collective on it (FSDP's gathers and reductions included) has the deadline
``trainer.collective_timeout_s`` given to ``init_process_group``: a rank left waiting on a dead
one fails with the operation named instead of hanging. Every rank calls each method here in
the same order (they are collectives).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist


def free_port(host: str = "") -> int:
    """A TCP port free on this host now (rank 0's, for the others to join its group at)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RankGroup:
    def __init__(self, rank: int = 0, world: int = 1, mesh: Any = None) -> None:
        self.rank, self.world, self.mesh = rank, world, mesh

    @classmethod
    def join(
        cls,
        rank: int,
        world: int,
        host: str,
        port: int,
        *,
        device: str,
        timeout_s: float,
        shard_alone: bool = False,
        sock: Any = None,
    ) -> RankGroup:
        """Join the group of ``world`` ranks whose rank 0 listens at ``host:port`` (nccl on cuda,
        gloo on cpu); returns once every rank has joined, or raises past ``timeout_s``.
        ``shard_alone``: a group of one that still shards (FSDP2 on one rank: what
        ``bench gpu --parts trainer_ranks`` compares the plain trainer with). ``sock``: rank 0's
        listening socket for the group's store (``engine.weights.group.listen_socket``: bound to
        ``host`` alone, never all interfaces); without it rank 0's store listens on all."""
        if world == 1 and not shard_alone:
            return cls()
        from torch.distributed.device_mesh import init_device_mesh

        cuda = device.startswith("cuda")
        td = datetime.timedelta(seconds=timeout_s)
        kw = {"master_listen_fd": sock.detach()} if sock is not None and rank == 0 else {}
        store = dist.TCPStore(host, port, world, rank == 0, timeout=td, wait_for_workers=False, **kw)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world, timeout=td)
        mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
        return cls(rank, world, mesh)

    @property
    def sharded(self) -> bool:
        """The model is sharded over a mesh (FSDP2), even one of a single rank."""
        return self.mesh is not None

    @property
    def leader(self) -> bool:
        """Rank 0: it answers for the group (events, published weights, checkpoint files)."""
        return self.rank == 0

    def any(self, flag: bool, device: str = "cpu") -> bool:
        """True on every rank when ``flag`` is true on any rank."""
        if not self.sharded:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, by rank, on every rank (pickled: small things only)."""
        if not self.sharded:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.sharded and dist.is_initialized():
            dist.destroy_process_group()


def merge_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The ranks' step statistics as one: ``*_max`` the largest, ``*_min`` the smallest, the
    rest summed (each rank's figure already weighs its micro-batches by their share of the
    whole mini-batch's tokens, so the sum is the mini-batch's token-weighted mean)."""
    out: dict[str, float] = {}
    for stats in per_rank:
        for k, v in stats.items():
            if k not in out:
                out[k] = v
            elif k.endswith("_max"):
                out[k] = max(out[k], v)
            elif k.endswith("_min"):
                out[k] = min(out[k], v)
            else:
                out[k] += v
    return out
