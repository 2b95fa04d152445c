"""``now``: the clock a replica measures its durations on (weight loads, mode switches,
validations, environment steps).

Invariant: it is the running loop's clock — monotonic in real runs, virtual in a simulation
(``shunter.bench``) — never the wall clock events are stamped with (the ``Stamper``'s).
"""

from __future__ import annotations

import asyncio


def now() -> float:
    """Durations are measured on the running loop's clock: monotonic in real runs,
    virtual in a simulation (``shunter.bench``)."""
    return asyncio.get_running_loop().time()
