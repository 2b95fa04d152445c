"""``EngineState``: the coordinator's mutable bookkeeping and the views built from it.

Invariant: the state changes only by applying events and the immediate effects of
issued commands (a replica told to switch is ``switching`` until its ``ModeChanged``
arrives; a trainer told to train is ``training`` at once), so the view a policy sees never
lets it issue the same command twice. Rates and costs are measured on the events' own
``wall_time``, so replaying a log reproduces the same views. A replica's view is rebuilt
when the replica is touched (an event about it, a dispatch to it); its smoothed rate is
as of that moment.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shunter.engine.config.engine_config import EngineConfig
from shunter.events import BufferView, EngineView, ReplicaView, ReplicaViews, TrainerView
from shunter.events.vocab import ROLLOUT, TRAINER, Mode, ReplicaKind, TrainerActivity, TrainerDriver


class Ema:
    """Exponential moving average; ``value`` is None until the first sample."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def add(self, x: float) -> float:
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        return self.value


class WindowRate:
    """Completions per second over the last ``window_s`` seconds of event time."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._hits: deque[tuple[float, int]] = deque()
        self._sum = 0
        self._since: float | None = None

    def start(self, t: float) -> None:
        if self._since is None:
            self._since = t

    def stop(self) -> None:
        self._since = None
        self._hits.clear()
        self._sum = 0

    def add(self, t: float, n: int = 1) -> None:
        self.start(t)
        self._hits.append((t, n))
        self._sum += n
        while self._hits and self._hits[0][0] < t - self.window_s:
            self._sum -= self._hits.popleft()[1]

    def rate(self, now: float) -> float:
        if self._since is None or not self._hits:
            return 0.0
        span = min(self.window_s, now - self._since)
        return self._sum / span if span > 0 else 0.0


@dataclass
class ReplicaState:
    replica_id: str
    kind: ReplicaKind
    rank: int
    mode: Mode
    version: int = 0
    loading: int = -1
    """The version an ``InstallWeights`` is on its way for (-1: none)."""
    rate: WindowRate = field(default_factory=WindowRate)
    samples_done: int = 0
    tokens_done: int = 0


@dataclass
class TrainerState:
    state: TrainerActivity = "idle"
    step: int = 0
    version: int = 0
    steps_since_publish: int = 0
    step_s: Ema = field(default_factory=Ema)
    offloaded: set[str] = field(default_factory=set)
    handle: str = ""


@dataclass
class EngineState:
    run_id: str
    ppo_mini_batch_size: int
    parameter_sync_step: int
    train_batch_size: int
    n_samples_per_prompt: int
    max_staleness: int
    validate_every: int
    trainer_driver: TrainerDriver
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    trainer: TrainerState = field(default_factory=TrainerState)
    switch_cost: dict[str, Ema] = field(default_factory=lambda: {ROLLOUT: Ema(), TRAINER: Ema()})
    seq: int = 0
    now: float = 0.0
    done: bool = False
    joining: set[str] = field(default_factory=set)
    """Replicas told to switch to rollout and not there yet (nor down)."""
    _order: list[ReplicaView] = field(default_factory=list)
    _pos: dict[str, int] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    _chunks: list[tuple[ReplicaView, ...]] = field(default_factory=list)
    _views: ReplicaViews | None = None

    @classmethod
    def for_run(cls, cfg: EngineConfig, run_id: str) -> EngineState:
        r, t = cfg.rollout, cfg.trainer
        return cls(
            run_id=run_id,
            ppo_mini_batch_size=t.ppo_mini_batch_size,
            parameter_sync_step=t.parameter_sync_step,
            train_batch_size=t.train_batch_size,
            n_samples_per_prompt=r.n_samples_per_prompt,
            max_staleness=r.max_staleness,
            validate_every=cfg.validation.every,
            trainer_driver=cfg.run.trainer_driver,
        )

    def touch(self, replica_id: str) -> None:
        """The replica's view must be rebuilt (its state or in-flight count changed)."""
        self._dirty.add(replica_id)

    def replica_views(self, in_flight: Callable[[str], int]) -> ReplicaViews:
        """All replica views in rank order. Only replicas touched since the last call are
        rebuilt, only their chunks copied (the rest shared with the previous views), and a
        replica registered in rank order is appended, not sorted in: O(touched), not O(replicas)."""
        if not self._dirty and self._views is not None:
            return self._views
        n = ReplicaViews.CHUNK
        stale: set[int] = set()
        dirty: Iterable[str] = self._dirty
        if len(self._dirty) > 1:  # new replicas in rank order, so that registrations append
            dirty = sorted(dirty, key=lambda i: r.rank if (r := self.replicas.get(i)) is not None else -1)
        for rid in dirty:
            r = self.replicas.get(rid)
            if r is None:
                continue
            v = ReplicaView(
                replica_id=rid,
                kind=r.kind,
                rank=r.rank,
                mode=r.mode,
                in_flight=in_flight(rid),
                version=r.version,
                samples_per_s=r.rate.rate(self.now),
            )
            if (at := self._pos.get(rid)) is not None:
                self._order[at] = v
                stale.add(at // n)
            elif not self._order or self._order[-1].rank < v.rank:  # ranks mostly come in order
                self._pos[rid] = len(self._order)
                self._order.append(v)
                stale.add((len(self._order) - 1) // n)
            else:
                at = bisect.bisect(self._order, v.rank, key=lambda x: x.rank)
                self._order.insert(at, v)
                for i in range(at, len(self._order)):
                    self._pos[self._order[i].replica_id] = i
                stale.update(range(at // n, (len(self._order) - 1) // n + 1))
        self._dirty.clear()
        for c in sorted(stale) if len(stale) > 1 else stale:
            chunk = tuple(self._order[c * n : (c + 1) * n])
            if c < len(self._chunks):
                self._chunks[c] = chunk
            else:
                self._chunks.append(chunk)
        self._views = ReplicaViews(tuple(self._chunks), self._pos, len(self._order))
        return self._views

    def view(self, buffer: BufferView, in_flight: Callable[[str], int]) -> EngineView:
        t = self.trainer
        return EngineView(
            run_id=self.run_id,
            seq=self.seq,
            ppo_mini_batch_size=self.ppo_mini_batch_size,
            parameter_sync_step=self.parameter_sync_step,
            train_batch_size=self.train_batch_size,
            n_samples_per_prompt=self.n_samples_per_prompt,
            max_staleness=self.max_staleness,
            validate_every=self.validate_every,
            trainer_driver=self.trainer_driver,
            replicas=self.replica_views(in_flight),
            trainer=TrainerView(
                state=t.state,
                step=t.step,
                version=t.version,
                steps_since_publish=t.steps_since_publish,
                step_s=t.step_s.value or 0.0,
                offloaded=sorted(t.offloaded),
            ),
            buffer=buffer,
            switch_cost_s={k: e.value for k, e in self.switch_cost.items() if e.value is not None},
            done=self.done,
        )
