"""The two message bases and their envelope.

Invariant: every message is a frozen, keyword-only msgspec Struct with an explicit,
stable tag in the ``kind`` field (``"rollout.sample_end"``), never the class name. The tag
is the message's name everywhere: on the wire, in structlog's ``event`` key and as the
prefix of the metrics it produces. A breaking change to a message gets a new tag.

``Event`` is a fact that happened; ``Command`` an intent that an executor carries out
(and whose outcome comes back as events). Both carry the same small envelope, stamped
by an :class:`Stamper` in the process that emits them.
"""

from __future__ import annotations

import time
from typing import ClassVar, TypeVar

import msgspec


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", omit_defaults=True):
    """Envelope shared by events and commands."""

    run_id: str = ""
    """The run this message belongs to; two runs in one Ray cluster never mix."""
    source: str = ""
    """Who emitted it: ``coordinator``, ``trainer``, ``rollout-3``, ``user`` ..."""
    seq: int = 0
    """Monotonic per source (starts at 1 once stamped)."""
    wall_time: float = 0.0
    """``time.time()`` when it was stamped."""

    role: ClassVar[str] = "message"


class Event(Message, frozen=True, kw_only=True):
    """A fact: something that happened. Policies read events; they never emit them."""

    role: ClassVar[str] = "event"


class Command(Message, frozen=True, kw_only=True):
    """An intent: what a policy (or a user) wants done next."""

    role: ClassVar[str] = "command"


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

    def __init__(self, run_id: str, source: str, clock=time.time) -> None:
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
