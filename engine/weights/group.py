"""Collective groups that carry published weights from the trainer to a replica on another
device: the ``nccl`` transport across GPUs, and ``gloo`` on CPU (the tests' stand-in, same code).

Invariants:

- every collective call has a deadline: a peer that died or never came yields
  :class:`WeightGroupError` naming the group and what it waited for — never a hang. An NCCL
  wait that runs out aborts the communicator (``ncclCommAbort``), which ends the stuck
  kernel; the group is then dead and must be joined again;
- one group per (trainer, replica) pair, rank 0 = the trainer (the sender), rank 1 = the
  replica, so a replica that joins late or restarts joins a group of its own and a dead
  replica takes down only its own group;
- each send is a header (version, bytes, bucket size) followed by the flat buffer in buckets
  of that size (the receiver cuts its buffer the same way, so every broadcast has matching
  counts); a receiver expecting another version or size raises instead of loading the wrong
  bytes.

NCCL groups (``shunter.actors.vllm.nccl``) are built the way vLLM's NCCL weight-transfer engine
builds its own: vLLM's ``StatelessProcessGroup`` and its ``PyNcclCommunicator``. Gloo groups use
torch's ``ProcessGroupGloo`` with its timeout.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from shunter.engine.io.errors import secs

BACKENDS = ("nccl", "gloo")
SENDER = 0


class WeightGroupError(RuntimeError):
    pass


def listen_socket(host: str = "127.0.0.1") -> tuple[socket.socket, int]:
    """A bound, listening TCP socket on a free port of ``host`` — the address replicas reach
    the trainer at, never all interfaces (handed to the group's store, so no other process can
    take the port between choosing and using it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen()
    return sock, sock.getsockname()[1]


class GlooGroup:
    """Two (or more) processes over torch's gloo backend; CPU tensors."""

    backend = "gloo"

    def __init__(
        self, host: str, port: int, rank: int, world_size: int, timeout_s: float, sock: socket.socket | None = None
    ) -> None:
        import torch.distributed as dist

        self.name = f"gloo://{host}:{port}"
        td = timedelta(seconds=timeout_s)
        kw = {"master_listen_fd": sock.detach()} if sock is not None else {}
        try:
            store = dist.TCPStore(host, port, world_size, rank == 0, timeout=td, wait_for_workers=False, **kw)
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, td)
        except Exception as e:  # noqa: BLE001 - name the group and the cause
            raise WeightGroupError(f"{self.name}: rank {rank} could not join within {secs(timeout_s)}s: {e}") from e
        self.rank = rank

    def broadcast(self, tensors: list[torch.Tensor], src: int, deadline: float) -> None:
        import torch.distributed as dist

        for t in tensors:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WeightGroupError(f"{self.name}: deadline passed before a broadcast")
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.timeout = src, timedelta(seconds=left)
            try:
                self.pg.broadcast([t], opts).wait(timedelta(seconds=left))
            except Exception as e:  # noqa: BLE001
                raise WeightGroupError(f"{self.name}: broadcast of {t.numel()} bytes failed: {e}") from e

    def close(self) -> None:
        self.pg = None


GROUPS: dict[str, Callable[..., Any]] = {"gloo": GlooGroup}
"""Group classes by backend. ``nccl`` is vLLM's (``shunter.actors.vllm.nccl.register()`` adds it:
vLLM is imported only by the vLLM adapter modules)."""


def make_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float,
    sock: socket.socket | None = None,
    device: torch.device | None = None,
) -> Any:
    if backend not in BACKENDS:
        raise ValueError(f"unknown weight group backend {backend!r}; expected one of {BACKENDS}")
    if backend not in GROUPS:
        raise WeightGroupError(
            f"no {backend} weight group in this process: call shunter.actors.vllm.nccl.register() "
            "(the trainer and replica actors do)"
        )
    if backend == "gloo":
        return GROUPS[backend](host, port, rank, world_size, timeout_s, sock)
    return GROUPS[backend](host, port, rank, world_size, timeout_s, sock, device)


def _buckets(flat: torch.Tensor, bucket_bytes: int) -> list[torch.Tensor]:
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    step = max(1, int(bucket_bytes))
    return [raw[i : i + step] for i in range(0, raw.numel(), step)]


def send_flat(group, flat: torch.Tensor, version: int, *, bucket_bytes: int, timeout_s: float) -> dict:
    """Broadcast ``flat`` (rank 0) as ``version``: a header, then the buckets."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    nbytes = flat.numel() * flat.element_size()
    header = torch.tensor([version, nbytes, bucket_bytes], dtype=torch.int64, device=flat.device)
    buckets = _buckets(flat, bucket_bytes)
    group.broadcast([header, *buckets], SENDER, deadline)
    return {"send_s": time.perf_counter() - t0, "nbytes": nbytes, "buckets": len(buckets)}


def recv_flat(group, flat: torch.Tensor, version: int, *, timeout_s: float) -> dict:
    """Receive into ``flat`` (rank > 0) the buffer sent as ``version``; raise if the header
    names another version or size (the group is then closed: its stream is out of step)."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    nbytes = flat.numel() * flat.element_size()
    header = torch.zeros(3, dtype=torch.int64, device=flat.device)
    group.broadcast([header], SENDER, deadline)
    got_v, got_n, bucket_bytes = (int(x) for x in header.tolist())
    if (got_v, got_n) != (version, nbytes):
        group.close()
        raise WeightGroupError(
            f"{group.name}: expected version {version} ({nbytes} bytes), the trainer sent "
            f"version {got_v} ({got_n} bytes); group closed"
        )
    buckets = _buckets(flat, bucket_bytes)
    group.broadcast(buckets, SENDER, deadline)
    return {"recv_s": time.perf_counter() - t0, "nbytes": nbytes, "buckets": len(buckets)}


class Received:
    """A replica's record of what its current group carried, for the rule "each version
    crosses a group once": the executor sends a version over a replica's group only if that
    group has not carried it, one load at a time per replica; the replica receives under the
    same rule, so every broadcast has its receiver and no receive waits for a send that never
    comes. A failed receive leaves nothing usable (and the executor drops the group)."""

    def __init__(self) -> None:
        self.version = -1

    def joined(self) -> None:
        """A new group has carried nothing."""
        self.version = -1

    def fresh(self, version: int) -> bool:
        """Whether ``version``'s bytes come over the group now (a receive must run)."""
        if version != self.version:
            self.version = -1  # until the receive succeeds, the buffer holds nothing usable
            return True
        return False

    def got(self, version: int) -> None:
        self.version = version


class WeightSender:
    """The trainer's side: one group per replica (opened on demand, rank 0), sends the flat
    buffer a publisher keeps for a version. Thread-safe: a join runs in a thread of its own
    (it waits for the replica), sends run in the caller's thread."""

    def __init__(
        self,
        backend: str,
        publisher,
        *,
        host: str = "127.0.0.1",
        bucket_bytes: int = 256 << 20,
        timeout_s: float = 120.0,
        device: torch.device | None = None,
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        if backend not in BACKENDS:
            raise ValueError(f"unknown weight group backend {backend!r}; expected one of {BACKENDS}")
        self.backend, self.publisher, self.host = backend, publisher, host
        self.bucket_bytes, self.timeout_s, self.device = bucket_bytes, timeout_s, device
        self._groups: dict = {}  # replica id -> Future[group]
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="weight-group")

    def open(self, replica_id: str) -> tuple[str, int]:
        """Open the replica's group (dropping an older one): returns (host, port) for it to join."""
        self.drop(replica_id)
        sock, port = listen_socket(self.host)
        self._groups[replica_id] = self._pool.submit(
            make_group, self.backend, self.host, port, SENDER, 2, self.timeout_s, sock, self.device
        )
        return self.host, port

    def send(self, replica_id: str, version: int) -> dict:
        fut = self._groups.get(replica_id)
        if fut is None:
            raise WeightGroupError(f"no weight group with {replica_id} (it never joined, or the group was dropped)")
        try:
            group = fut.result(timeout=self.timeout_s)
        except Exception as e:  # noqa: BLE001 - the join failed or ran out of time
            self._groups.pop(replica_id, None)
            raise WeightGroupError(f"{replica_id} never joined its weight group: {e}") from e
        flat, lock = self.publisher.buffer(version)
        with lock:
            try:
                return send_flat(group, flat, version, bucket_bytes=self.bucket_bytes, timeout_s=self.timeout_s)
            except WeightGroupError:
                self.drop(replica_id)
                raise

    def drop(self, replica_id: str) -> None:
        fut = self._groups.pop(replica_id, None)
        if fut is not None and fut.done() and fut.exception() is None:
            fut.result().close()

    def close(self) -> None:
        for rid in list(self._groups):
            self.drop(rid)
        self._pool.shutdown(wait=False, cancel_futures=True)
