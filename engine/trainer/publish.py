"""The ``Trainer``'s weights (its part): publishing a version (a safetensors blob, or a CUDA IPC
or flat package for the replicas on the trainer's GPU), the weight groups that carry it to the
replicas (nccl / gloo), and moving optimizer state, parameters and gradients off the GPU and back
(a hybrid replica's turn on the GPU).

``TrainerWeights`` is a mixin of ``shunter.engine.trainer.trainer.Trainer`` (``Trainer.__init__`` and
``setup`` set the state its methods use). Invariants: ``version`` counts publishes, so each
``publish`` bumps it by one and returns that version's weights; the parameters are back in one
flat buffer after an ``onload`` of ``params`` (a publish casts them with one copy).
"""

from __future__ import annotations

import itertools
import time

import torch

from shunter.engine.weights import transport as weight_transport


class TrainerWeights:
    """The ``Trainer``'s publishes, weight groups and offloads (a mixin)."""

    @property
    def publish_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.amp else torch.float32

    def publish(self) -> bytes:
        """Bump the version and return the weights' payload (HF names): a safetensors blob,
        or a CUDA IPC package (ours or vLLM's format) for replicas on the trainer's GPU
        (``weight_transport``)."""
        t0 = time.perf_counter()
        items, source = self._publish_items()
        t1 = time.perf_counter()
        dtype = self.publish_dtype
        self.published_nbytes = sum(t.numel() for _, t in items) * dtype.itemsize
        if self._publisher is not None:
            wire = self.transport
            if wire in weight_transport.COLLECTIVE_TRANSPORTS:  # hybrid replicas on this GPU map the handle
                wire = weight_transport.CUDA_IPC if self.device.startswith("cuda") else weight_transport.FLAT
            blob = self._publisher.publish(items, dtype, wire=wire, version=self.version + 1, source=source)
            self.last_publish = {"items_s": t1 - t0, **self._publisher.last}
        else:
            blob = weight_transport.to_safetensors(items, dtype)
            self.last_publish = {"items_s": t1 - t0, "pack_s": time.perf_counter() - t1}
        self.version += 1
        self.steps_since_publish = 0
        return blob

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

    def offload(self, parts: list[str]) -> int:
        return self._move(parts, "cpu")

    def onload(self, parts: list[str]) -> int:
        moved = self._move(parts, self.device)
        if "params" in parts:
            weight_transport.flatten_module(self.model)  # back in one flat buffer
        return moved

    def _move(self, parts: list[str], device: str) -> int:
        """Move optimizer state / params / grads; returns bytes that changed device."""
        moved = 0
        tensors: list[torch.Tensor] = []
        if "optimizer" in parts:
            tensors += [v for st in self.opt.state.values() for v in st.values() if torch.is_tensor(v)]
        if "params" in parts:
            tensors += [p.data for p in self.model.parameters()]
        if "grads" in parts:
            tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        target = torch.device(device)
        for t in tensors:
            if t.device.type != target.type:
                moved += t.numel() * t.element_size()
                if target.type == "cpu" and torch.cuda.is_available():  # pinned, so the copy runs at full bandwidth
                    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    host.copy_(t.data, non_blocking=True)
                    t.data = host
                else:
                    t.data = t.data.to(target, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            if target.type == "cpu":
                torch.cuda.empty_cache()  # give the freed blocks back, so vLLM can wake into them
        return moved
