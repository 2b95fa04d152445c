"""``Supervisor``: replicas that die are replaced, within bounds, and a run with no replica
left says so.

Invariants:

- every replica that dies — ``ReplicaDown``, or a replacement whose start failed
  (``ComponentFailed`` naming it, or naming the replica it was to replace when it failed
  before it even had a rank) — gets exactly one decision: ``ReplicaRestart`` or
  ``ReplicaGivenUp``; never two, whatever else is said of it later;
- a slot (rank) is replaced at most ``rollout.replica_restarts`` times within any hour, the
  ``n``-th time after ``replica_restart_backoff_s · 2^(n-1)`` seconds (at most 60): a replica
  that dies at start-up again and again cannot make the run spin;
- while a replacement is scheduled or starting, the run is not "stalled" (:attr:`busy`); the
  start itself is bounded by ``run.timeout_s`` (a start that times out is a failed start);
- :meth:`none_left` is true only when no replica is alive or on its way: the coordinator then
  ends the run with the reason, instead of waiting for the stall timeout;
- nothing is decided once the run is ending (a replica lost in the finale is not replaced).

The time is the events' own (``wall_time``), so the rule runs under a virtual clock alike.
"""

from __future__ import annotations

from shunter.engine.coordinator.state import EngineState
from shunter.events import ComponentFailed, Event, RankAssigned, ReplicaDown, ReplicaGivenUp, ReplicaRestart, ReplicaUp
from shunter.events.vocab import DOWN, ReplicaKind

_FOLLOWED = frozenset({RankAssigned, ReplicaUp, ReplicaDown, ComponentFailed})
WINDOW_S = 3600.0
MAX_BACKOFF_S = 60.0


class Supervisor:
    def __init__(self, state: EngineState, *, restarts: int, backoff_s: float) -> None:
        self.state = state
        self.restarts, self.backoff_s = restarts, backoff_s
        self._slots: dict[str, tuple[ReplicaKind, int]] = {}  # replica id -> (kind, rank)
        self._deaths: dict[int, list[float]] = {}  # rank -> times of the replacements it got
        self._decided: set[str] = set()
        self._starting: set[str] = set()  # ranked, not yet up (nor failed)
        self._scheduled: dict[str, tuple[ReplicaKind, int]] = {}  # dead replica -> its slot, until a rank
        self.last_loss = ""

    @property
    def busy(self) -> bool:
        """A replacement is scheduled or starting."""
        return bool(self._scheduled) or bool(self._starting)

    def observe(self, ev: Event) -> Event | None:
        """Follow a fact; the decision it calls for, if any (a restart, or giving up)."""
        if type(ev) not in _FOLLOWED:
            return None
        match ev:
            case RankAssigned():
                self._slots[ev.replica_id] = (ev.replica_kind, ev.rank)
                self._starting.add(ev.replica_id)
                for dead, (kind, _) in self._scheduled.items():  # the oldest restart of its kind
                    if kind == ev.replica_kind:
                        del self._scheduled[dead]
                        break
            case ReplicaUp():
                self._slots[ev.replica_id] = (ev.replica_kind, ev.rank)
                self._starting.discard(ev.replica_id)
            case ReplicaDown():
                self._starting.discard(ev.replica_id)
                return self._decide(ev.replica_id, ev.reason, ev.wall_time)
            case ComponentFailed() if ev.component in self._starting:
                self._starting.discard(ev.component)
                return self._decide(ev.component, f"did not start: {ev.error}", ev.wall_time)
            case ComponentFailed() if ev.component in self._scheduled:  # its replacement never got a rank
                kind, rank = self._scheduled.pop(ev.component)
                if self.state.done:
                    return None
                return self._slot(ev.component, kind, rank, f"its replacement did not start: {ev.error}", ev.wall_time)
        return None

    def none_left(self) -> bool:
        """No replica is alive (in any mode but down) and none is on its way."""
        return not self.busy and not any(r.mode != DOWN for r in self.state.replicas.values())

    def _decide(self, replica_id: str, reason: str, now: float) -> Event | None:
        slot = self._slots.get(replica_id)
        if replica_id in self._decided or slot is None or self.state.done:
            return None
        self._decided.add(replica_id)
        return self._slot(replica_id, *slot, reason, now)

    def _slot(self, replica_id: str, kind: ReplicaKind, rank: int, reason: str, now: float) -> Event:
        """Replace the replica of slot ``rank`` once more, or give the slot up."""
        self.last_loss = f"{replica_id} (rank {rank}): {reason}"
        recent = [t for t in self._deaths.get(rank, []) if now - t < WINDOW_S]
        if len(recent) >= self.restarts:
            self._deaths[rank] = recent
            return ReplicaGivenUp(
                replica_id=replica_id, replica_kind=kind, rank=rank, attempts=len(recent), reason=reason
            )
        self._deaths[rank] = [*recent, now]
        self._scheduled[replica_id] = (kind, rank)
        delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** len(recent))
        return ReplicaRestart(
            replica_id=replica_id, replica_kind=kind, rank=rank, attempt=len(recent) + 1, delay_s=delay, reason=reason
        )
