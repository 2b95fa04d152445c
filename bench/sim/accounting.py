"""What a simulated run (``bench/sim/cluster.py``) measures itself with and returns:
:class:`SimResult`, the replicas' KV occupancy (:func:`kv_occupancy`), the coordinator's inbox
that charges its real CPU time onto the simulated clock (:class:`ChargedInbox`) and the
cyclic-GC passes taken out of that charge (:class:`GcPauses`).

Invariant: with the charge on, the coordinator's real seconds per turn — less the GC passes
inside the turn, which scan the whole simulated cluster's heap, not a coordinator's — pass on
the simulated clock before it takes its next message, and each message's latency runs from its
posting to the end of its handling, queueing included.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from dataclasses import dataclass, field

from shunter.bench.sim.replica_model import Books, ReplicaModel
from shunter.events import Message, RunEnded


@dataclass
class SimResult:
    ended: RunEnded
    messages: list[Message]
    sim_s: float
    """Simulated (virtual) seconds from start to ``RunEnded``."""
    cpu_wall_s: float
    """Real seconds the simulation took."""
    handled: int
    """Messages the coordinator handled."""
    coordinator_cpu_s: float
    """Real seconds spent inside the coordinator's loop step (record/apply/decide/pump)."""
    handle_s: list[float]
    """Real seconds of each loop turn (the messages that arrived together in -> their
    commands out), in order."""
    turn_sizes: list[int]
    """How many messages each loop turn of ``handle_s`` handled."""
    latency_s: list[float]
    """Per message: simulated seconds from its posting to the end of its handling (queueing
    included; with ``charge_coordinator`` the handling itself takes its real CPU time); per fact
    of a relay's report, from when its replica stamped it (the relay's window included)."""
    relays: int = 0
    """Relays the replicas' answers went through (simulated nodes)."""
    relay_cpu_s: list[float] = field(default_factory=list)
    """Real seconds each relay spent folding (its own process's work, never the coordinator's)."""
    relay_flushes: int = 0
    relay_folded: int = 0
    """Facts the relays posted, in ``relay_flushes`` messages."""
    gc_pause_s: float = 0.0
    """Real seconds the process spent in cyclic-GC passes during the run (the simulator's heap:
    every simulated replica's objects)."""
    gc_in_turns_s: float = 0.0
    """Of those, the seconds that fell inside the coordinator's turns: taken out of its charged
    time (``handle_s``) — they scan the whole simulated cluster, which a coordinator's own
    process does not hold."""
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
    loop's clock); ``get()`` first sleeps off ``debt`` — the real seconds the coordinator spent
    on the previous messages, when they are charged — so its CPU time passes on the simulated
    clock while replicas and trainer go on and post."""

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
    """Times the cyclic garbage collector's passes while active (``with``): ``total``, and
    ``turn`` — what fell since the caller last zeroed it (one coordinator turn; the caller sums
    those into ``in_turns``). A pass inside a turn scans the simulator's whole heap (thousands of simulated
    replicas), not the coordinator's: the turn is charged without it."""

    def __init__(self, *, active: bool = True) -> None:
        self.active = active
        self.total = self.in_turns = self.turn = 0.0
        self._t0 = 0.0

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            dt = time.perf_counter() - self._t0
            self.total += dt
            self.turn += dt

    def __enter__(self) -> GcPauses:
        if self.active:
            gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            gc.callbacks.remove(self._cb)
