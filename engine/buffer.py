"""``SampleBuffer``: prompt groups from dispatch to trained (or dropped), and the
staleness bound.

Invariants (checked by :meth:`check`):

- every group dispatched is in exactly one state — in flight, ready, trained, dropped —
  so ``dispatched == in_flight + ready + trained + sum(dropped)``; nothing is lost or
  trained twice;
- capacity gate (AReaL's rule, in groups): a new group may start on a replica holding
  weights of version ``v`` only while
  ``dispatched - dropped < (max_staleness + v + 1) * groups_per_train_batch``;
- no trained sample has ``trainer_version - min_token_version > max_staleness``:
  ``on_stale="wait"`` trains groups strictly oldest-first (with the gate this keeps
  every group within the bound, so the trainer waits for stragglers instead of dropping);
  ``on_stale="drop"`` trains finished groups in completion order and drops those that
  exceeded the bound (reason ``stale``).

Cost: every operation is O(1) amortised in the groups held, but for the groups it returns
and ``prune`` (drop mode, once per publish), which looks at every ready group — a view of a
run holding thousands of ready groups costs no scan. Wait mode keeps the leading
run of ready groups (``_prefix``) and extends it past the groups that completed or left
since (each group enters it once).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import islice

import msgspec

from shunter.engine.config import EngineConfig
from shunter.events import Batch, PromptSpec, Sample


@dataclass
class Group:
    group_id: int
    prompt: PromptSpec
    n: int
    dispatch_version: int
    samples: dict[str, Sample] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.samples) >= self.n

    @property
    def min_version(self) -> int:
        return min((s.min_version for s in self.samples.values()), default=self.dispatch_version)


class GroupState(msgspec.Struct, frozen=True, kw_only=True):
    group_id: int
    prompt: PromptSpec
    n: int
    dispatch_version: int
    samples: list[Sample] = []


class BufferState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the buffer holds, as plain data (part of a checkpoint)."""

    next_group: int
    next_batch: int
    trained: int
    dropped: dict[str, int]
    groups: list[GroupState]
    """In flight or ready, in dispatch order."""
    ready: list[int]
    """Complete groups in completion order."""


class SampleBuffer:
    def __init__(
        self,
        *,
        group_size: int,
        groups_per_batch: int,
        batches_per_version: int,
        max_staleness: int,
        on_stale: str = "wait",
    ) -> None:
        if on_stale not in ("wait", "drop"):
            raise ValueError(f"on_stale must be 'wait' or 'drop', got {on_stale!r}")
        self.group_size = group_size
        self.groups_per_batch = groups_per_batch
        self.groups_per_version = groups_per_batch * batches_per_version
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self._groups: dict[int, Group] = {}  # in flight or ready, by group id (= dispatch order)
        self._ready: dict[int, None] = {}  # complete groups in completion order
        self._prefix: dict[int, None] = {}  # wait mode: the leading run of ready groups, in dispatch order
        self._scan = 0  # wait mode: the first group id not yet looked at for _prefix
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
        )

    # -- dispatch side ---------------------------------------------------------------
    @property
    def dispatched(self) -> int:
        return self._next_group

    def capacity(self, version: int) -> int:
        """Groups that may still start on weights of ``version``."""
        limit = (self.max_staleness + version + 1) * self.groups_per_version
        return limit - (self._next_group - sum(self.dropped.values()))

    def open(self, prompt: PromptSpec, version: int) -> Group:
        g = Group(self._next_group, prompt, self.group_size, version)
        self._groups[g.group_id] = g
        self._next_group += 1
        return g

    def add(self, sample: Sample) -> bool:
        """Record a finished sample; True when it completes its group. Samples of unknown
        (dropped or trained) groups are ignored and return False."""
        sample.check()
        g = self._groups.get(sample.group_id)
        if g is None or g.complete:
            return False
        g.samples[sample.sample_id] = sample
        if g.complete:
            self._ready[g.group_id] = None
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
        """In drop mode, drop ready groups already past the bound; return them."""
        if self.on_stale != "drop":
            return []
        stale = [self._groups[i] for i in self._ready if self.staleness(self._groups[i], version) > self.max_staleness]
        for g in stale:
            self.drop(g.group_id, "stale")
        return stale

    def _candidates(self) -> dict[int, None]:
        """Groups that may be taken, in taking order: drop mode, every ready group by
        completion; wait mode, oldest first up to the first group still in flight."""
        if self.on_stale == "drop":
            return self._ready
        groups, scan = self._groups, self._scan
        while scan < self._next_group:
            if scan in groups:
                if scan not in self._ready:
                    break
                self._prefix[scan] = None
            scan += 1
        self._scan = scan
        return self._prefix

    def ready_batches(self) -> int:
        return len(self._candidates()) // self.groups_per_batch

    def formable(self, skip: int = 0) -> list[list[Group]]:
        """The mini-batches that could be taken now, in taking order (before staleness
        checks at take time), but for the first ``skip``."""
        g = self.groups_per_batch
        c = list(islice(self._candidates(), skip * g, None))
        return [[self._groups[i] for i in c[k : k + g]] for k in range(0, len(c) - g + 1, g)]

    @property
    def batches_taken(self) -> int:
        return self._next_batch

    @property
    def ready_samples(self) -> int:
        return len(self._ready) * self.group_size

    def take(self, version: int) -> tuple[Batch | None, list[Group]]:
        """The next mini-batch for a trainer at ``version`` (None if not ready) and the
        groups dropped on the way for staleness."""
        dropped = self.prune(version)
        cands = list(islice(self._candidates(), self.groups_per_batch))
        if len(cands) < self.groups_per_batch:
            return None, dropped
        late = [gid for gid in cands if self.staleness(self._groups[gid], version) > self.max_staleness]
        if late:  # cannot happen in wait mode while the gate holds; never train them anyway
            for gid in late:
                dropped.append(self._groups[gid])
                self.drop(gid, "stale")
            batch, more = self.take(version)
            return batch, dropped + more
        groups = [self._groups.pop(gid) for gid in cands]
        for gid in cands:
            del self._ready[gid]
            self._prefix.pop(gid, None)
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

    def drop(self, group_id: int, reason: str) -> Group | None:
        g = self._groups.pop(group_id, None)
        if g is None:
            return None
        self._ready.pop(group_id, None)
        self._prefix.pop(group_id, None)
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
        self._next_group, self._next_batch, self.trained = st.next_group, st.next_batch, st.trained
        self._prefix, self._scan = {}, min(self._groups, default=self._next_group)
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


class AccountingError(RuntimeError):
    """The buffer's books do not balance (a bug: a group was lost or counted twice)."""
