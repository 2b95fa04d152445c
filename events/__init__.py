"""Typed messages on shunter's bus: events (facts) and commands (intents), one codec.

Invariant: this package imports msgspec only — never torch, vLLM or Ray — so policies
and tools that read event logs stay light.
"""

from shunter.events.base import Command, Event, Message, Stamper, tag_of
from shunter.events.codec import (
    BY_TAG,
    COMMAND_TYPES,
    EVENT_TYPES,
    MESSAGE_TYPES,
    Codec,
    TornLog,
    read_log,
)
from shunter.events.commands import (
    Generate,
    JoinWeightGroup,
    LeaveWeightGroup,
    LoadWeights,
    Offload,
    Onload,
    PublishWeights,
    Rebalance,
    SaveCheckpoint,
    SendWeights,
    Stop,
    SwitchToRollout,
    SwitchToTrainer,
    TrainStep,
    Validate,
)
from shunter.events.data import PromptSpec, Sample, SamplingSpec
from shunter.events.lifecycle import (
    CheckpointSaved,
    CommandFailed,
    ComponentFailed,
    ComponentPlaced,
    ComponentReady,
    EventRejected,
    PolicyFailed,
    RunEnded,
    RunResumed,
    RunStarted,
)
from shunter.events.replicas import RankAssigned, RankReleased, ReplicaDown, ReplicaUp
from shunter.events.rollout import (
    BatchReady,
    GroupDropped,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
)
from shunter.events.training import (
    ModeChanged,
    Offloaded,
    Onloaded,
    StepBegin,
    StepEnd,
    TrainerStateSaved,
    WeightGroupJoined,
    WeightGroupOpened,
    WeightsLoaded,
    WeightsReady,
    WeightsSent,
)
from shunter.events.validation import ValidateBegin, ValidateEnd
from shunter.events.view import BufferView, EngineView, ReplicaView, TrainerView

__all__ = [name for name in dir() if not name.startswith("_")]
