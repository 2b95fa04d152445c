"""How published weights travel from the trainer to the replicas.

Invariant: a publish yields one ``bytes`` payload that names the weights completely —
either a safetensors image of the HF state dict (``safetensors``: any device, through
the Ray object store), or a small package of CUDA IPC handles to a flat copy of the
weights that the trainer keeps on its GPU (``cuda_ipc``: replicas on the same GPU copy
device to device, no host round trip). The trainer keeps the last two flat copies
(double buffering), so the payload of version ``v`` stays valid until version ``v + 2``
is published. Tied tensors (``lm_head`` / ``embed_tokens``) are sent once.

Receivers call :func:`is_cuda_ipc` to tell the formats apart and :func:`open_cuda_ipc`
to map the tensors (in the process that loads them). The IPC package is pickled: it is
only ever produced by this run's trainer and consumed by its replicas, never read from
outside (events never carry it).
"""

from __future__ import annotations

import pickle

import torch

MAGIC = b"SHIPC001"
SAFETENSORS = "safetensors"
CUDA_IPC = "cuda_ipc"


def unique_tensors(state_dict: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The state dict without tensors that alias one already listed (tied weights)."""
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[tuple] = set()
    for name, t in state_dict.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out.append((name, t))
    return out


def to_safetensors(items: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> bytes:
    """``unique_tensors`` output as a safetensors image (on the host, in ``dtype``)."""
    from safetensors.torch import save

    return save({n: t.detach().to("cpu", dtype=dtype or t.dtype).contiguous() for n, t in items})


class CudaIpcPublisher:
    """Keeps two flat device buffers and hands out IPC handles to the one just filled."""

    def __init__(self) -> None:
        self._bufs: list[torch.Tensor | None] = [None, None]
        self._next = 0

    def publish(self, items: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> bytes:
        """Copy ``unique_tensors`` output into the next buffer; return the IPC package."""
        from torch.multiprocessing.reductions import reduce_tensor

        total = sum(t.numel() for _, t in items)
        device = items[0][1].device
        if device.type != "cuda":
            raise ValueError(f"cuda_ipc needs the weights on a CUDA device, they are on {device}")
        buf = self._bufs[self._next]
        if buf is None or buf.numel() != total or buf.dtype != dtype or buf.device != device:
            buf = self._bufs[self._next] = torch.empty(total, dtype=dtype, device=device)
        entries, off = [], 0
        with torch.no_grad():
            for name, t in items:
                n = t.numel()
                buf[off : off + n].copy_(t.detach().reshape(-1))
                entries.append((name, tuple(t.shape), off, n))
                off += n
        torch.cuda.synchronize(device)
        self._next ^= 1
        return MAGIC + pickle.dumps({"handle": reduce_tensor(buf), "entries": entries,
                                     "nbytes": total * buf.element_size()})


def is_cuda_ipc(payload: bytes) -> bool:
    return payload[: len(MAGIC)] == MAGIC


def open_cuda_ipc(payload: bytes) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """Map the tensors of an IPC package in this process: ((name, view) list, nbytes)."""
    if not is_cuda_ipc(payload):
        raise ValueError("not a cuda_ipc weight package")
    pkg = pickle.loads(payload[len(MAGIC):])  # noqa: S301 - produced by this run's trainer only
    fn, args = pkg["handle"]
    flat = fn(*args)
    return [(name, flat[off : off + n].view(shape)) for name, shape, off, n in pkg["entries"]], pkg["nbytes"]
