"""``CoordinatorSnapshot``: the coordinator's part of a checkpoint, as plain data.

Invariant: a snapshot is taken at one cut — right after a publish, when the trainer holds
exactly the weights of ``version`` and no train step is in flight — so together with the
trainer's state of the same step it describes a run that can go on: every group
dispatched is in the buffer (in flight or ready), trained or dropped; every sample still
in flight is listed in ``in_flight`` (with the prefix the coordinator holds, or none),
and resumes from it; the prompt stream goes on after ``prompts_taken``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shunter.engine.buffer import BufferState
from shunter.events import Sample, ValidateEnd

SNAPSHOT_FILE = "coordinator.msgpack"


class CoordinatorSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    step: int
    version: int
    prompts_taken: int
    buffer: BufferState
    in_flight: list[Sample]
    """Samples of in-flight groups not finished at the cut: each resumes from its prefix
    (an empty one starts over)."""
    policy: dict[str, Any] = {}
    """``Policy.snapshot()``; handed to ``Policy.restore()`` on resume."""
    tokens: int = 0
    wall_s: float = 0.0
    rewards: list[float] = []
    validations: list[ValidateEnd] = []
    failed_groups: int = 0


def encode(snap: CoordinatorSnapshot) -> bytes:
    return msgspec.msgpack.encode(snap)


def decode(data: bytes) -> CoordinatorSnapshot:
    return msgspec.msgpack.decode(data, type=CoordinatorSnapshot)
