"""Run and component lifecycle facts, and the error facts that keep failures visible.

Invariant: a failure anywhere (a component's setup, a policy that raises or returns junk, bytes
that do not decode, an exception in the coordinator's own loop) becomes one of these events
with its cause as bounded text, never a silently dead loop.
"""

from __future__ import annotations

from typing import ClassVar

from shunter.events.base import Event
from shunter.events.vocab import EndReason, RejectReason, TrainerDriver


class RunStarted(Event, frozen=True, kw_only=True, tag="run.started"):
    """The run begins: every replica of the opening is in the view.

    ``coordinator -> policy, sinks``: the first event a policy sees in a fresh run (setup facts
    such as ``ReplicaUp`` are applied before it but never handed to the policy)."""

    policy: str
    replicas: int
    trainer_driver: TrainerDriver = "engine"


class RunResumed(Event, frozen=True, kw_only=True, tag="run.resumed"):
    """This attempt of the run starts from a checkpoint: model, optimizer, step, version,
    buffer and the prompts in flight at ``step`` are restored; the optimizer steps the
    previous attempt took after it are redone (their batches re-form from the same groups).

    ``coordinator -> policy, sinks``: the first event a resumed attempt's policy sees, after
    ``Policy.restore()``; its replicas are new, in their starting modes."""

    checkpoint: str
    step: int
    version: int
    attempt: int
    reason: str = ""
    """Free text: why the previous attempt ended (empty for a resume asked for by the user)."""
    skipped: dict[str, str] = {}
    """What the checkpoint resolver passed over on the way to ``checkpoint`` (a damaged newer
    checkpoint, a ``latest`` pointer naming another one, a stray folder) -> why. Empty: nothing."""


class RunEnded(Event, frozen=True, kw_only=True, tag="run.ended"):
    """The run is over; nothing is handled after it.

    ``coordinator -> sinks, Engine``: after the finale (``completed`` / ``stopped``), or at once
    on a fatal error — a dead trainer, a policy failing ``run.policy_max_failures`` times in a
    row, an exception anywhere in the coordinator's loop."""

    reason: EndReason
    steps: int = 0
    summary: dict[str, float] = {}
    error: str = ""
    """For ``error``: what happened, naming the component and the cause (bounded in size)."""
    failed_component: str = ""
    """For ``error``: the component whose death ended the run (``trainer``); the ``Engine``
    restarts such a run from its last checkpoint (``run.max_restarts``)."""
    fault: str = ""
    """For an exception in the coordinator's own loop: the stage that raised (``sink:EventLog``,
    ``apply``, ``decide``, ``intent``, ``pump``, ``finale``) and the message being handled."""


class LoopIdle(Event, frozen=True, kw_only=True, tag="coordinator.idle"):
    """Nothing is in flight and no message is waiting: the run moves only if someone acts.

    ``coordinator -> policy, sinks``, at most once between two messages from outside. A policy
    that missed a decision (it failed on the event it should have acted on) can act on the view
    now; one that has nothing to do lets ``run.stall_timeout_s`` end the run."""

    in_flight: int = 0
    """Samples generating (0: none)."""


class CheckpointSaved(Event, frozen=True, kw_only=True, tag="checkpoint.saved"):
    """A checkpoint is committed (renamed into place, ``latest`` updated): a crash from
    now on resumes from here.

    ``coordinator -> policy, sinks`` once the trainer's part (``TrainerStateSaved``) is on disk."""

    step: int
    version: int
    path: str
    nbytes: int
    duration_s: float


class ComponentReady(Event, frozen=True, kw_only=True, tag="component.ready"):
    """A component finished its setup (model loaded, engine started).

    ``Engine -> coordinator``: in the opening of an attempt, and for each replica added later."""

    component: str
    setup_s: float = 0.0


class ComponentPlaced(Event, frozen=True, kw_only=True, tag="component.placed"):
    """Where a component's actor runs: its placement-group bundle (-1: outside any group),
    node (its address, and Ray's id of it: hosts may share an address) and the GPUs Ray gave it.

    ``Engine -> coordinator (executor: which wire a replica gets, which host's relay it is
    behind)``, after its setup."""

    component: str
    bundle: int = -1
    node: str = ""
    gpu_ids: list[str] = []
    node_id: str = ""
    """Ray's node id (hex) of the host it runs on ("": unknown)."""


class ComponentFailed(Event, frozen=True, kw_only=True, tag="component.failed"):
    """A component died or could not start (``trainer``, a replica being added).

    ``executor | Engine -> coordinator``: a dead trainer ends the run (and the ``Engine``
    restarts it from its last checkpoint); a replica that failed to start is only reported."""

    component: str
    error: str


class EventRejected(Event, frozen=True, kw_only=True, tag="coordinator.event_rejected"):
    """Bytes that arrived at the coordinator and did not decode (or an order submitted by a
    user); they were dropped.

    ``coordinator actor -> sinks, policy``, at its boundary (``ingest``, ``submit``)."""

    origin: str
    error: str
    nbytes: int = 0


class IntentRejected(Event, frozen=True, kw_only=True, tag="coordinator.intent_rejected"):
    """The coordinator could not carry an intent out as asked; nothing was sent.

    ``coordinator -> sinks, Engine`` (a waiting ``Engine.train`` / ``publish_weights`` call
    raises or returns with it); never to the policy, whose view already says why."""

    intent_kind: str
    reason: RejectReason
    detail: str = ""
    intent_source: str = ""
    intent_seq: int = 0
    """Envelope of the refused intent, so the one who asked can tell it is theirs."""
    repeats: int = 1
    """For the policy's own intents, identical refusals are counted: the 1st, 10th, 100th … is reported."""

    to_policy: ClassVar[bool] = False  # a policy re-asking on its own refusal would loop


class PolicyFailed(Event, frozen=True, kw_only=True, tag="policy.failed"):
    """The policy raised, or returned something other than a list of intents, while deciding
    on an event; no command was issued for that event.

    ``coordinator -> sinks`` (never to the policy). Identical errors are counted: the first is
    reported, then the 10th, 100th … with ``repeats``; after ``run.policy_max_failures``
    failures in a row the run ends with ``error``."""

    policy: str
    on_kind: str
    error: str
    repeats: int = 1
    """How many times this same error has happened so far."""

    to_policy: ClassVar[bool] = False


class PolicySlow(Event, frozen=True, kw_only=True, tag="policy.slow"):
    """``decide()`` took longer than ``run.policy_budget_ms``: the coordinator's loop (and with
    it every replica's next request) waited that long.

    ``coordinator -> sinks`` (never to the policy), on the 1st, 10th, 100th … slow call."""

    policy: str
    on_kind: str
    decide_ms: float
    budget_ms: float
    slow_calls: int
    calls: int

    to_policy: ClassVar[bool] = False


class LogRepaired(Event, frozen=True, kw_only=True, tag="run.log_repaired"):
    """The event log this attempt appends to was damaged (a tail torn by a kill, a frame
    overwritten …); it was made readable again without losing a byte.

    ``coordinator -> sinks`` (never to the policy), first thing of an attempt that found the
    damage. ``kept_as`` holds the damaged bytes (the whole original when ``whole``)."""

    path: str
    kept_as: str
    frames: int
    """Readable frames kept in the log."""
    whole: bool
    damage: list[str]
    """Each damaged byte range with its cause."""

    to_policy: ClassVar[bool] = False


class CommandFailed(Event, frozen=True, kw_only=True, tag="command.failed"):
    """An order could not be carried out; ``target`` names the component that failed.

    ``component | executor -> coordinator, policy``: a failed generation drops its group; a
    failed weight load or switch takes the replica out (``ReplicaDown``); a trainer failure
    ends the run, unless it was the user's own code (``user_code``), which is only reported
    (a user's loop gets it as ``UserCodeError``)."""

    command_kind: str
    target: str
    error: str
    group_id: int = -1
    """For a failed generation: the prompt group it belonged to (dropped as ``failed``)."""
    batch_id: int = -1
    """For a failed train step: the batch it was given."""
    user_code: str = ""
    """The user's ``"module:name"`` that raised or returned junk (a loss, a reward), if any."""
