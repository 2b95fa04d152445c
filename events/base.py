"""The message bases and their envelope.

Invariant: every message is a frozen, keyword-only msgspec Struct with an explicit,
stable tag in the ``kind`` field (``"rollout.sample_end"``), never the class name. The tag
is the message's name everywhere: on the wire, in structlog's ``event`` key and as the
prefix of the metrics it produces. A breaking change to a message gets a new tag.

Three kinds of message travel on the bus:

- ``Event``: a fact that happened (``SampleEnd``, ``WeightsLoaded``). Components and the
  coordinator emit them; the coordinator applies them, the policy reads them.
- ``Intent``: what a policy or a user asks the coordinator for (``SwitchToRollout``,
  ``TrainStep``, ``PublishWeights``). Complete as written: no field is left for someone
  else to fill in.
- ``Order``: what the coordinator (or its executor) tells one component to do
  (``Generate``, ``EnterRollout``, ``Train``). Only the coordinator's side builds them; a
  policy that returns one gets it refused, and a component takes nothing else.

``Intent`` and ``Order`` share the base ``Command``. All carry the same small envelope,
stamped by a :class:`Stamper` in the process that emits them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, TypeVar

import msgspec


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", omit_defaults=True):
    """Envelope shared by every message."""

    run_id: str = ""
    """The run this message belongs to; two runs in one Ray cluster never mix."""
    source: str = ""
    """Who emitted it: ``coordinator``, ``trainer``, ``standalone-0``, ``policy``, ``user`` ..."""
    seq: int = 0
    """Monotonic per source (starts at 1 once stamped)."""
    wall_time: float = 0.0
    """When it was stamped, on the emitter's clock (``time.time()``; virtual in a simulation)."""

    role: ClassVar[str] = "message"


class Event(Message, frozen=True, kw_only=True):
    """A fact: something that happened."""

    role: ClassVar[str] = "event"
    to_policy: ClassVar[bool] = True
    """False for facts about the policy itself (``PolicyFailed``, ``PolicySlow``): they are
    recorded but never handed to the policy, so a failing policy cannot feed on its own errors."""


class Command(Message, frozen=True, kw_only=True):
    """Base of intents and orders: something someone wants done."""

    role: ClassVar[str] = "command"


class Intent(Command, frozen=True, kw_only=True):
    """What a policy or a user asks the coordinator for; the coordinator turns it into orders
    or refuses it with ``IntentRejected``."""

    role: ClassVar[str] = "intent"


class Order(Command, frozen=True, kw_only=True):
    """What the coordinator gives one component to carry out; its outcome comes back as events."""

    role: ClassVar[str] = "order"


M = TypeVar("M", bound=Message)


def tag_of(cls_or_msg: type[Message] | Message) -> str:
    """The stable wire tag of a message class or instance."""
    cls = cls_or_msg if isinstance(cls_or_msg, type) else type(cls_or_msg)
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str):
        raise TypeError(f"{cls.__name__} has no explicit string tag")
    return tag


class Stamper:
    """Stamps the envelope of outgoing messages for one source (per process, not shared)."""

    def __init__(self, run_id: str, source: str, clock: Callable[[], float] = time.time) -> None:
        self.run_id = run_id
        self.source = source
        self.clock = clock
        """Where ``wall_time`` comes from (a simulation passes its virtual clock)."""
        self._seq = 0

    def __call__(self, msg: M) -> M:
        self._seq += 1
        return msgspec.structs.replace(
            msg, run_id=self.run_id, source=self.source, seq=self._seq, wall_time=self.clock()
        )

    @property
    def seq(self) -> int:
        return self._seq
