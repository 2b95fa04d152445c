"""The closed vocabularies of the bus: modes, kinds, states and reasons.

Invariant: every field that takes one of a fixed set of values is typed with one of these
``Literal`` types, so msgspec refuses any other value when bytes are decoded (an actor that
emits an undeclared reason gets its message rejected at the coordinator's boundary, and the
unit tier round-trips every message of its runs through the codec). The values are the
documentation: no docstring lists them a second time.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Mode = Literal["rollout", "trainer", "switching", "down"]
"""Where a replica is: generating (``rollout``), asleep beside the trainer (``trainer``), on its
way between the two (``switching``), or gone (``down``)."""
ReplicaKind = Literal["hybrid", "standalone"]
"""``hybrid``: lives on trainer resources and is lent to rollout; ``standalone``: its own."""
ServingMode = Literal["rollout", "trainer"]
"""The two modes a replica reports having switched into (``ModeChanged``)."""
TrainerActivity = Literal["idle", "training", "publishing", "failed"]
TrainerDriver = Literal["engine", "user"]
"""``engine``: the policy asks for train steps; ``user``: the embedding program trains."""
EndReason = Literal["completed", "stopped", "error"]
AbortReason = Literal["weights_update", "reclaimed", "rebalanced", "replica_down", "shutdown", "failed"]
"""Why a generation was cut: new weights on the same replica (it resumes there); the replica
went back to the trainer (``reclaimed``) or shed load (``rebalanced``) or died
(``replica_down``) — the partial resumes elsewhere; the run is shutting down; or the sample's
reward function raised (``failed``, its group dropped: in logs written before a failed reward
scored 0.0 — see ``RewardFailure``)."""
DropReason = Literal["stale", "failed", "run_end"]
"""Why a prompt group left the buffer untrained: past the staleness bound (``on_stale =
"drop"``), a generation or reward failure, or still in flight when the run ended."""
FinishReason = Literal["", "stop", "length", "abort"]
"""How a sample's generation ended (``abort``: a partial, cut before its end)."""
WeightUpdate = Literal["abort", "keep"]
"""How a replica takes new weights while it generates: ``abort`` cuts every running request,
swaps the weights and resumes each from prompt + prefix (re-prefilled on the new weights);
``keep`` pauses them with their KV cache, swaps, and lets them go on (tokens after the swap
come from the new weights attending to context computed by the old — PipelineRL's in-flight
update; no re-prefill)."""
RewardFailure = Literal["", "raised", "returned", "timeout"]
"""Why a sample's reward is 0.0 without being scored: the reward function raised, returned
something other than a finite number, or outlived ``task.reward_timeout_s`` ("": it was scored)."""
EnvFailure = Literal["raised", "returned", "timeout"]
"""Why an environment call failed: ``reset``, ``step`` or ``close`` raised, ``step`` returned
something other than a valid ``StepResult``, or the call outlived ``task.env_timeout_s``. A failed
``reset`` or ``step`` ends the trajectory where it is (scored as it stands); a failed ``close``
is reported and the sample goes on as it would have."""
WorkerLoss = Literal["died", "hung"]
"""How a reward worker was lost under a replica's calls: its process died (a reward that exits,
segfaults, runs out of memory; a ``kill -9``), or it stopped answering a ping and was killed (a
reward holding the interpreter in C code)."""
EnvCall = Literal["", "init", "reset", "step", "close"]
"""Which call of the user's environment failed (``init``: its constructor; "": not recorded, an
event from an older log)."""
WaitOutcome = Literal["placed", "gave_up"]
"""How a wait for room in the Ray cluster ended (``replica.waited``, ``trainer.waited``): room was
found and the component starts now, or the deadline passed first."""
StatePart = Literal["optimizer", "params", "grads"]
"""What of the trainer's state may be moved off its device and back."""
RejectReason = Literal[
    "unknown_replica",
    "busy",
    "no_batch",
    "unknown_batch",
    "already_trained",
    "nothing_new",
    "not_current",
    "ending",
    "bad_value",
]
"""Why the coordinator refused an intent (``IntentRejected``)."""

ROLLOUT: Final = "rollout"
TRAINER: Final = "trainer"
SWITCHING: Final = "switching"
DOWN: Final = "down"
HYBRID: Final = "hybrid"
STANDALONE: Final = "standalone"

VOCABULARIES: dict[str, tuple[str, ...]] = {
    name: get_args(t)
    for name, t in (
        ("Mode", Mode),
        ("ReplicaKind", ReplicaKind),
        ("TrainerActivity", TrainerActivity),
        ("TrainerDriver", TrainerDriver),
        ("EndReason", EndReason),
        ("AbortReason", AbortReason),
        ("DropReason", DropReason),
        ("FinishReason", FinishReason),
        ("StatePart", StatePart),
        ("RewardFailure", RewardFailure),
        ("EnvFailure", EnvFailure),
        ("EnvCall", EnvCall),
        ("WorkerLoss", WorkerLoss),
        ("WeightUpdate", WeightUpdate),
        ("RejectReason", RejectReason),
    )
}
