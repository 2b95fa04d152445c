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

Left to the caller (the buffer drops a group past the bound at the publish, as it completes
and at take time; it is never trained): a publish sooner than every ``batches_per_version``
batches (a user's loop), a group dropped and its slot refilled at an older version, a sample
resumed on a replica with older weights. A complete group's level is the oldest version its
tokens came from, which is newer than its dispatch version when a replica loaded new weights
before generating it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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
    pace: Pace,
    levels: Mapping[int, int],
    ready_levels: Mapping[int, int],
    ready_by_level: Mapping[int, Iterable[int]],
    ready: Iterable[int],
    level_of: Callable[[int], int],
    max_batches: int | None = None,
) -> list[list[int]]:
    """The mini-batches formable now, in taking order, each a list of group ids.

    ``levels``: level -> groups in flight or ready; ``ready_levels``: level -> ready groups;
    ``ready_by_level``: level -> its ready groups in completion order; ``ready``: every ready
    group in completion order; ``level_of``: a ready group's level. The iterables are walked
    lazily, only as far as the batches formed need. A ready group already past the bound for a
    batch is never put in it (the caller drops such groups at take time)."""
    B, eta = pace.groups_per_batch, pace.max_staleness
    counts, left = dict(levels), dict(ready_levels)
    walkers = {lv: iter(gids) for lv, gids in ready_by_level.items()}
    fill = iter(ready)
    taken: set[int] = set()
    batches: list[list[int]] = []
    most = sum(left.values()) // B if max_batches is None else max_batches
    while len(batches) < most:
        i = len(batches)
        floor = pace.version_of(i) - eta  # groups of lower levels are late for this batch
        picks: list[int] = []
        cum = avail = 0
        # req(level) peaks at levels that hold groups (between them only the slots grow)
        for lv in sorted(k for k in counts if k >= floor and counts[k] > 0):
            cum += counts[lv]
            avail += left.get(lv, 0)
            req = min(B, cum - B * pace.slots_after(lv + eta, i))
            if req > avail:
                return batches  # a group whose deadline has come is still generating
            while len(picks) < req:  # the lowest levels first, the first finished within one
                lo = min(k for k in left if floor <= k <= lv and left[k] > 0)
                gid = next(g for g in walkers[lo] if g not in taken)
                picks.append(gid)
                taken.add(gid)
                left[lo] -= 1
        if avail < B:
            return batches
        while len(picks) < B:  # then the first finished of any level the batch may hold
            more = next(fill, None)
            if more is None:
                return batches
            lv = level_of(more)
            if more not in taken and lv >= floor:
                picks.append(more)
                taken.add(more)
                left[lv] -= 1
        for gid in picks:
            counts[level_of(gid)] -= 1
        batches.append(picks)
    return batches


def formable_now(pace: Pace, levels: Mapping[int, int], ready_levels: Mapping[int, int]) -> bool:
    """Whether :func:`plan` would form at least one batch, from counts per level alone: O(levels),
    so a view need not walk the ready groups while a due group still generates."""
    B, eta = pace.groups_per_batch, pace.max_staleness
    floor = pace.version_of(0) - eta
    cum = ready = 0
    for lv in sorted(k for k in levels if k >= floor and levels[k] > 0):
        cum += levels[lv]
        ready += ready_levels.get(lv, 0)
        if min(B, cum - B * pace.slots_after(lv + eta, 0)) > ready:
            return False
    return ready >= B
