"""One codec for every message on the bus.

Invariant: bytes are decoded only by type — a msgpack ``Decoder`` typed with the union of
all message classes — never unpickled; bytes that do not decode raise
``msgspec.ValidationError`` / ``DecodeError`` (both ``msgspec.MsgspecError``) naming the
cause. Encoders and decoders cannot be pickled, so each process makes its own
(``Codec()`` is cheap and keeps one of each).

Batches of messages travel as one msgpack array (``encode_batch``), so an actor call
carries many events at the cost of one.

Event logs on disk (frames of this codec) are read and repaired by ``shunter.events.logfile``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Union

import msgspec

from shunter.events import intents, lifecycle, orders, relay, replicas, rollout, training, validation
from shunter.events.base import Command, Event, Intent, Message, Order, tag_of


def _subclasses(module: ModuleType, base: type) -> list[type]:
    bases = (Event, Command, Intent, Order, Message)
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, base) and obj not in bases and obj.__module__ == module.__name__
    ]


EVENT_TYPES: tuple[type[Event], ...] = tuple(
    cls for m in (lifecycle, rollout, training, replicas, validation, relay) for cls in _subclasses(m, Event)
)
INTENT_TYPES: tuple[type[Intent], ...] = tuple(_subclasses(intents, Intent))
ORDER_TYPES: tuple[type[Order], ...] = tuple(_subclasses(orders, Order))
COMMAND_TYPES: tuple[type[Command], ...] = INTENT_TYPES + ORDER_TYPES
MESSAGE_TYPES: tuple[type[Message], ...] = EVENT_TYPES + COMMAND_TYPES
BY_TAG: dict[str, type[Message]] = {tag_of(cls): cls for cls in MESSAGE_TYPES}

if len(BY_TAG) != len(MESSAGE_TYPES):  # pragma: no cover - guards a programming error
    raise RuntimeError("two message classes share a tag")

AnyMessage = Union[MESSAGE_TYPES]  # type: ignore[valid-type]  # noqa: UP007 - a union built from a tuple


class Codec:
    """Per-process encoder + typed decoders."""

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._one = msgspec.msgpack.Decoder(AnyMessage)
        self._many = msgspec.msgpack.Decoder(list[AnyMessage])

    def encode(self, msg: Message) -> bytes:
        return self._enc.encode(msg)

    def decode(self, data: bytes) -> Message:
        return self._one.decode(data)

    def encode_batch(self, msgs: list[Message]) -> bytes:
        return self._enc.encode(msgs)

    def decode_batch(self, data: bytes) -> list[Message]:
        return self._many.decode(data)

    def frame(self, msg: Message) -> bytes:
        """One event-log frame: the encoded message after its 4-byte big-endian length."""
        body = self._enc.encode(msg)
        return frame_header(body) + body


def frame_header(body: bytes) -> bytes:
    """The 4-byte big-endian length that precedes an encoded message in an event-log frame."""
    return len(body).to_bytes(4, "big")
