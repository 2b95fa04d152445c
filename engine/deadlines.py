"""Which ready prompt groups the next mini-batches take under ``on_stale = "wait"``: finished
groups in completion order, as far as the staleness bound allows; the oldest first only where
the bound requires it (earliest deadline first).

The rule it keeps: no group the capacity gate admitted is ever trained past
``max_staleness`` while the trainer publishes once every ``batches_per_version``
mini-batches (or less often). A group of *level* ``m`` (the oldest weight version any of its
tokens came from, its dispatch version at most) may train on trainer versions up to
``m + max_staleness``. Taking a batch that leaves more groups of levels ``<= m`` than the
batches still training on versions ``<= m + max_staleness`` can hold would break the rule
later, so each batch must hold at least ``req(m)`` groups of levels ``<= m``::

    req(m) = untrained(<= m) - B * slots_after(m + max_staleness)

where ``untrained`` counts the groups in flight or ready, ``slots_after(X)`` the batches after
this one that train on versions ``<= X`` and ``B`` the groups per batch. Groups not started
yet need no term: with ``G = B * batches_per_version`` groups a version, the trainer's pace
leaves ``(m + max_staleness + 1) * G - trained`` slots through version ``m + max_staleness``,
and the gate (a start on weights ``w`` only while ``started - dropped < (max_staleness + w +
1) * G``) caps every group that ever starts on weights ``<= m``, trained ones included, at
``(max_staleness + m + 1) * G`` — so those yet to start fit in the slots the untrained ones
leave.

A batch meets every ``req`` from the lowest level up (oldest level first, completion order
within a level), then fills with the groups that finished first; if a requirement names
groups still generating, no batch is formable and the trainer waits for them.

Why: a strictly oldest-first trainer waits for the longest sample of every batch — under
long-tailed lengths the first batch alone waits for its longest sample in a busy fleet,
while the groups that finished first sit ready. Here a batch waits only for a group whose
deadline has come.

Left to the caller's check at take time (a group trained past the bound is dropped, never
trained): a publish sooner than every ``batches_per_version`` batches, a group dropped and
its slot refilled at an older version, a sample resumed on a replica with older weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple


class Pace(NamedTuple):
    """Where the trainer stands, and how it moves on."""

    version: int
    """The trainer's weight version now."""
    taken_at_version: int
    """Mini-batches already taken on ``version``."""
    batches_per_version: int
    max_staleness: int
    groups_per_batch: int

    @property
    def first(self) -> int:
        """Batches from now on (the next one included) that train on ``version``."""
        return max(1, self.batches_per_version - self.taken_at_version)

    def version_of(self, i: int) -> int:
        """The trainer version the ``i``-th batch from now (0: the next) trains on."""
        return self.version if i < self.first else self.version + 1 + (i - self.first) // self.batches_per_version

    def slots_after(self, last_version: int, i: int) -> int:
        """Batches after the ``i``-th from now that train on versions ``<= last_version``."""
        if last_version < self.version:
            return 0
        through = self.first + (last_version - self.version) * self.batches_per_version
        return max(0, through - (i + 1))


def plan(
    pace: Pace, levels: Mapping[int, int], ready: Iterable[tuple[int, int]], max_batches: int | None = None
) -> list[list[int]]:
    """The mini-batches formable now, in taking order, each a list of group ids.

    ``levels``: level -> groups in flight or ready; ``ready``: (group id, level) of every
    ready group in completion order. A ready group already past the bound for a batch is never put in it (the
    caller drops such groups at take time)."""
    B, eta = pace.groups_per_batch, pace.max_staleness
    order = list(ready)
    by_level: dict[int, list[int]] = {}
    for gid, lv in order:
        by_level.setdefault(lv, []).append(gid)
    heads = dict.fromkeys(by_level, 0)  # per level: before it, every group is taken
    level_of = dict(order)
    counts = dict(levels)
    taken: set[int] = set()
    batches: list[list[int]] = []
    cursor = 0  # into ``order``: before it, every group is taken or late
    most = len(order) // B if max_batches is None else min(max_batches, len(order) // B)
    while len(batches) < most:
        i = len(batches)
        floor = pace.version_of(i) - eta  # groups of lower levels are late for this batch
        picks: list[int] = []
        cum = 0
        # req(level) peaks at levels that hold groups (between them only the slots grow)
        for lv in sorted(k for k in counts if k >= floor and counts[k] > 0):
            cum += counts[lv]
            req = min(B, cum - B * pace.slots_after(lv + eta, i))
            while len(picks) < req:
                gid = _oldest_ready(by_level, heads, taken, floor, lv)
                if gid is None:
                    return batches  # a group whose deadline has come is still generating
                picks.append(gid)
                taken.add(gid)
        while len(picks) < B and cursor < len(order):
            gid, lv = order[cursor]
            cursor += 1
            if gid not in taken and lv >= floor:
                picks.append(gid)
                taken.add(gid)
        if len(picks) < B:
            break
        for gid in picks:
            counts[level_of[gid]] -= 1
        batches.append(picks)
    return batches


def _oldest_ready(
    by_level: Mapping[int, list[int]], heads: dict[int, int], taken: set[int], lo: int, hi: int
) -> int | None:
    """The first-finished untaken ready group of the lowest level in ``[lo, hi]``."""
    for lv in sorted(k for k in by_level if lo <= k <= hi):
        gids, k = by_level[lv], heads[lv]
        while k < len(gids) and gids[k] in taken:
            k += 1
        heads[lv] = k
        if k < len(gids):
            return gids[k]
    return None
