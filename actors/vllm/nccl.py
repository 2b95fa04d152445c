"""The NCCL weight group: vLLM's stateless process group and ``PyNcclCommunicator``.

Invariant: this is one of the modules that import vLLM (with the rest of ``actors/vllm``);
:func:`register` makes the group available to ``engine.weights.group.make_group`` in the process
that calls it (the trainer and replica actors, on the nccl transport). Every
wait has a deadline; past it the communicator is aborted and ``WeightGroupError`` raised.
"""

from __future__ import annotations

import socket
import time

import torch

from shunter.engine.io.errors import secs
from shunter.engine.weights import group as weight_group
from shunter.engine.weights.group import WeightGroupError


def register() -> None:
    weight_group.GROUPS["nccl"] = NcclGroup


class NcclGroup:
    """Two (or more) GPUs over NCCL (vLLM's stateless group + PyNcclCommunicator)."""

    backend = "nccl"

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        sock: socket.socket | None = None,
        device: torch.device | None = None,
    ) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        self.name = f"nccl://{host}:{port}"
        if device is None or device.index is None:  # the communicator compares devices with their index
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        try:
            pg = StatelessProcessGroup.create(
                host=host,
                port=port,
                rank=rank,
                world_size=world_size,
                store_timeout=max(1, int(timeout_s)),
                listen_socket=sock,
            )
            self.comm = PyNcclCommunicator(pg, device=self.device)
        except Exception as e:  # noqa: BLE001
            raise WeightGroupError(f"{self.name}: rank {rank} could not join within {secs(timeout_s)}s: {e}") from e
        self.stream = torch.cuda.Stream(self.device)
        self.rank = rank

    def broadcast(self, tensors: list[torch.Tensor], src: int, deadline: float) -> None:
        """Enqueue every bucket on the group's stream, then wait for the last one until
        ``deadline``; past it, abort the communicator (the kernel ends) and raise."""
        if self.comm is None:
            raise WeightGroupError(f"{self.name}: the group was aborted; join again")
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the buffer is filled
        with torch.cuda.stream(self.stream):
            for t in tensors:
                self.comm.broadcast(t, src=src, stream=self.stream)
            done = torch.cuda.Event()
            done.record(self.stream)
        while not done.query():
            if time.monotonic() > deadline:
                self.close()
                raise WeightGroupError(f"{self.name}: the broadcast did not finish in time; communicator aborted")
            time.sleep(0.0001)

    def close(self) -> None:
        if getattr(self, "comm", None) is not None:
            self.comm.destroy()
            self.comm = None
