"""A replica's free KV cache in vLLM's eviction order: which tokens of a preempted sequence's
context are still cached when it is admitted again.

vLLM V1 with prefix caching (on by default) does not forget a preempted request's KV: its
blocks go back to the free queue still hashed, the request's last block first
(``SingleTypeKVCacheManager.free`` frees in reverse order; ``BlockPool.free_blocks`` appends
hashed blocks at the queue's end), and a new block is always taken from the queue's head, the
least recently freed. When the request is admitted again, the blocks of its context still in
the queue are hits: only the rest is prefilled again. Under KV pressure the queue is nearly
empty when a request is preempted, so the growth of the running sequences eats the victim's
context from its end, and what is left when it comes back is a prefix.

The pool is a list of segments, least recently freed first: ``(owner, tokens)``, where
``owner`` is the preempted request whose context the tokens hold, or None for tokens no later
request will hit (a finished or aborted request's context, the cache never filled).

Invariant: the segments' tokens sum to the free KV (``kv_tokens`` minus what is reserved);
an owner has at most one segment, and ``cached(owner)`` is its length — taken from the
segment's tail end first, as vLLM evicts a freed request's tail blocks first.
Left out: block granularity (16 tokens), hits across requests (a group's shared prompt).
"""

from __future__ import annotations

from collections import deque
from typing import Any


class KvPool:
    def __init__(self, free: float) -> None:
        self._segs: deque[list[Any]] = deque([[None, float(free)]] if free > 0 else [])
        self._cached: dict[int, float] = {}  # id(owner) -> tokens still cached

    def free(self) -> float:
        return sum(s[1] for s in self._segs)

    def cached(self, owner: object) -> float:
        return self._cached.get(id(owner), 0.0)

    def take(self, n: float) -> None:
        """Allocate ``n`` tokens (growth, an admission): the least recently freed go first."""
        while n > 0 and self._segs:
            seg = self._segs[0]
            got = min(n, seg[1])
            seg[1] -= got
            n -= got
            if seg[0] is not None:
                self._cached[id(seg[0])] = seg[1]
            if seg[1] <= 1e-9:
                self._segs.popleft()
                if seg[0] is not None:
                    del self._cached[id(seg[0])]

    def give(self, n: float, owner: object = None) -> None:
        """Free ``n`` tokens: a preempted ``owner``'s context (hit if it comes back), or tokens
        nothing will hit (``owner`` None: merged into the newest segment if that has none)."""
        if n <= 0:
            return
        if owner is None and self._segs and self._segs[-1][0] is None:
            self._segs[-1][1] += n
            return
        self.forget(owner)
        self._segs.append([owner, float(n)])
        if owner is not None:
            self._cached[id(owner)] = float(n)

    def reclaim(self, owner: object) -> float:
        """``owner`` is admitted again: its cached tokens leave the pool as hits; returns them."""
        hit = self._cached.pop(id(owner), 0.0)
        if hit:
            for i, seg in enumerate(self._segs):
                if seg[0] is owner:
                    del self._segs[i]
                    break
        return hit

    def forget(self, owner: object) -> None:
        """``owner`` will never be admitted again (aborted): its tokens stay free, never hit."""
        if self._cached.pop(id(owner), None) is None:
            return
        for seg in self._segs:
            if seg[0] is owner:
                seg[0] = None
                break
