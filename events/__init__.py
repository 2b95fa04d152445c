"""Typed messages on shunter's bus: events (facts), intents (asks) and orders, one codec.

Invariant: this package imports msgspec and the standard library only — never torch, vLLM
or Ray (``tests/unit/test_layers.py``) — so policies and tools that read event logs stay light.
"""

from shunter.events.base import Command, Event, Intent, Message, Order, Stamper, tag_of
from shunter.events.codec import (
    BY_TAG,
    COMMAND_TYPES,
    EVENT_TYPES,
    INTENT_TYPES,
    MESSAGE_TYPES,
    ORDER_TYPES,
    Codec,
    TornLog,
    read_log,
)
from shunter.events.data import Batch, PromptSpec, Sample, SamplingSpec, group_of, sample_id
from shunter.events.intents import (
    LoadWeights,
    Offload,
    Onload,
    PublishWeights,
    Rebalance,
    Stop,
    SwitchToRollout,
    SwitchToTrainer,
    TrainBatch,
    TrainStep,
    Validate,
)
from shunter.events.lifecycle import (
    CheckpointSaved,
    CommandFailed,
    ComponentFailed,
    ComponentPlaced,
    ComponentReady,
    EventRejected,
    IntentRejected,
    LoopIdle,
    PolicyFailed,
    PolicySlow,
    RunEnded,
    RunResumed,
    RunStarted,
)
from shunter.events.orders import (
    EnterRollout,
    EnterTrainer,
    Generate,
    InstallWeights,
    JoinWeightGroup,
    LeaveWeightGroup,
    OffloadState,
    OnloadState,
    Publish,
    RunValidation,
    SaveCheckpoint,
    SendWeights,
    ShedGroups,
    Train,
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
