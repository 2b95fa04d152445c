"""What a simulated run (``bench/sim/cluster.py``) measures itself with and returns:
:class:`SimResult`, the replicas' KV occupancy (:func:`kv_occupancy`), the coordinator's inbox
that charges its CPU time onto the simulated clock (:class:`ChargedInbox`), the measure of the
coordinator's work by CPU and by wall clock (:class:`CoordinatorTime`), the relays' wire into
the coordinator's process (:class:`RelayWire`) and the cyclic-GC passes taken out of that
charge (:class:`GcPauses`).

Invariant: with the charge on, the coordinator's **CPU** seconds (``CPU_TIMER``, the process's:
its own thread's and a user policy's worker thread's, which a turn waits on) per turn and per
relay batch it decodes — less the GC passes inside them, which scan the whole simulated
cluster's heap, not a coordinator's — pass on the simulated clock before it takes its next
message; the wall clock is measured beside it and never charged (on a loaded machine it
measures the load). Each message's latency runs from its posting to the end of its handling,
queueing included.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shunter.bench.sim.replica_model import Books, ReplicaModel
from shunter.events import Codec, Message, RunEnded
from shunter.events.relay import RelayReport

T = TypeVar("T")

CPU_TIMER = time.process_time
"""What measures the coordinator's work and is charged: the process's CPU seconds. Not the
thread's (``time.thread_time``): a user's policy runs on a worker thread the turn waits on
(``engine/coordinator/policy_worker.py``), and its CPU is the coordinator's. Not the wall clock:
on a machine shared with other work it counts the time the process waited for a core."""


@dataclass
class SimResult:
    ended: RunEnded
    messages: list[Message]
    sim_s: float
    """Simulated (virtual) seconds from start to ``RunEnded``."""
    simulator_wall_s: float
    """Real (wall-clock) seconds the simulation took, the simulated cluster's own work included."""
    handled: int
    """Facts the coordinator handled (a relay's report counted by the facts it carries)."""
    coordinator_cpu_s: float
    """CPU seconds (``CPU_TIMER``) of the coordinator's work — its loop turns
    (record/apply/decide/pump) and decoding what the relays sent (``decode_cpu_s``) — GC passes
    inside them taken out: what ``charge_coordinator`` charges."""
    handle_s: list[float]
    """CPU seconds of each loop turn (the messages that arrived together in -> their commands
    out), in order."""
    turn_sizes: list[int]
    """How many messages each loop turn of ``handle_s`` handled."""
    latency_s: list[float]
    """Per message: simulated seconds from its posting to the end of its handling (queueing
    included; with ``charge_coordinator`` the handling itself takes its CPU time); per fact
    of a relay's report, from when its replica stamped it (the relay's window included)."""
    coordinator_wall_s: float = 0.0
    """The same work as ``coordinator_cpu_s`` by the wall clock (GC passes taken out alike):
    reported beside it, never charged — above the CPU figure by the time the process waited
    for a core."""
    decode_cpu_s: float = 0.0
    """Of ``coordinator_cpu_s``: decoding the bytes the relays sent (``RelayWire``)."""
    relays: int = 0
    """Relays the replicas' answers went through (simulated nodes)."""
    relay_cpu_s: list[float] = field(default_factory=list)
    """Seconds each relay spent folding and encoding (its own process's work, never the
    coordinator's), by the run's timer."""
    relay_flushes: int = 0
    relay_folded: int = 0
    """Facts the relays posted, in ``relay_flushes`` messages."""
    gc_pause_s: float = 0.0
    """Wall seconds the process spent in cyclic-GC passes during the run (the simulator's heap:
    every simulated replica's objects)."""
    gc_in_turns_s: float = 0.0
    """CPU seconds of those passes that fell inside the coordinator's work: taken out of its
    charged time (``coordinator_cpu_s``) — they scan the whole simulated cluster, which a
    coordinator's own process does not hold."""
    kv_occupancy: float | None = None
    """How full the replicas' KV caches were while they worked: reserved KV tokens integrated over
    their busy time, over ``kv_tokens`` times that time (None: no KV limit, or nothing ran)."""
    books: list[Books] = field(default_factory=list)
    """Each replica model's books: what its time went to (``shunter.bench.sim.replica_model.Books``)."""


def kv_occupancy(models: list[ReplicaModel], kv_tokens: int) -> float | None:
    """``SimResult.kv_occupancy`` over the replicas' models."""
    busy = sum(m.busy_s for m in models)
    if not kv_tokens or busy <= 0:
        return None
    return sum(m.kv_token_s for m in models) / (kv_tokens * busy)


class ChargedInbox(asyncio.Queue):
    """The coordinator's inbox in a simulation. Remembers when each message was posted (on the
    loop's clock); ``get()`` first sleeps off ``debt`` — the CPU seconds the coordinator spent
    since, when they are charged — so its CPU time passes on the simulated clock while replicas
    and trainer go on and post."""

    def __init__(self, clock) -> None:
        super().__init__()
        self.clock = clock
        self.debt = 0.0
        self.posted: deque[float] = deque()
        self.taken: list[float] = []
        """When each message taken since the last ``took()`` was posted."""

    def _put(self, item) -> None:
        self.posted.append(self.clock())
        super()._put(item)

    def _get(self):
        self.taken.append(self.posted.popleft())
        return super()._get()

    def took(self) -> list[float]:
        taken, self.taken = self.taken, []
        return taken

    async def get(self):
        if self.debt > 0:
            debt, self.debt = self.debt, 0.0
            await asyncio.sleep(debt)
        return await super().get()


class GcPauses:
    """Times the cyclic garbage collector's passes while active (``with``), by the wall clock
    (``total``) and by ``timer`` (``cpu``), and ``piece`` / ``piece_wall`` — what fell since the
    caller last zeroed them (one piece of the coordinator's work: the caller sums those into
    ``in_turns``). A pass inside a turn scans the simulator's whole heap (thousands of simulated
    replicas), not the coordinator's: the turn is charged without it."""

    def __init__(self, *, timer: Callable[[], float] = CPU_TIMER, active: bool = True) -> None:
        self.timer = timer
        self.active = active
        self.total = self.in_turns = self.piece = self.piece_wall = 0.0
        self._t0 = self._w0 = 0.0

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._w0, self._t0 = time.perf_counter(), self.timer()
        else:
            dt, dw = self.timer() - self._t0, time.perf_counter() - self._w0
            self.total += dw
            self.piece += dt
            self.piece_wall += dw

    def __enter__(self) -> GcPauses:
        if self.active:
            gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            gc.callbacks.remove(self._cb)


class CoordinatorTime:
    """Measures each piece of the coordinator's work (:meth:`measure`: a loop turn, a batch of a
    relay's bytes decoded) by ``timer`` (CPU) and by the wall clock, the GC passes inside it
    taken out of both; with ``charge``, the CPU seconds go on ``inbox``'s debt — the wall
    seconds never do."""

    def __init__(self, timer: Callable[[], float], inbox: ChargedInbox, *, charge: bool, pauses: GcPauses) -> None:
        self.timer, self.inbox, self.charge, self.pauses = timer, inbox, charge, pauses
        self.cpu_s = self.wall_s = 0.0
        self._inside = False

    def measure(self, fn: Callable[..., T], *args: Any) -> tuple[T, float, float]:
        """``fn(*args)``, its CPU seconds and its wall seconds (GC passes out of both); a piece
        inside another (a relay flushed within a turn) is the outer one's: 0, 0."""
        if self._inside:
            return fn(*args), 0.0, 0.0
        self._inside = True
        try:
            return self._measure(fn, *args)
        finally:
            self._inside = False

    def _measure(self, fn: Callable[..., T], *args: Any) -> tuple[T, float, float]:
        p = self.pauses
        p.piece = p.piece_wall = 0.0
        w, t = time.perf_counter(), self.timer()
        out = fn(*args)
        dt, dw = self.timer() - t, time.perf_counter() - w
        p.in_turns += p.piece
        dt, dw = max(0.0, dt - p.piece), max(0.0, dw - p.piece_wall)
        self.cpu_s += dt
        self.wall_s += dw
        if self.charge:
            self.inbox.debt += dt
        return out, dt, dw


class RelayWire:
    """A simulated node's relay posts over a wire, as a relay actor does: each message is
    encoded on the relay's side (``actors/relay_actor.py``: the relay's own work) and decoded in
    the coordinator's process (``actors/host_relays.py``), a piece of the coordinator's work
    measured and charged by ``time`` (``decode_cpu_s``); a report's bytes are handed to
    ``remember`` (the event log writes them as they are), as the coordinator's process does."""

    def __init__(
        self,
        post: Callable[[list[Message]], None],
        time: CoordinatorTime,
        remember: Callable[[Message, bytes], None] | None = None,
    ) -> None:
        self.post, self.time, self.remember = post, time, remember
        self.codec = Codec()
        self.decode_cpu_s = 0.0

    def _decode(self, bodies: list[bytes]) -> list[Message]:
        return [self.codec.decode(b) for b in bodies]

    def post_of(self, relay: Any) -> Callable[[list[Message]], None]:
        """What ``relay`` posts through (its ``post``): it runs inside the relay's timed work, so
        the decoding's seconds are taken back off the relay's (``relay.timer`` must be the
        coordinator's)."""

        def post(events: list[Message]) -> None:
            bodies = [self.codec.encode(m) for m in events]
            msgs, dt, _ = self.time.measure(self._decode, bodies)
            self.decode_cpu_s += dt
            relay.cpu_s -= dt
            if self.remember is not None:
                for m, body in zip(msgs, bodies, strict=True):
                    if m.__class__ is RelayReport:
                        self.remember(m, body)
            self.post(msgs)

        return post
