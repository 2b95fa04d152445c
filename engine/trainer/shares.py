"""Which samples of a mini-batch each trainer rank trains: shares balanced by tokens.

Invariants: every sample is in exactly one rank's share; each share keeps the batch's order;
every rank computes the same shares from the same batch (a pure function: the ranks agree
without a collective); shares are balanced by the tokens they hold, not by their count —
the longest sample goes first to the rank holding the fewest tokens (ties: the lower rank),
so no rank holds more than the mean plus one sample's tokens. A sharded step's time is its
slowest rank's: a count split of a long-tailed batch leaves one rank with most of the tokens.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def token_shares(tokens: Sequence[int], world: int) -> list[list[int]]:
    """Sample indices for each of ``world`` ranks, given each sample's token count."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    heap = [(0, r) for r in range(world)]  # (tokens held, rank)
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        held, r = heapq.heappop(heap)
        shares[r].append(i)
        heapq.heappush(heap, (held + tokens[i], r))
    return [sorted(s) for s in shares]


def micro_steps(shares: Sequence[Sequence[int]], size: int) -> int:
    """Forward/backward passes every rank takes in one step: the most any share needs at
    ``size`` samples a pass (0: the whole share at once), at least one. Every rank takes the
    same number — each pass is a collective of the sharded model (its gathers and gradient
    reductions) — a rank with fewer samples fills in with passes that weigh nothing."""
    most = max((len(s) for s in shares), default=0)
    if most == 0:
        return 1
    return 1 if size <= 0 else max(1, math.ceil(most / size))
