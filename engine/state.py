"""``EngineState``: the coordinator's mutable bookkeeping and the views built from it.

Invariant: the state changes only by applying events and the immediate effects of
issued commands (a replica told to switch is ``switching`` until its ``ModeChanged``
arrives; a trainer told to train is ``training`` at once), so the view a policy sees never
lets it issue the same command twice. Rates and costs are measured on the events' own
``wall_time``, so replaying a log reproduces the same views.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shunter.events import BufferView, EngineView, ReplicaView, TrainerView
from shunter.events.view import ROLLOUT, TRAINER


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

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._hits: deque[tuple[float, int]] = deque()
        self._since: float | None = None

    def start(self, t: float) -> None:
        if self._since is None:
            self._since = t

    def stop(self) -> None:
        self._since = None
        self._hits.clear()

    def add(self, t: float, n: int = 1) -> None:
        self.start(t)
        self._hits.append((t, n))
        while self._hits and self._hits[0][0] < t - self.window_s:
            self._hits.popleft()

    def rate(self, now: float) -> float:
        if self._since is None or not self._hits:
            return 0.0
        span = min(self.window_s, now - self._since)
        return sum(n for _, n in self._hits) / span if span > 0 else 0.0


@dataclass
class ReplicaState:
    replica_id: str
    kind: str
    rank: int
    mode: str
    version: int = 0
    rate: WindowRate = field(default_factory=WindowRate)
    samples_done: int = 0
    tokens_done: int = 0


@dataclass
class TrainerState:
    state: str = "idle"
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
    trainer_driver: str
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    trainer: TrainerState = field(default_factory=TrainerState)
    switch_cost: dict[str, Ema] = field(default_factory=lambda: {ROLLOUT: Ema(), TRAINER: Ema()})
    seq: int = 0
    now: float = 0.0
    done: bool = False

    def replica_views(self, in_flight: dict[str, int]) -> tuple[ReplicaView, ...]:
        return tuple(
            ReplicaView(
                replica_id=r.replica_id,
                kind=r.kind,
                rank=r.rank,
                mode=r.mode,
                in_flight=in_flight.get(r.replica_id, 0),
                version=r.version,
                samples_per_s=r.rate.rate(self.now),
            )
            for r in sorted(self.replicas.values(), key=lambda r: r.rank)
        )

    def view(self, buffer: BufferView, in_flight: dict[str, int]) -> EngineView:
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
