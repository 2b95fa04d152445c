"""``SampleBuffer``: prompt groups from dispatch to trained (or dropped), and the
staleness bound.

Invariants (checked by :meth:`check`):

- every group dispatched is in exactly one state — in flight, ready, trained, dropped —
  so ``dispatched == in_flight + ready + trained + sum(dropped)``; nothing is lost or
  trained twice;
- capacity gate (AReaL's rule, in groups): a new group may start on a replica holding
  weights of version ``v`` only while
  ``dispatched - dropped < (admit_staleness + v + 1) * groups_per_train_batch``, where
  ``admit_staleness <= max_staleness`` (``rollout.admit_staleness``; ``max_staleness`` unless
  set lower): a gate at a lower bound admits a subset of what the full one would, so what
  follows from the gate at ``max_staleness`` (the deadlines' no-drop guarantee) holds too;
- no trained sample has ``trainer_version - min_token_version > max_staleness``:
  ``on_stale="wait"`` trains finished groups in completion order as far as the bound allows
  and the oldest first where it requires (``shunter.engine.coordinator.deadlines``: with the gate, no
  group is dropped for staleness while the trainer publishes every ``batches_per_version``
  mini-batches; the trainer waits for a straggler only once its deadline has come);
  ``on_stale="drop"`` trains finished groups in completion order and drops those that
  exceeded the bound (reason ``stale``);
- no ready group is past the bound for the trainer's version once the caller has told the
  buffer of a publish (:meth:`prune`) and of each completed group (:meth:`drop_if_late`): a
  group no batch can train never holds a place under the gate (a user's loop may publish
  sooner than every ``batches_per_version`` batches).

Cost: every operation is O(1) amortised in the groups held, but for the groups it returns,
``prune`` (once per publish; in wait mode only while a level below the bound is held), which
looks at every ready group, and the wait-mode
plan, which walks the ready groups once per change of the buffer or the trainer's version
(views between changes reuse it).

The records it keeps (:class:`Group`, the checkpoint state, :class:`AccountingError`) live in
``engine/coordinator/groups.py``.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice

from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.coordinator.deadlines import Pace, formable_now, plan
from shunter.engine.coordinator.groups import AccountingError, BufferState, Group, GroupState
from shunter.events import Batch, PromptSpec, Sample


class SampleBuffer:
    def __init__(
        self,
        *,
        group_size: int,
        groups_per_batch: int,
        batches_per_version: int,
        max_staleness: int,
        on_stale: str = "wait",
        admit_staleness: int = -1,
    ) -> None:
        if on_stale not in ("wait", "drop"):
            raise ValueError(f"on_stale must be 'wait' or 'drop', got {on_stale!r}")
        if admit_staleness > max_staleness:
            raise ValueError(f"admit_staleness ({admit_staleness}) must be at most max_staleness ({max_staleness})")
        self.group_size = group_size
        self.groups_per_batch = groups_per_batch
        self.groups_per_version = groups_per_batch * batches_per_version
        self.max_staleness = max_staleness
        self.admit_staleness = max_staleness if admit_staleness < 0 else admit_staleness
        """The gate's bound: at most ``admit_staleness + 1`` versions of groups ahead of ``v``."""
        self.on_stale = on_stale
        self._groups: dict[int, Group] = {}  # in flight or ready, by group id (= dispatch order)
        self._ready: dict[int, None] = {}  # complete groups in completion order
        self.batches_per_version = batches_per_version
        self._levels: Counter[int] = Counter()  # level -> groups in flight or ready
        self._ready_levels: Counter[int] = Counter()  # level -> ready groups
        self._ready_by_level: dict[int, dict[int, None]] = {}  # level -> its ready groups by completion
        self._taken_version = 0  # wait mode: the trainer version of the last take ...
        self._taken_at = 0  # ... and the batches taken on it
        self._changes = 0  # bumped by every change the wait-mode plan depends on
        self._plan: tuple[tuple[int, int, int], list[list[int]]] | None = None
        self._next_group = 0
        self._next_batch = 0
        self.trained = 0
        self.dropped: Counter[str] = Counter()

    @classmethod
    def for_run(cls, cfg: EngineConfig) -> SampleBuffer:
        r = cfg.rollout
        return cls(
            group_size=r.n_samples_per_prompt,
            groups_per_batch=cfg.groups_per_mini_batch,
            batches_per_version=cfg.trainer.parameter_sync_step,
            max_staleness=r.max_staleness,
            on_stale=r.on_stale,
            admit_staleness=r.admit_bound,
        )

    # -- dispatch side ---------------------------------------------------------------
    @property
    def dispatched(self) -> int:
        return self._next_group

    def capacity(self, version: int) -> int:
        """Groups that may still start on weights of ``version``."""
        limit = (self.admit_staleness + version + 1) * self.groups_per_version
        return limit - (self._next_group - sum(self.dropped.values()))

    def open(self, prompt: PromptSpec, version: int) -> Group:
        g = Group(self._next_group, prompt, self.group_size, version)
        self._groups[g.group_id] = g
        self._levels[g.level] += 1
        self._next_group += 1
        self._changes += 1
        return g

    def add(self, sample: Sample) -> bool:
        """Record a finished sample; True when it completes its group. Samples of unknown
        (dropped or trained) groups are ignored and return False."""
        sample.check()
        g = self._groups.get(sample.group_id)
        if g is None or len(g.samples) >= g.n:
            return False
        g.put(sample)
        complete = len(g.samples) >= g.n
        level = g.min_version if complete else min(g.level, sample.min_version if sample.versions else g.level)
        if level != g.level:
            self._levels[g.level] -= 1
            if not self._levels[g.level]:
                del self._levels[g.level]
            g.level = level
            self._levels[g.level] += 1
            self._changes += 1
        if complete:
            self._ready[g.group_id] = None
            self._ready_levels[g.level] += 1
            self._ready_by_level.setdefault(g.level, {})[g.group_id] = None
            self._changes += 1
            return True
        return False

    def group(self, group_id: int) -> Group | None:
        return self._groups.get(group_id)

    def groups(self) -> list[Group]:
        """Groups in flight or ready, in dispatch order."""
        return list(self._groups.values())

    # -- batch side ------------------------------------------------------------------
    def staleness(self, g: Group, version: int) -> int:
        return version - g.min_version

    def prune(self, version: int) -> list[Group]:
        """Drop the ready groups already past the bound for a trainer at ``version`` (a publish);
        return them. Wait mode looks only when a level below the bound is held."""
        if self.on_stale != "drop":
            return self._drop_late(version)
        stale = [self._groups[i] for i in self._ready if self.staleness(self._groups[i], version) > self.max_staleness]
        for g in stale:
            self.drop(g.group_id, "stale")
        return stale

    def drop_if_late(self, group_id: int, version: int) -> Group | None:
        """A group that just completed already past the bound for a trainer at ``version`` is
        dropped as stale at once (returned): no batch may train it, and while it sat ready it
        would hold a place under the gate that only a take could free — a user's loop that
        publishes sooner than every ``batches_per_version`` batches waited on it forever."""
        g = self._groups.get(group_id)
        if g is None or not g.complete or self.staleness(g, version) <= self.max_staleness:
            return None
        return self.drop(group_id, "stale")

    def _pace(self, version: int | None) -> Pace:
        v = self._taken_version if version is None else version
        return Pace(
            version=v,
            taken_at_version=self._taken_at if v == self._taken_version else 0,
            batches_per_version=self.batches_per_version,
            max_staleness=self.max_staleness,
            groups_per_batch=self.groups_per_batch,
        )

    def formable(self, skip: int = 0, version: int | None = None) -> list[list[Group]]:
        """The mini-batches that could be taken now by a trainer at ``version`` (default: the
        last take's), in taking order (before staleness checks at take time), but for the
        first ``skip``. Drop mode: ready groups by completion; wait mode: the deadline plan."""
        g = self.groups_per_batch
        if self.on_stale == "drop":
            c = list(islice(self._ready, skip * g, None))
            return [[self._groups[i] for i in c[k : k + g]] for k in range(0, len(c) - g + 1, g)]
        return [[self._groups[i] for i in b] for b in self._wait_plan(version)[skip:]]

    def ready_batches(self, version: int | None = None) -> int:
        if self.on_stale == "drop" or len(self._ready) < self.groups_per_batch:
            return len(self._ready) // self.groups_per_batch
        return len(self._wait_plan(version))

    def most_batches(self) -> int:
        """An upper bound on :meth:`ready_batches` that costs nothing: full batches of ready groups."""
        return len(self._ready) // self.groups_per_batch

    def _wait_plan(self, version: int | None) -> list[list[int]]:
        pace = self._pace(version)
        key = (self._changes, pace.version, pace.taken_at_version)
        if self._plan is None or self._plan[0] != key:
            if formable_now(pace, self._levels, self._ready_levels):
                groups = self._groups
                self._plan = (
                    key,
                    plan(
                        pace,
                        self._levels,
                        self._ready_levels,
                        self._ready_by_level,
                        self._ready,
                        lambda g: groups[g].level,
                    ),
                )
            else:  # a due group still generates: no walk over the ready ones
                self._plan = (key, [])
        return self._plan[1]

    @property
    def batches_taken(self) -> int:
        return self._next_batch

    @property
    def ready_samples(self) -> int:
        return len(self._ready) * self.group_size

    def take(self, version: int) -> tuple[Batch | None, list[Group]]:
        """The next mini-batch for a trainer at ``version`` (None if not ready) and the
        groups dropped on the way for staleness."""
        if self.on_stale == "drop":
            dropped = self.prune(version)
            cands = list(islice(self._ready, self.groups_per_batch))
        else:
            dropped = self._drop_late(version)
            planned = self._wait_plan(version)
            cands = planned[0] if planned else []
        if len(cands) < self.groups_per_batch:
            return None, dropped
        late = [gid for gid in cands if self.staleness(self._groups[gid], version) > self.max_staleness]
        if late:  # a level known too late (see shunter.engine.coordinator.deadlines); never train them anyway
            for gid in late:
                dropped.append(self._groups[gid])
                self.drop(gid, "stale")
            batch, more = self.take(version)
            return batch, dropped + more
        groups = [self._forget(gid) for gid in cands]
        if version != self._taken_version:
            self._taken_version, self._taken_at = version, 0
        self._taken_at += 1
        self.trained += len(groups)
        samples = [s for g in groups for s in sorted(g.samples.values(), key=lambda s: s.sample_id)]
        min_v = min(g.min_version for g in groups)
        batch = Batch(
            batch_id=self._next_batch,
            samples=samples,
            group_ids=cands,
            min_version=min_v,
            max_staleness=version - min_v,
        )
        self._next_batch += 1
        return batch, dropped

    def _drop_late(self, version: int) -> list[Group]:
        """Wait mode: ready groups no batch on ``version`` or later may train (see
        ``shunter.engine.coordinator.deadlines`` for how one can arise); they are dropped as stale."""
        floor = version - self.max_staleness
        if not self._levels or min(self._levels) >= floor:
            return []
        late = [self._groups[i] for i in self._ready if self.staleness(self._groups[i], version) > self.max_staleness]
        for g in late:
            self.drop(g.group_id, "stale")
        return late

    def _forget(self, group_id: int) -> Group:
        g = self._groups.pop(group_id)
        if group_id in self._ready:
            del self._ready[group_id]
            self._ready_levels[g.level] -= 1
            same = self._ready_by_level[g.level]
            del same[group_id]
            if not same:
                del self._ready_by_level[g.level]
        self._levels[g.level] -= 1
        if not self._levels[g.level]:
            del self._levels[g.level]
        self._changes += 1
        return g

    def drop(self, group_id: int, reason: str) -> Group | None:
        if group_id not in self._groups:
            return None
        g = self._forget(group_id)
        self.dropped[reason] += 1
        return g

    def forfeit(self, groups: int) -> None:
        """Groups taken for a batch whose optimizer step never happened (the run ended first):
        counted as dropped at the run's end, not as trained."""
        groups = min(groups, self.trained)
        self.trained -= groups
        if groups:
            self.dropped["run_end"] += groups

    def drop_all(self, reason: str) -> list[Group]:
        return [g for gid in list(self._groups) if (g := self.drop(gid, reason))]

    # -- checkpoints -------------------------------------------------------------------
    def snapshot(self) -> BufferState:
        return BufferState(
            next_group=self._next_group,
            next_batch=self._next_batch,
            trained=self.trained,
            dropped=dict(self.dropped),
            ready=list(self._ready),
            taken_version=self._taken_version,
            taken_at_version=self._taken_at,
            groups=[
                GroupState(
                    group_id=g.group_id,
                    prompt=g.prompt,
                    n=g.n,
                    dispatch_version=g.dispatch_version,
                    samples=list(g.samples.values()),
                )
                for g in self._groups.values()
            ],
        )

    def restore(self, st: BufferState) -> None:
        """Replace the contents with a snapshot (same sizes and staleness rule assumed)."""
        self._groups = {}
        for gs in st.groups:
            if gs.n != self.group_size:
                raise ValueError(f"group {gs.group_id} has {gs.n} samples per prompt; this run uses {self.group_size}")
            self._groups[gs.group_id] = Group(
                gs.group_id, gs.prompt, gs.n, gs.dispatch_version, {s.sample_id: s for s in gs.samples}
            )
        self._ready = {gid: None for gid in st.ready}
        self._levels = Counter(g.level for g in self._groups.values())
        self._ready_levels = Counter(self._groups[gid].level for gid in self._ready)
        self._ready_by_level = {}
        for gid in self._ready:
            self._ready_by_level.setdefault(self._groups[gid].level, {})[gid] = None
        self._next_group, self._next_batch, self.trained = st.next_group, st.next_batch, st.trained
        self._taken_version, self._taken_at = st.taken_version, st.taken_at_version
        self._changes += 1
        self.dropped = Counter(st.dropped)
        self.check()

    # -- accounting --------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self._groups) - len(self._ready)

    @property
    def ready(self) -> int:
        return len(self._ready)

    def counters(self) -> dict[str, int]:
        return {
            "dispatched": self.dispatched,
            "in_flight": self.in_flight,
            "ready": self.ready,
            "trained": self.trained,
            "dropped": sum(self.dropped.values()),
            **{f"dropped_{k}": v for k, v in sorted(self.dropped.items())},
        }

    def check(self) -> None:
        """Raise ``AccountingError`` unless every dispatched group is in exactly one state."""
        total = self.in_flight + self.ready + self.trained + sum(self.dropped.values())
        if total != self.dispatched:
            raise AccountingError(f"groups unaccounted for: {self.counters()}")
        levels = Counter(g.rule_level() for g in self._groups.values())
        ready_levels = Counter(self._groups[gid].rule_level() for gid in self._ready)
        if +self._levels != levels or +self._ready_levels != ready_levels:
            raise AccountingError(
                f"groups per level kept {dict(+self._levels)} ({dict(+self._ready_levels)} ready), "
                f"recounted {dict(levels)} ({dict(ready_levels)} ready)"
            )
