"""``Serving``: what one replica serves now — the weight version, the mode, whether samples
may start requests, whether the replica is being emptied, and the lock a validation holds.
``RolloutCore`` holds it; its weights-and-modes part writes it (and the core's shutdown marks
the replica as emptied), the sample runner, the environments and the validation read it.

Invariants: ``version`` is the version of the weights the backend holds (a checkpoint's, on
resume); while ``open`` is clear (a weight load is under way) no sample starts a request; while
``evicting`` is set or ``mode`` is not ``rollout``, a sample leaves the replica instead of
starting one; while a validation holds ``stable``, no weight load swaps the weights.
"""

from __future__ import annotations

import asyncio

from shunter.events.vocab import ServingMode


class Serving:
    def __init__(self, mode: ServingMode, version: int) -> None:
        self.mode = mode
        self.version = version  # of the weights the backend starts with (a checkpoint's, on resume)
        self.open = asyncio.Event()  # clear while a weight load swaps the weights
        self.open.set()
        self.evicting = False  # being emptied: a switch to the trainer, a shutdown
        self.stable = asyncio.Lock()  # held by a validation: no weight swap under it
