"""``WeightPublisher``: the ``Trainer``'s weights going out — publishing a version (a safetensors
blob, or a CUDA IPC or flat package for the replicas on the trainer's GPU) and the weight groups
that carry it to the replicas (nccl / gloo).

Held by ``shunter.engine.trainer.trainer.Trainer``, which picks the transport with
``open_transport`` in ``setup`` (before it loads the model, so a transport the device cannot
carry is refused first) and gives the publisher the trained model, the device and precision it
runs in, the transport (its name, the flat-buffer publisher of the IPC and collective
transports, the weight groups' sender of the collective ones) and the trainer's
``TrainerCounters``. Invariants: ``version`` counts publishes, so each ``publish`` bumps it by one,
resets ``steps_since_publish`` and returns that version's weights; what a publish sends is
the live weights, whatever moved them since the last one.
"""

from __future__ import annotations

import itertools
import time

import torch

from shunter.engine.config.trainer import TrainerConfig
from shunter.engine.trainer.counters import TrainerCounters
from shunter.engine.trainer.rank_group import RankGroup
from shunter.engine.weights import transport as weight_transport
from shunter.engine.weights.group import WeightSender


def state_dict_to_blob(state_dict: dict, dtype: torch.dtype | None = None) -> bytes:
    """An HF-named state dict as safetensors bytes (tied tensors written once, under the
    first name; the replica side restores the tie)."""
    return weight_transport.to_safetensors(weight_transport.unique_tensors(state_dict), dtype)


def open_transport(
    cfg: TrainerConfig, device: str, weight_host: str
) -> tuple[str, weight_transport.FlatPublisher | None, WeightSender | None]:
    """(the transport ``trainer.weight_transport`` names on ``device``, its flat-buffer publisher,
    its weight groups' sender); ``weight_host``: the address replicas reach the weight groups at."""
    cuda = device.startswith("cuda")
    wt = cfg.weight_transport
    ipc = cuda and cfg.world_size == 1  # a sharded trainer's gathered weights are in host memory
    transport = (weight_transport.CUDA_IPC if ipc else weight_transport.SAFETENSORS) if wt == "auto" else wt
    if cfg.world_size > 1 and transport not in (weight_transport.SAFETENSORS, weight_transport.GLOO):
        raise ValueError(
            f"trainer.weight_transport = {transport!r} with trainer.world_size = {cfg.world_size}: a sharded "
            "trainer publishes through 'safetensors' or 'gloo' (its gathered weights are in host memory)"
        )
    if transport in weight_transport.IPC_TRANSPORTS:
        if not cuda:
            raise ValueError(
                f"trainer.weight_transport = {transport!r} needs a cuda device, the trainer is on {device}"
            )
        return transport, weight_transport.FlatPublisher(), None
    if transport in weight_transport.COLLECTIVE_TRANSPORTS:
        if transport == weight_transport.NCCL and not cuda:
            raise ValueError(f"trainer.weight_transport = 'nccl' needs a cuda device, the trainer is on {device}")
        flat = weight_transport.FlatPublisher()
        sender = WeightSender(
            transport,
            flat,
            host=weight_host,
            bucket_bytes=int(cfg.weight_bucket_mb * (1 << 20)),
            timeout_s=cfg.weight_group_timeout_s,
            device=torch.device(device) if cuda else None,
        )
        return transport, flat, sender
    return transport, None, None


class WeightPublisher:
    def __init__(
        self,
        model: torch.nn.Module,
        counters: TrainerCounters,
        transport: str,
        flat: weight_transport.FlatPublisher | None,
        sender: WeightSender | None,
        *,
        device: str,
        amp: bool,
        group: RankGroup | None = None,
        bucket_bytes: int = 256 << 20,
    ) -> None:
        self.model = model
        self.group = group or RankGroup()
        self.bucket_bytes = bucket_bytes  # a sharded trainer gathers full tensors this many bytes at a time
        self.counters = counters
        self.transport = transport
        self.flat = flat  # the IPC and collective transports' buffers (None: a safetensors blob each publish)
        self.sender = sender  # the nccl / gloo transports' weight groups
        self.device = device
        self.amp = amp  # bf16 autocast: the replicas get bf16 weights
        self.published_nbytes = 0  # bytes of the weights last published (a cuda_ipc payload is only handles)
        self.last_publish: dict[str, float] = {}  # seconds the last publish spent, by part (WeightsReady.detail)
        self._items_cache: tuple[tuple[int, ...], list[tuple[str, torch.Tensor]], torch.Tensor | None] | None = None

    @property
    def publish_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.amp else torch.float32

    def publish(self) -> bytes:
        """Bump the version and return the weights' payload (HF names): a safetensors blob,
        or a CUDA IPC package (ours or vLLM's format) for replicas on the trainer's GPU
        (``weight_transport``)."""
        t0 = time.perf_counter()
        dtype = self.publish_dtype
        items, source = self._gathered(dtype) if self.group.sharded else self._publish_items()
        t1 = time.perf_counter()
        if not self.group.leader:  # it took part in the gathers; rank 0 answers for the group
            self.counters.version += 1
            self.counters.steps_since_publish = 0
            self.last_publish = {"items_s": t1 - t0}
            return b""
        self.published_nbytes = sum(t.numel() for _, t in items) * dtype.itemsize
        if self.flat is not None:
            wire = self.transport
            if wire in weight_transport.COLLECTIVE_TRANSPORTS:  # hybrid replicas on this GPU map the handle
                wire = weight_transport.CUDA_IPC if self.device.startswith("cuda") else weight_transport.FLAT
            blob = self.flat.publish(items, dtype, wire=wire, version=self.counters.version + 1, source=source)
            self.last_publish = {"items_s": t1 - t0, **self.flat.last}
        else:
            blob = weight_transport.to_safetensors(items, dtype)
            self.last_publish = {"items_s": t1 - t0, "pack_s": time.perf_counter() - t1}
        self.counters.version += 1
        self.counters.steps_since_publish = 0
        return blob

    def _gathered(self, dtype: torch.dtype) -> tuple[list[tuple[str, torch.Tensor]], None]:
        """A sharded trainer's weights as full tensors in host memory on rank 0 (none on the
        others), gathered bucket by bucket: the device holds one bucket of full tensors at a
        time beside the shards (``fsdp.gathered``); every rank calls it (a collective)."""
        from shunter.engine.trainer import fsdp

        items: list[tuple[str, torch.Tensor]] = []
        for bucket in fsdp.gathered(self.model, self.bucket_bytes, dtype):
            if self.group.leader:
                items += [(n, t.to("cpu")) for n, t in bucket]
        return items, None

    def _publish_items(self) -> tuple[list[tuple[str, torch.Tensor]], torch.Tensor | None]:
        """``unique_tensors(state_dict())`` and the flat tensor they lie in (None: they do not),
        kept while every parameter and buffer keeps its memory (checked by address: an
        offload, onload or any ``.data`` swap changes it) — the state dict alone costs ~2 ms a
        publish for a 0.5B model on an H200."""
        key = tuple(t.data_ptr() for t in itertools.chain(self.model.parameters(), self.model.buffers()))
        cached = self._items_cache
        if cached is None or cached[0] != key:
            items = weight_transport.unique_tensors(self.model.state_dict())
            cached = self._items_cache = (key, items, weight_transport.flat_source(items))
        return cached[1], cached[2]

    def _sender(self):
        if self.sender is None:
            raise RuntimeError(f"trainer.weight_transport = {self.transport!r} has no weight groups (nccl / gloo do)")
        return self.sender

    def open_weight_group(self, replica_id: str) -> tuple[str, int]:
        """Open ``replica_id``'s weight group as rank 0; the replica joins at (host, port)."""
        return self._sender().open(replica_id)

    def send_weights(self, replica_id: str, version: int) -> dict:
        """Broadcast the flat copy of ``version`` to ``replica_id`` (it receives concurrently)."""
        return self._sender().send(replica_id, version)

    def drop_weight_group(self, replica_id: str) -> None:
        if self.sender is not None:
            self.sender.drop(replica_id)
