"""``InFlight``: the samples being generated — where each runs, what waits to resume — and
the pump that starts new work.

Invariants:

- every sample of a group in the buffer that is neither finished nor dropped is either
  generating on exactly one replica (:attr:`where`) or waiting to resume (:attr:`resumes`);
  so when a replica dies, :meth:`recover` hands back every sample it held (from the prefix
  the coordinator holds, or from scratch), and nothing is lost;
- the dispatcher's per-replica counts equal the samples this object placed there and has
  not yet seen come back (``started`` / ``left`` are the only writers);
- :meth:`pump` starts work only on replicas in the dispatcher with room, resumes before
  new groups, and new groups only while the buffer's staleness gate admits them for the
  chosen replica's weight version — and never on the straggler lane;
- a sample resumes (its prefix kept, or from scratch after its replica died) only on a
  replica serving its group's dispatch version or newer: the gate admitted the group at that
  version and the deadlines (``engine/coordinator/deadlines.py``) count its level from it, so a resume on
  a replica that has not loaded those weights yet would give it older tokens than the rule
  planned for, and wait mode would have to drop it as stale;
- no new group starts once the groups trained, ready and in flight are as many as the run
  will train (:attr:`groups_wanted`): the rollout's last work goes to the groups the last
  steps need, not to groups the end of the run would drop;
- with ``rollout.spread_at_end``, once every group the run trains has started, samples are cut
  off a replica only while another serving replica holds none, down to an even share, one
  spread at a time (:attr:`spreading`), never while resumes wait or a straggler lane runs;
- while replicas are on their way into rollout (``EngineState.joining``), a serving replica
  takes new groups only up to its share of what the gate admits, counting the joiners: the
  first replica awake does not take the work of the whole fleet (a synchronous schedule
  waking every replica at once generates its batch on all of them);
- with a straggler lane (``Consolidate``), the pump moves samples generating on other
  replicas to the lane, those of the oldest groups first (then by when they first started,
  resumes included), once they have run for ``after_s`` — only as many as the lane has room for, counting those cut and
  on their way (:attr:`moving`): a sample is cut only when a slot waits for it. Looking for
  them costs O(1) per pump and O(log samples) per start.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.engine.coordinator.executor import Executor
from shunter.engine.coordinator.groups import Group
from shunter.engine.coordinator.state import EngineState
from shunter.events import (
    CutSamples,
    Generate,
    PromptSpec,
    Sample,
    SampleAborted,
    SamplingSpec,
    group_of,
    sample_id,
)


class InFlight:
    def __init__(
        self,
        state: EngineState,
        buffer: SampleBuffer,
        dispatcher: Dispatcher,
        executor: Executor,
        prompts: Iterator[PromptSpec],
        sampling: SamplingSpec,
        group_size: int,
    ) -> None:
        self.state = state
        self.buffer = buffer
        self.dispatcher = dispatcher
        self.executor = executor
        self.prompts = prompts
        self.sampling = sampling
        self.group_size = group_size
        self.where: dict[str, tuple[str, Sample | None]] = {}
        """sample id -> (replica generating it, the partial it resumed from, if any)."""
        self.resumes: deque[Sample] = deque()
        """Partial samples waiting for a replica, oldest first."""
        self.tail_resumes: deque[Sample] = deque()
        """Partial samples moved off their replica to resume on the straggler lane."""
        self.moving: set[str] = set()
        """Samples cut to move to the straggler lane, not back yet."""
        self.moved = 0
        """Samples sent to resume on the straggler lane after a move so far (the run summary's
        ``rollout/moved_to_lane``)."""
        self.tail_after_s = -1.0
        """Age at which a sample moves to the straggler lane (-1: no lane)."""
        self._born: dict[str, float] = {}  # sample id -> when it first started (lane only)
        self._old: list[tuple[int, float, str]] = []  # heap (group, born, sample id): candidates for the lane
        self._on_replica: dict[int, dict[str, int]] = {}  # group -> replica -> samples generating there
        self.prompts_taken = 0
        self.paused = False
        """Set when the run ends: nothing new starts."""
        self.exhausted = False
        """The prompt stream ended (a dataset's ``data.epochs`` are done): no new group will start."""
        self.groups_wanted: int | None = None
        """Groups the run trains in all (None: no end known, as when a user's loop trains)."""
        self.spread_at_end = False
        """Once every group the run trains has started, a replica left with nothing takes
        samples off the most loaded ones (``rollout.spread_at_end``)."""
        self.spreading: set[str] = set()
        """Samples cut to spread at the run's end, not back yet (one spread at a time)."""
        self.spread = 0
        """Samples cut to spread at the run's end so far (``rollout/spread_at_end``)."""

    # -- bookkeeping ---------------------------------------------------------------------
    def _started(self, group_id: int, rid: str, n: int) -> None:
        per = self._on_replica.setdefault(group_id, {})
        per[rid] = per.get(rid, 0) + n
        self.dispatcher.started(rid, n)
        self.state.touch(rid)

    def left(self, group_id: int, rid: str, n: int = 1) -> None:
        """``n`` samples of a group are no longer generating on ``rid``."""
        per = self._on_replica.get(group_id, {})
        n = min(n, per.get(rid, 0))
        if n <= 0:
            return
        per[rid] -= n
        if not per[rid]:
            del per[rid]
        if not per:
            self._on_replica.pop(group_id, None)
        self.dispatcher.finished(rid, n)
        self.state.touch(rid)

    def finished(self, sid: str, group_id: int, rid: str) -> None:
        """A sample came back from ``rid`` (finished, or cut with its partial)."""
        self.where.pop(sid, None)
        self.left(group_id, rid)

    def done(self, sid: str) -> None:
        """A sample finished (or failed) for good."""
        self._born.pop(sid, None)
        self.moving.discard(sid)
        self.spreading.discard(sid)

    def requeue(self, partial: Sample) -> None:
        """A partial that left its replica resumes elsewhere (if its group is still wanted): on
        the straggler lane if it was cut to move there."""
        sid = partial.sample_id
        self.spreading.discard(sid)
        if sid in self.moving:
            self.moving.discard(sid)
            if self.buffer.group(partial.group_id) is not None:
                self.tail_resumes.append(partial)
            return
        if self.buffer.group(partial.group_id) is not None:
            self.resumes.append(partial)

    def consolidate(self, after_s: float) -> None:
        """Move samples older than ``after_s`` to the straggler lane (< 0: no lane)."""
        self.tail_after_s = after_s
        if after_s < 0:
            self._old, self._born = [], {}
            self.resumes.extend(self.tail_resumes)
            self.tail_resumes.clear()

    def _track(self, sid: str, rid: str) -> None:
        """A sample starts on ``rid``: a candidate for the lane if ``rid`` is not on it."""
        if self.tail_after_s < 0:
            return
        born = self._born.setdefault(sid, self.state.now)
        if self.dispatcher.lane(rid) == "bulk":
            heapq.heappush(self._old, (group_of(sid), born, sid))

    def _move_old(self) -> None:
        """Cut the oldest samples off bulk replicas while the lane has a slot for each."""
        room = self.dispatcher.tail_room() - len(self.moving) - len(self.tail_resumes)
        if room <= 0 or not self._old:
            return
        cuts: dict[str, list[str]] = {}
        deadline = self.state.now - self.tail_after_s
        while room > 0 and self._old:
            _, born, sid = self._old[0]
            at = self.where.get(sid)
            if at is None or sid in self.moving or self.dispatcher.lane(at[0]) != "bulk":
                heapq.heappop(self._old)  # finished, moving, or on the lane already
                continue
            if born > deadline:
                break  # the oldest group's next sample is young: wait for it
            heapq.heappop(self._old)
            self.moving.add(sid)
            cuts.setdefault(at[0], []).append(sid)
            room -= 1
        for rid, sids in cuts.items():
            self.executor.send(rid, CutSamples(sample_ids=sids))

    def failed(self, group_id: int, rid: str) -> None:
        """A generation call for ``group_id`` on ``rid`` failed: forget whatever of it runs there."""
        self.left(group_id, rid, 1 << 30)
        for sid in [k for k, (r, _) in self.where.items() if r == rid and group_of(k) == group_id]:
            del self.where[sid]

    def recover(self, rid: str) -> list[SampleAborted]:
        """A replica died: every sample it was generating comes back as a partial to resume
        elsewhere (the prefix the coordinator holds, or none), as ``replica_down`` facts."""
        out = []
        for sid, (where, partial) in list(self.where.items()):
            if where != rid:
                continue
            gid = partial.group_id if partial is not None else group_of(sid)
            g = self.buffer.group(gid)
            if g is None:
                self.where.pop(sid)
                continue
            p = partial or self.fresh(sid, gid, g.prompt.prompt_id)
            out.append(
                SampleAborted(
                    sample_id=sid,
                    group_id=gid,
                    replica_id=rid,
                    reason="replica_down",
                    tokens=len(p.token_ids),
                    partial=p,
                )
            )
        return out

    def fresh(self, sid: str, gid: int, prompt_id: int) -> Sample:
        """A sample with no tokens yet, to be generated from the start."""
        return Sample(
            sample_id=sid, group_id=gid, prompt_id=prompt_id, prompt_token_ids=[], max_tokens=self.sampling.max_tokens
        )

    def unfinished(self) -> list[Sample]:
        """Every sample of an in-flight group not finished yet, with the prefix held for it
        (a checkpoint's ``in_flight``): waiting resumes, resumed partials, or fresh starts."""
        waiting = {p.sample_id: p for p in self.resumes}
        waiting.update({p.sample_id: p for p in self.tail_resumes})
        out = []
        for g in self.buffer.groups():
            for k in range(g.n):
                sid = sample_id(g.group_id, k)
                if sid in g.samples:
                    continue
                partial = waiting.get(sid) or self.where.get(sid, ("", None))[1]
                out.append(partial or self.fresh(sid, g.group_id, g.prompt.prompt_id))
        return out

    def restore(self, in_flight: list[Sample], prompts_taken: int) -> None:
        """Continue from a checkpoint: its unfinished samples wait to resume; the prompt
        stream skips what was taken."""
        self.resumes = deque(p for p in in_flight if self.buffer.group(p.group_id) is not None)
        skip = getattr(self.prompts, "skip", None)  # a dataset's stream moves on in O(1)
        if callable(skip):
            skip(prompts_taken)
        else:
            for _ in range(prompts_taken):
                next(self.prompts, None)
        self.prompts_taken = prompts_taken

    # -- the pump ------------------------------------------------------------------------
    def _resume(self, p: Sample, g: Group, rid: str) -> None:
        """Resume a partial sample of group ``g`` on ``rid``."""
        self._started(g.group_id, rid, 1)
        self.where[p.sample_id] = (rid, p)
        self._track(p.sample_id, rid)  # a no-op on the lane: the lane's samples stay there
        self.executor.send(rid, Generate(group_id=g.group_id, prompt=g.prompt, n=0, sampling=self.sampling, resume=[p]))

    def _join_share(self) -> int | None:
        """Samples a serving replica may hold while others join rollout (None: none joining):
        the groups in flight plus those the gate admits now, spread over serving and joining."""
        joining = len(self.state.joining)
        if not joining:
            return None
        groups = self.buffer.in_flight + max(0, self.buffer.capacity(self.state.trainer.version))
        replicas = self.dispatcher.size() + joining
        return -(-groups // replicas) * self.group_size

    def startable(self) -> int:
        """Samples the pump could start as new groups now: the groups the gate admits on the
        trainer's weights, no more than the run still wants (0 while paused or out of prompts)."""
        if self.paused or self.exhausted:
            return 0
        groups = max(0, self.buffer.capacity(self.state.trainer.version))
        left = self.groups_left()
        return (groups if left is None else min(groups, left)) * self.group_size

    def groups_left(self) -> int | None:
        """Groups still to start before the run has every group it trains (None: no end known)."""
        if self.groups_wanted is None:
            return None
        b = self.buffer
        return max(0, self.groups_wanted - (b.trained + b.in_flight + b.ready))

    def all_started(self) -> bool:
        """Every group the run will train has started (or the prompts ran out): no new group
        starts until one is dropped."""
        return self.exhausted or self.groups_left() == 0

    def _spread(self) -> None:
        """The run's end: while a serving replica holds nothing, the replicas holding more than
        an even share (the in-flight samples over the serving replicas, rounded up) are cut
        down to it, the most recent groups' samples first (their prefixes, prefilled again
        where they resume, are the shortest); the cut samples resume on the least loaded. One
        spread at a time (until its samples are back), none while resumes wait or a straggler
        lane runs (the lane is the run's tail policy then)."""
        if self.resumes or self.spreading or self.tail_after_s >= 0:
            return
        d = self.dispatcher
        ids = d.active()
        if len(ids) < 2 or all(d.in_flight(r) for r in ids):
            return
        share = -(-d.total_in_flight // len(ids))
        over = {r: n - share for r in ids if (n := d.in_flight(r)) > share}
        if not over:
            return
        held: dict[str, list[str]] = {}
        for sid, (rid, _) in self.where.items():
            if rid in over and sid not in self.moving:
                held.setdefault(rid, []).append(sid)
        for rid, sids in held.items():
            sids.sort(key=group_of, reverse=True)
            cut = sids[: over[rid]]
            self.spreading.update(cut)
            self.spread += len(cut)
            self.executor.send(rid, CutSamples(sample_ids=cut))

    def pump(self) -> None:
        """Start what can start: resumes first, then new groups while the gate admits them."""
        if self.paused:
            return
        d, n = self.dispatcher, self.group_size
        while self.tail_resumes:
            p = self.tail_resumes[0]
            g = self.buffer.group(p.group_id)
            if g is None:
                self.tail_resumes.popleft()
                continue
            rid = d.pick(1, "tail", at_least=g.dispatch_version)
            if rid is None:
                if d.has_tail():
                    break  # a lane slot frees soon
                self.resumes.extend(self.tail_resumes)  # the lane is gone: resume anywhere
                self.tail_resumes.clear()
                break
            self._resume(self.tail_resumes.popleft(), g, rid)
            self.moved += 1
        while self.resumes:
            p = self.resumes[0]
            g = self.buffer.group(p.group_id)
            if g is None:
                self.resumes.popleft()
                continue
            rid = d.pick(1, at_least=g.dispatch_version)
            if rid is None:
                break  # no room, or only replicas still loading the weights it started on
            self._resume(self.resumes.popleft(), g, rid)
        if self.tail_after_s >= 0:
            self._move_old()
        if self.spread_at_end and self.all_started():
            self._spread()
            return
        share = self._join_share()
        while True:
            rid = d.pick(n)
            if rid is None or self.buffer.capacity(self.state.replicas[rid].version) <= 0:
                return
            if share is not None and d.in_flight(rid) + n > share:
                return  # the least loaded holds its share: the rest waits for the replicas joining
            if self.groups_left() == 0:
                return  # enough to finish the run: the replicas' time goes to the groups it needs
            prompt = next(self.prompts, None)
            if prompt is None:
                self.exhausted = True
                return
            self.prompts_taken += 1
            g = self.buffer.open(prompt, self.state.replicas[rid].version)
            self._started(g.group_id, rid, n)
            for k in range(n):
                sid = sample_id(g.group_id, k)
                self.where[sid] = (rid, None)
                self._track(sid, rid)
            self.executor.send(rid, Generate(group_id=g.group_id, prompt=prompt, n=n, sampling=self.sampling))
