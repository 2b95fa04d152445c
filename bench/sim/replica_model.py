"""One simulated inference replica as vLLM V1 schedules it: a pure, event-driven model.

What it models, per decode step of a replica holding ``b`` running sequences whose contexts
(prompt + tokens so far) sum to ``C``::

    step_s = decode_step_s + decode_step_s_per_seq * b + decode_s_per_kv_token * C + prefill part

- **attention grows with context**: every running sequence reads its whole KV cache each step
  (``decode_s_per_kv_token`` per token of context);
- **prefill is the replica's own work** (chunked prefill): a request is prefilled before it
  decodes, ``prefill_s_per_token`` per token plus ``prefill_s_per_token_ctx`` per token per
  token before it (attention, so a context of ``L`` costs ``E*L + F*L**2/2``), first come first
  served, at most what a fresh chunk of ``prefill_chunk_tokens`` costs in each step — a
  resumed sample re-prefills its prompt *and* prefix (after a weight update the prefix cache
  is reset, so nothing is reused);
- **the KV cache is finite** (``kv_tokens``; 0 = unlimited): a request is admitted only when
  its context fits beside what is reserved, and when the running sequences grow past the
  capacity the newest is preempted (vLLM's recompute preemption): its KV is freed, it waits at
  the head of the queue, and when it is admitted again it prefills the part of its context no
  longer cached — vLLM's prefix cache keeps a freed request's blocks until new blocks are
  taken from them, least recently freed first and a request's last block first
  (``shunter.bench.sim.kv_pool``);
- **a pause** (``freeze`` / ``thaw``, a weight update that keeps the KV cache) stops every
  sequence where it is; after it they go on from their cached context.

Left out: prefix-cache hits across requests (a group's samples each prefill their prompt; a
resumed sample its prompt and prefix: the sim's weight updates that abort reset the cache), speculative
decoding, CUDA graphs' batch-size buckets, sampling cost, the KV shared by a group's prompt.

Invariants: between two events (a sequence finishes, a prefill completes, the KV cache fills,
a request arrives or leaves) the batch is fixed, so the time of ``k`` steps is the closed form
``k * step0 + decode_s_per_kv_token * b * k * (k - 1) / 2``; the model jumps from event to event,
never step by step (thousands of replicas stay cheap). Token counts are fluid between events
and exact at them: a request that finishes has produced exactly its target. Every request is
in exactly one of waiting / prefilling / running, and the KV reserved (the contexts of the
running sequences plus those of the ones prefilling) never exceeds ``kv_tokens``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from shunter.bench.sim.kv_pool import KvPool

TOL_S = 2e-6
"""Events this close to the clock are due (the simulated clock ticks in microseconds)."""
_EPS = 1e-9


class ReplicaCost(Protocol):
    decode_step_s: float
    decode_step_s_per_seq: float
    decode_s_per_kv_token: float
    prefill_s_per_token: float
    prefill_s_per_token_ctx: float
    prefill_chunk_tokens: int
    kv_tokens: int


@dataclass
class _Req:
    rid: str
    ctx: int
    """Context to prefill (waiting / prefilling), or the context when it joined (running)."""
    target: int
    """Tokens this request produces in all."""
    made: float = 0.0
    """Tokens produced before it last joined the running batch (earlier preemptions)."""
    g0: float = 0.0
    """The step counter when it joined the running batch."""
    work: float = 0.0
    """Prefill seconds still to do (prefilling)."""
    token: int = 0
    """Identifies its finish entry in the heap (stale entries are skipped)."""
    preempted: bool = False
    """It was preempted: its next prefill recomputes a context it had."""


class Books(NamedTuple):
    """What one replica's time went to, integrated while it worked (``ReplicaModel.books``)."""

    busy_s: float
    """Seconds with a sequence running or prefilling (not frozen)."""
    steps: float
    """Steps taken in those seconds."""
    seq_steps: float
    """Running sequences summed over the steps (the tokens decoded)."""
    kv_steps: float
    """KV tokens reserved summed over the steps."""
    recompute_s: float
    """Prefill seconds spent again on the contexts of preempted sequences (vLLM's recompute)."""

    def packing_s(self, cost: ReplicaCost, max_batch: int) -> float:
        """Seconds of the steps' fixed part (``decode_step_s``) beyond the fewest steps that could
        carry the same tokens and KV: a step holds at most ``max_batch`` sequences and
        ``kv_tokens`` of context (the bound's count, ``shunter.bench.analysis.bound.ModelMachine``). An
        admission that leaves KV free, or a batch that shrinks, takes more steps for the work."""
        need = self.seq_steps / max_batch
        if cost.kv_tokens:
            need = max(need, self.kv_steps / cost.kv_tokens)
        return cost.decode_step_s * max(0.0, self.steps - need)


def prefill_s(cost: ReplicaCost, context: int) -> float:
    """Seconds of prefill a context of ``context`` tokens needs, from nothing cached."""
    return cost.prefill_s_per_token * context + cost.prefill_s_per_token_ctx * context * context / 2


def lone_decode_s(cost: ReplicaCost, prompt: int, length: int) -> float:
    """Seconds a sequence of ``length`` tokens after a ``prompt`` takes decoding alone (no
    prefill): ``length`` steps with one sequence whose context grows from ``prompt``."""
    per = cost.decode_step_s + cost.decode_step_s_per_seq
    return length * per + cost.decode_s_per_kv_token * (length * prompt + length * (length - 1) / 2)


class ReplicaModel:
    """The state of one replica's engine; times in seconds on the caller's clock."""

    def __init__(self, cost: ReplicaCost) -> None:
        if cost.prefill_chunk_tokens <= 0:
            raise ValueError(f"prefill_chunk_tokens must be positive, got {cost.prefill_chunk_tokens}")
        self.cost = cost
        self.chunk_s = prefill_s(cost, cost.prefill_chunk_tokens)
        """Prefill seconds one step carries at most (a fresh chunk's cost)."""
        self.t = 0.0
        self.g = 0.0  # decode steps taken by a sequence running since the start
        self.frozen = False
        self.waiting: deque[_Req] = deque()
        self.prefilling: deque[_Req] = deque()
        self.running: dict[str, _Req] = {}  # in joining order: the last is preempted first
        self._heap: list[tuple[float, int, str]] = []  # (finish step, token, rid)
        self._s0 = 0.0  # sum over running of (ctx - g0): their contexts sum to _s0 + b * g
        self._prefill_ctx = 0  # KV reserved by the requests prefilling
        self._tokens = itertools.count(1)
        self.preemptions = 0
        self.prefilled_s = 0.0
        """Seconds of prefill work done (recomputation included)."""
        self.busy_s = 0.0
        """Seconds with a sequence running or prefilling (not frozen)."""
        self.kv_token_s = 0.0
        """KV tokens reserved, integrated over ``busy_s``: ``kv_token_s / (kv_tokens * busy_s)``
        is how full the cache was while the replica worked (the bound fills it at every step)."""
        self._steps_n = self._seq_steps = self._kv_steps = self._recompute_s = 0.0
        self._pool = KvPool(cost.kv_tokens) if cost.kv_tokens else None
        self.hit_tokens = 0.0
        """Tokens of preempted contexts found still cached when admitted again (not prefilled)."""

    # -- queries ------------------------------------------------------------------------
    def books(self) -> Books:
        return Books(self.busy_s, self._steps_n, self._seq_steps, self._kv_steps, self._recompute_s)

    def __contains__(self, rid: str) -> bool:
        return rid in self.running or any(r.rid == rid for r in (*self.prefilling, *self.waiting))

    @property
    def batch(self) -> int:
        return len(self.running)

    def context(self) -> float:
        """Tokens of context of the running sequences, together."""
        return self._s0 + len(self.running) * self.g

    def reserved(self) -> float:
        return self.context() + self._prefill_ctx

    def made(self, rid: str) -> int:
        """Tokens produced so far by a request (0 if unknown)."""
        r = self.running.get(rid)
        if r is not None:
            return int(r.made + self.g - r.g0 + 1e-6)
        for q in (self.prefilling, self.waiting):
            for r in q:
                if r.rid == rid:
                    return int(r.made + 1e-6)
        return 0

    def step_s(self) -> float:
        """The duration of the next step (0: nothing to do)."""
        b = len(self.running)
        if not b and not self.prefilling:
            return 0.0
        c = self.cost
        return (
            c.decode_step_s
            + c.decode_step_s_per_seq * b
            + c.decode_s_per_kv_token * self.context()
            + (self.chunk_s if self.prefilling else 0.0)
        )

    # -- requests -----------------------------------------------------------------------
    def submit(self, rid: str, context: int, target: int) -> list[tuple[str, int]]:
        """A request with ``context`` tokens to prefill and ``target`` tokens to produce;
        returns what finished on the way (admission may be immediate)."""
        kv = self.cost.kv_tokens
        if kv and context + target > kv:
            raise ValueError(f"request {rid}: {context} + {target} tokens cannot fit a KV cache of {kv} tokens")
        self.waiting.append(_Req(rid, context, target))
        out: list[tuple[str, int]] = []
        self._settle(out)
        return out

    def remove(self, rid: str) -> int | None:
        """Take a request out (an abort); returns the tokens it produced (None: unknown)."""
        r = self.running.pop(rid, None)
        if r is not None:
            n = r.made + self.g - r.g0
            self._release(r.ctx - r.g0 + self.g)
            self._s0 -= r.ctx - r.g0
            if not self.running:
                self._s0, self._heap = 0.0, []
            self._admit()
            return int(n + 1e-6)
        for q in (self.prefilling, self.waiting):
            for r in q:
                if r.rid == rid:
                    q.remove(r)
                    if q is self.prefilling:
                        self._prefill_ctx -= r.ctx
                        self._release(r.ctx)
                    elif self._pool is not None:
                        self._pool.forget(r)
                    self._admit()
                    return int(r.made + 1e-6)
        return None

    def freeze(self, now: float) -> list[tuple[str, int]]:
        out = self.advance_to(now)
        self.frozen = True
        return out

    def thaw(self, now: float) -> None:
        self.t = max(self.t, now)
        self.frozen = False

    # -- time ---------------------------------------------------------------------------
    def next_event_in(self) -> float | None:
        """Seconds from ``self.t`` to the next event (None: idle or frozen)."""
        if self.frozen:
            return None
        k = self._next_k()
        return None if k is None else self._dt(k)

    def advance_to(self, now: float) -> list[tuple[str, int]]:
        """Run the replica up to ``now``; returns ``(rid, tokens)`` of the requests finished."""
        out: list[tuple[str, int]] = []
        while not self.frozen:
            k = self._next_k()
            if k is None:
                break
            dt = self._dt(k)
            if self.t + dt <= now + TOL_S:
                self._steps(k, dt)
                self.t += dt
                self._settle(out)
                continue
            self._steps(self._k_in(now - self.t), now - self.t)
            break
        self.t = max(self.t, now)
        return out

    def _next_k(self) -> float | None:
        """Steps to the next event, or None when there is nothing to run."""
        b = len(self.running)
        if not b and not self.prefilling:
            return None
        ks = []
        if (fin := self._first_finish()) is not None:
            ks.append(max(0.0, fin - self.g))
        if self.prefilling:
            ks.append(self.prefilling[0].work / self.chunk_s)
        kv = self.cost.kv_tokens
        if kv and b:
            ks.append(max(0.0, (kv - self.reserved()) / b))
        return min(ks)

    def _dt(self, k: float) -> float:
        """Seconds of the next ``k`` steps: each is ``decode_s_per_kv_token * b`` longer than the
        one before (every running context grows by a token)."""
        a = self.cost.decode_s_per_kv_token * len(self.running) / 2
        return k * self.step_s() + a * k * (k - 1)

    def _k_in(self, dt: float) -> float:
        """Steps completed in ``dt`` seconds (the inverse of ``_dt``)."""
        if dt <= 0:
            return 0.0
        a = self.cost.decode_s_per_kv_token * len(self.running) / 2
        b = self.step_s() - a
        if a <= 0:
            return dt / self.step_s()
        return 2 * dt / (b + math.sqrt(b * b + 4 * a * dt))

    def _steps(self, k: float, dt: float) -> None:
        """Run ``k`` steps that take ``dt`` seconds (``_dt(k)``, computed by the caller)."""
        if k <= 0:
            return
        b = len(self.running)
        kv = self.reserved() + b * k / 2  # the mean over the k steps: every context grows a token a step
        self.busy_s += dt
        self.kv_token_s += dt * kv
        self._steps_n += k
        self._seq_steps += b * k
        self._kv_steps += k * kv
        if self.prefilling:
            done = min(self.prefilling[0].work, k * self.chunk_s)
            self.prefilling[0].work -= done
            self.prefilled_s += done
        if self.running:
            self.g += k
            if self._pool is not None:
                self._pool.take(b * k)

    def _settle(self, out: list[tuple[str, int]]) -> None:
        """Apply what is due at ``self.t``: finishes, completed prefills, preemption, admission."""
        while (fin := self._first_finish()) is not None and fin <= self.g + _EPS * max(1.0, fin):
            _, _, rid = heapq.heappop(self._heap)
            r = self.running.pop(rid)
            self._release(r.ctx - r.g0 + self.g)
            self._s0 -= r.ctx - r.g0
            out.append((rid, r.target))
        if not self.running:
            self._s0, self._heap = 0.0, []
        while self.prefilling and self.prefilling[0].work <= _EPS:
            r = self.prefilling.popleft()
            self._prefill_ctx -= r.ctx
            self._join(r)
        self._preempt()
        self._admit()

    def _first_finish(self) -> float | None:
        """The step at which the first running sequence finishes (stale heap entries dropped)."""
        while self._heap:
            fin, token, rid = self._heap[0]
            r = self.running.get(rid)
            if r is not None and r.token == token:
                return fin
            heapq.heappop(self._heap)
        return None

    def _join(self, r: _Req) -> None:
        r.g0, r.token = self.g, next(self._tokens)
        self.running[r.rid] = r
        self._s0 += r.ctx - r.g0
        heapq.heappush(self._heap, (self.g + (r.target - r.made), r.token, r.rid))

    def _preempt(self) -> None:
        kv = self.cost.kv_tokens
        while kv and self.running and self.reserved() + len(self.running) > kv + _EPS:
            rid = next(reversed(self.running))
            r = self.running.pop(rid)
            grown = self.g - r.g0
            self._s0 -= r.ctx - r.g0
            if self._pool is not None:
                self._pool.give(r.ctx + grown, owner=r)  # exactly what it held (fluid between events)
            r.made += grown
            r.ctx += round(grown)
            r.preempted = True
            self.waiting.appendleft(r)
            self.preemptions += 1
        if not self.running:
            self._s0, self._heap = 0.0, []

    def _release(self, tokens: float) -> None:
        """A finished or aborted request's KV goes back to the free pool, never hit again."""
        if self._pool is not None:
            self._pool.give(tokens)

    def _admit(self) -> None:
        kv = self.cost.kv_tokens
        while self.waiting:
            r = self.waiting[0]
            if kv and self.reserved() + r.ctx + len(self.running) + 1 > kv + _EPS:
                return
            self.waiting.popleft()
            hit = 0.0
            if self._pool is not None:
                held = self._pool.reclaim(r) if r.preempted else 0.0
                hit = min(held, r.ctx)  # its context was rounded to whole tokens when preempted
                self._pool.give(held - hit)
                self._pool.take(r.ctx - hit)
            r.work = prefill_s(self.cost, r.ctx) - prefill_s(self.cost, hit)  # a cached prefix is not prefilled
            if r.preempted:
                self._recompute_s += r.work
                self.hit_tokens += hit
                r.preempted = False
            if r.work <= 0:
                self._join(r)
            else:
                self.prefilling.append(r)
                self._prefill_ctx += r.ctx
