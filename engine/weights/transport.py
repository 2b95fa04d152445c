"""How published weights travel from the trainer to the replicas.

Invariant: a publish yields one ``bytes`` payload that names the weights completely —
either a safetensors image of the HF state dict (``safetensors``: any device, through
the Ray object store), or a small package of CUDA IPC handles to a flat copy of the
weights that the trainer keeps on its GPU, for replicas on the same GPU (device to device,
no host round trip). That package comes in two wire formats:

- ``cuda_ipc``: ours, loaded by shunter's worker extension (``actors/vllm/extension.py``) straight into
  the model;
- ``vllm_ipc``: vLLM's own weight-transfer engine (``weight_transfer_config={'backend':
  'ipc'}``), packed format: the payload is the ``update_info`` of vLLM's
  ``IPCWeightTransferUpdateInfo`` (names, dtypes, shapes, byte sizes, one handle to the
  flat buffer keyed by GPU UUID) and the replica drives vLLM's start / update / finish.

The trainer keeps the last two flat copies (double buffering), so the payload of version
``v`` stays valid until version ``v + 2`` is published. Tied tensors (``lm_head`` /
``embed_tokens``) are sent once.

For replicas on *another* device (``nccl`` across GPUs, ``gloo`` on CPU — the tests'
stand-in) the payload is the layout alone (``flat``: names, shapes, offsets, dtype,
version); the bytes of the flat copy travel over a collective group of the trainer and
that replica (``engine.weights.group``). On a CUDA trainer the ``nccl`` publish is the
``cuda_ipc`` package, which carries the same layout: a replica with a weight group
receives it over the group, a hybrid replica on the trainer's GPU maps the handle.

Receivers call :func:`payload_kind` to tell the formats apart. IPC packages are pickled:
they are only ever produced by this run's trainer and consumed by its replicas, never read
from outside (events never carry them).
"""

from __future__ import annotations

import itertools
import pickle
import threading
import time
import uuid

import torch

MAGIC = b"SHIPC001"
VLLM_MAGIC = b"SHVIPC01"
FLAT_MAGIC = b"SHFLAT01"
SAFETENSORS = "safetensors"
CUDA_IPC = "cuda_ipc"
VLLM_IPC = "vllm_ipc"
FLAT = "flat"
NCCL = "nccl"
GLOO = "gloo"
IPC_TRANSPORTS = (CUDA_IPC, VLLM_IPC)
COLLECTIVE_TRANSPORTS = (NCCL, GLOO)


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


def flatten_module(module: torch.nn.Module) -> torch.Tensor | None:
    """Make the module's published tensors (``unique_tensors(state_dict())``, tied ones once)
    views of one flat buffer, back to back in that order, so that a publish casts them with one
    copy instead of one per tensor. Returns the flat buffer, or None (nothing changed) when they
    are not all floating point of one dtype on one device. Parameters keep their identity (an
    optimizer built before or after sees the same objects); only their storage moves."""
    items = unique_tensors(module.state_dict())
    owners = {t.data_ptr(): t for t in itertools.chain(module.parameters(), module.buffers())}
    if not items or any(t.data_ptr() not in owners for _, t in items):
        return None
    dtypes = {t.dtype for _, t in items}
    devices = {t.device for _, t in items}
    if len(dtypes) != 1 or len(devices) != 1 or not next(iter(dtypes)).is_floating_point:
        return None
    flat = torch.empty(sum(t.numel() for _, t in items), dtype=dtypes.pop(), device=devices.pop())
    off = 0
    with torch.no_grad():
        for _, t in items:
            owner, n = owners[t.data_ptr()], t.numel()
            view = flat[off : off + n].view(owner.shape)
            view.copy_(owner.data)
            owner.data = view
            off += n
    return flat


def flat_source(items: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """The one flat tensor ``items`` lie in, back to back in order (see :func:`flatten_module`),
    or None when they do not."""
    if not items:
        return None
    first = items[0][1]
    base, size, total = first.data_ptr(), first.element_size(), 0
    for _, t in items:
        if t.dtype != first.dtype or t.device != first.device or not t.is_contiguous():
            return None
        if t.data_ptr() != base + total * size:
            return None
        total += t.numel()
    storage = first.untyped_storage()
    if first.storage_offset() * size + total * size > storage.nbytes():
        return None
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(storage, first.storage_offset(), (total,))


def to_safetensors(items: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> bytes:
    """``unique_tensors`` output as a safetensors image (on the host, in ``dtype``)."""
    from safetensors.torch import save

    return save({n: t.detach().to("cpu", dtype=dtype or t.dtype).contiguous() for n, t in items})


class FlatPublisher:
    """Keeps two flat buffers on the weights' device and hands out a package naming the one
    just filled: IPC handles (``cuda_ipc`` / ``vllm_ipc``, CUDA only) or the layout alone
    (``flat``, for receivers that get the bytes over a collective — :meth:`buffer`).

    A buffer is locked while a collective reads it (:meth:`buffer`), so a publish never
    overwrites bytes still on their way to a replica."""

    def __init__(self) -> None:
        self._bufs: list[torch.Tensor | None] = [None, None]
        self._versions = [-1, -1]
        self._locks = [threading.Lock(), threading.Lock()]
        self._next = 0
        self._token = uuid.uuid4().hex[:12]
        self._allocs = [0, 0]
        """How often each buffer was (re)allocated: with the token, the ``buffer`` id a package
        names — the same id is the same memory, so a receiver may keep its mapping."""
        self.last: dict[str, float] = {}
        """Seconds the last publish spent: ``copy_s`` (the cast copy issued), ``sync_s`` (waiting
        for it on the device, shared with whatever else runs there), ``pack_s`` (the package)."""

    def publish(
        self,
        items: list[tuple[str, torch.Tensor]],
        dtype: torch.dtype,
        wire: str = CUDA_IPC,
        version: int = -1,
        source: torch.Tensor | None = None,
    ) -> bytes:
        """Copy ``unique_tensors`` output into the next buffer; return the package in the
        ``wire`` format (``cuda_ipc``, ``vllm_ipc`` or ``flat``). ``source``: the flat tensor the
        items lie in back to back (:func:`flat_source`): one cast copy instead of one per tensor."""
        from torch.multiprocessing.reductions import reduce_tensor

        if wire not in (*IPC_TRANSPORTS, FLAT):
            raise ValueError(f"unknown weight wire format {wire!r}; expected one of {(*IPC_TRANSPORTS, FLAT)}")
        total = sum(t.numel() for _, t in items)
        device = items[0][1].device
        if wire in IPC_TRANSPORTS and device.type != "cuda":
            raise ValueError(f"{wire} needs the weights on a CUDA device, they are on {device}")
        k = self._next
        t0 = time.perf_counter()
        with self._locks[k]:  # waits for a send still reading this buffer
            buf = self._bufs[k]
            if buf is None or buf.numel() != total or buf.dtype != dtype or buf.device != device:
                buf = self._bufs[k] = None  # free the old one first
                buf = self._bufs[k] = torch.empty(total, dtype=dtype, device=device)
                self._allocs[k] += 1
            entries = pack_into(buf, items, source)
            t1 = time.perf_counter()
            if device.type == "cuda":  # the copy's own stream only: other streams' work is not waited for
                torch.cuda.current_stream(device).synchronize()
            self._versions[k] = version
        t2 = time.perf_counter()
        self._next ^= 1
        nbytes = total * buf.element_size()
        layout = {
            "entries": entries,
            "nbytes": nbytes,
            "dtype": str(dtype).split(".")[-1],
            "version": version,
            "buffer": f"{self._token}:{k}:{self._allocs[k]}",
        }
        if wire == VLLM_IPC:
            gpu = str(torch.cuda.get_device_properties(device).uuid)
            _, args = reduce_tensor(buf.view(torch.uint8))
            out = VLLM_MAGIC + pickle.dumps(vllm_update_info(entries, dtype, {gpu: args}))
        elif wire == FLAT:
            out = FLAT_MAGIC + pickle.dumps(layout)
        else:
            out = MAGIC + pickle.dumps({"handle": reduce_tensor(buf), **layout})
        self.last = {"copy_s": t1 - t0, "sync_s": t2 - t1, "pack_s": time.perf_counter() - t2}
        return out

    def buffer(self, version: int) -> tuple[torch.Tensor, threading.Lock]:
        """The flat buffer holding ``version`` and its lock (hold it while reading)."""
        for k in (0, 1):
            if self._versions[k] == version and self._bufs[k] is not None:
                return self._bufs[k], self._locks[k]
        raise LookupError(
            f"weights version {version} are no longer kept (kept: {sorted(v for v in self._versions if v >= 0)})"
        )


def pack_into(
    buf: torch.Tensor, items: list[tuple[str, torch.Tensor]], source: torch.Tensor | None = None
) -> list[tuple[str, tuple, int, int]]:
    """Copy the tensors back to back into the flat ``buf`` (cast to its dtype): one copy from
    ``source`` when they lie in it back to back, else one fused multi-tensor copy; return their
    layout as (name, shape, element offset, numel)."""
    from shunter.engine.weights.copy_plan import copy_all

    entries, off = [], 0
    for name, t in items:
        n = t.numel()
        entries.append((name, tuple(t.shape), off, n))
        off += n
    if source is not None and source.numel() == off:
        buf.copy_(source)
    else:
        copy_all([buf[o : o + n] for _, _, o, n in entries], [t.detach().reshape(-1) for _, t in items])
    return entries


def vllm_update_info(entries: list[tuple[str, tuple, int, int]], dtype: torch.dtype, handle: dict) -> dict:
    """vLLM's packed ``IPCWeightTransferUpdateInfo`` fields for a flat buffer of ``dtype``
    laid out as ``entries`` ((name, shape, element offset, numel), back to back)."""
    size = dtype.itemsize
    return {
        "names": [n for n, *_ in entries],
        "dtype_names": [str(dtype).split(".")[-1]] * len(entries),
        "shapes": [list(shape) for _, shape, _, _ in entries],
        "ipc_handles": handle,
        "tensor_sizes": [n * size for *_, n in entries],
        "packed": True,
    }


def payload_kind(payload: bytes) -> str:
    """``safetensors``, ``cuda_ipc``, ``vllm_ipc`` or ``flat`` (from the payload's first bytes)."""
    head = bytes(payload[: len(MAGIC)])
    return {MAGIC: CUDA_IPC, VLLM_MAGIC: VLLM_IPC, FLAT_MAGIC: FLAT}.get(head, SAFETENSORS)


def package_layout(payload: bytes) -> dict:
    """The layout of a ``cuda_ipc`` or ``flat`` package: ``entries`` ((name, shape, element
    offset, numel)), ``nbytes``, ``dtype`` (a torch dtype name), ``version`` and ``buffer`` (the
    id of the trainer's buffer: the same id, the same memory, refilled)."""
    kind = payload_kind(payload)
    if kind not in (CUDA_IPC, FLAT):
        raise ValueError(f"a {kind} payload carries no flat-buffer layout")
    pkg = pickle.loads(bytes(payload[len(MAGIC) :]))  # noqa: S301 - produced by this run's trainer only
    return {k: pkg[k] for k in ("entries", "nbytes", "dtype", "version", "buffer")}


def flat_views(flat: torch.Tensor, entries: list[tuple[str, tuple, int, int]]) -> list[tuple[str, torch.Tensor]]:
    """(name, view) for each entry of a flat buffer's layout."""
    return [(name, flat[off : off + n].view(shape)) for name, shape, off, n in entries]


def is_cuda_ipc(payload: bytes) -> bool:
    return payload_kind(payload) == CUDA_IPC


def open_vllm_ipc(payload: bytes) -> dict:
    """The ``update_info`` dict of a ``vllm_ipc`` payload (for vLLM's ``update_weights``)."""
    if payload_kind(payload) != VLLM_IPC:
        raise ValueError("not a vllm_ipc weight package")
    return pickle.loads(bytes(payload[len(VLLM_MAGIC) :]))  # noqa: S301 - produced by this run's trainer only


def open_cuda_ipc(payload: bytes) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """Map the tensors of an IPC package in this process: ((name, view) list, nbytes)."""
    items, nbytes, _ = open_cuda_ipc_cached(payload, None)
    return items, nbytes


class IpcMappings:
    """A receiver's mappings of the trainer's flat buffers, by buffer id (at most ``keep``,
    the trainer's two by default): a package naming a buffer already mapped costs no
    ``cudaIpcOpenMemHandle``, and whatever the receiver derived from its views (``extra``: a
    bound copy plan) is kept with it. The trainer refills a buffer in place, so a mapping
    stays valid until the trainer reallocates it — which gives it a new id."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._maps: dict[str, list] = {}  # id -> [items, nbytes, extra], oldest first

    def get(self, buffer_id: str) -> list | None:
        m = self._maps.pop(buffer_id, None)
        if m is not None:
            self._maps[buffer_id] = m  # most recent last
        return m

    def get_latest(self) -> list | None:
        """The entry mapped or used last."""
        return self._maps[next(reversed(self._maps))] if self._maps else None

    def put(self, buffer_id: str, entry: list) -> None:
        self._maps[buffer_id] = entry
        while len(self._maps) > self.keep:
            del self._maps[next(iter(self._maps))]


def open_cuda_ipc_cached(
    payload: bytes, mappings: IpcMappings | None
) -> tuple[list[tuple[str, torch.Tensor]], int, list | None]:
    """``open_cuda_ipc`` through ``mappings``: ((name, view) list, nbytes, the cached entry
    ``[items, nbytes, extra]`` — None when the buffer was mapped just now)."""
    if not is_cuda_ipc(payload):
        raise ValueError("not a cuda_ipc weight package")
    pkg = pickle.loads(payload[len(MAGIC) :])  # noqa: S301 - produced by this run's trainer only
    buffer_id = pkg.get("buffer")
    hit = mappings.get(buffer_id) if mappings is not None and buffer_id is not None else None
    if hit is not None and [e[:2] for e in pkg["entries"]] == [(n, t.shape) for n, t in hit[0]]:
        return hit[0], hit[1], hit
    fn, args = pkg["handle"]
    items = flat_views(fn(*args), pkg["entries"])
    if mappings is not None and buffer_id is not None:
        mappings.put(buffer_id, [items, pkg["nbytes"], None])
    return items, pkg["nbytes"], None
