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

from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.groups import BufferState
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.state import EngineState
from shunter.engine.coordinator.tally import Tally
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
    rewards_scored: int = 0
    reward_failures: dict[str, int] = {}
    env_steps: int = 0
    env_failures: dict[str, int] = {}
    workers_lost: dict[str, int] = {}


def encode(snap: CoordinatorSnapshot) -> bytes:
    return msgspec.msgpack.encode(snap)


def decode(data: bytes) -> CoordinatorSnapshot:
    return msgspec.msgpack.decode(data, type=CoordinatorSnapshot)


class PolicyStateError(Exception):
    """The policy's ``snapshot()`` raised or returned something that is not plain data."""


def policy_state(policy: Any) -> dict[str, Any]:
    """``policy.snapshot()``, checked to be plain data a checkpoint can hold."""
    shown = getattr(policy, "wrapped", policy)
    label = f"{type(shown).__module__}.{type(shown).__qualname__}"
    try:
        state = policy.snapshot()
        msgspec.msgpack.encode(state)
    except Exception as e:  # noqa: BLE001 - the policy is user code: name it
        raise PolicyStateError(
            f"policy {label}.snapshot() cannot be saved in a checkpoint: {type(e).__name__}: {e} "
            "(its State must hold plain data: numbers, strings, lists, dicts, Structs)"
        ) from e
    if not isinstance(state, dict):
        raise PolicyStateError(f"policy {label}.snapshot() returned {type(state).__name__}, not a dict")
    return state


def take(
    state: EngineState, buffer: SampleBuffer, inflight: InFlight, policy: Any, tally: Tally
) -> CoordinatorSnapshot:
    """The coordinator's state now (called at a cut: right after a publish)."""
    t = state.trainer
    return CoordinatorSnapshot(
        run_id=state.run_id,
        step=t.step,
        version=t.version,
        prompts_taken=inflight.prompts_taken,
        buffer=buffer.snapshot(),
        in_flight=inflight.unfinished(),
        policy=policy_state(policy),
        tokens=tally.tokens,
        wall_s=tally.wall_s(),
        rewards=list(tally.rewards),
        validations=list(tally.validations),
        failed_groups=tally.failed_groups,
        rewards_scored=tally.rewards_scored,
        reward_failures=dict(tally.reward_failures),
        env_steps=tally.env_steps,
        env_failures=dict(tally.env_failures),
        workers_lost=dict(tally.workers_lost),
    )


def restore(
    snap: CoordinatorSnapshot, state: EngineState, buffer: SampleBuffer, inflight: InFlight, policy: Any, tally: Tally
) -> None:
    """Put a snapshot back into the parts of a coordinator that has not started: buffer, samples
    in flight, prompt stream, trainer step and version, the policy's state, the tallies. (What the
    checkpoint cuts and the finale take from it, the coordinator hands them.)"""
    buffer.restore(snap.buffer)
    inflight.restore(snap.in_flight, snap.prompts_taken)
    t = state.trainer
    t.step, t.version, t.steps_since_publish = snap.step, snap.version, 0
    if snap.policy:
        policy.restore(snap.policy)
    tally.restore(
        tokens=snap.tokens,
        rewards=snap.rewards,
        validations=snap.validations,
        failed_groups=snap.failed_groups,
        wall_s=snap.wall_s,
    )
    tally.rewards_scored = snap.rewards_scored
    tally.reward_failures.update(snap.reward_failures)
    tally.env_steps = snap.env_steps
    tally.env_failures.update(snap.env_failures)
    tally.workers_lost.update(snap.workers_lost)
