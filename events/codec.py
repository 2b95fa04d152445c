"""One codec for every message on the bus.

Invariant: bytes are decoded only by type — a msgpack ``Decoder`` typed with the union of
all message classes — never unpickled; bytes that do not decode raise
``msgspec.ValidationError`` / ``DecodeError`` (both ``msgspec.MsgspecError``) naming the
cause. Encoders and decoders cannot be pickled, so each process makes its own
(``Codec()`` is cheap and keeps one of each).

Batches of messages travel as one msgpack array (``encode_batch``), so an actor call
carries many events at the cost of one.

Event logs on disk are a sequence of length-prefixed frames (4-byte big-endian length +
one encoded message), readable with :func:`read_log` even if the writer crashed mid-frame
(the torn tail is reported, not silently dropped).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Union

import msgspec

from shunter.events import intents, lifecycle, orders, replicas, rollout, training, validation
from shunter.events.base import Command, Event, Intent, Message, Order, tag_of


def _subclasses(module: ModuleType, base: type) -> list[type]:
    bases = (Event, Command, Intent, Order, Message)
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, base) and obj not in bases and obj.__module__ == module.__name__
    ]


EVENT_TYPES: tuple[type[Event], ...] = tuple(
    cls for m in (lifecycle, rollout, training, replicas, validation) for cls in _subclasses(m, Event)
)
INTENT_TYPES: tuple[type[Intent], ...] = tuple(_subclasses(intents, Intent))
ORDER_TYPES: tuple[type[Order], ...] = tuple(_subclasses(orders, Order))
COMMAND_TYPES: tuple[type[Command], ...] = INTENT_TYPES + ORDER_TYPES
MESSAGE_TYPES: tuple[type[Message], ...] = EVENT_TYPES + COMMAND_TYPES
BY_TAG: dict[str, type[Message]] = {tag_of(cls): cls for cls in MESSAGE_TYPES}

if len(BY_TAG) != len(MESSAGE_TYPES):  # pragma: no cover - guards a programming error
    raise RuntimeError("two message classes share a tag")

AnyMessage = Union[MESSAGE_TYPES]  # type: ignore[valid-type]  # noqa: UP007 - a union built from a tuple

_FRAME = struct.Struct(">I")


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
        body = self._enc.encode(msg)
        return _FRAME.pack(len(body)) + body


class TornLog(ValueError):
    """The log ends in the middle of a frame (the writer stopped mid-write)."""


def whole_frames(data: bytes) -> int:
    """Length of the longest prefix of ``data`` made of whole frames (where a torn tail starts)."""
    pos = 0
    while pos + 4 <= len(data):
        (n,) = _FRAME.unpack_from(data, pos)
        if pos + 4 + n > len(data):
            break
        pos += 4 + n
    return pos


def read_log(path: str | Path, *, strict: bool = False) -> Iterator[Message]:
    """Yield the messages of an event log. A torn last frame raises ``TornLog`` if
    ``strict``, else ends the iteration after the last whole frame."""
    codec = Codec()
    data = Path(path).read_bytes()
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            if strict:
                raise TornLog(f"{path}: torn frame header at byte {pos}")
            return
        (n,) = _FRAME.unpack_from(data, pos)
        if pos + 4 + n > len(data):
            if strict:
                raise TornLog(f"{path}: frame at byte {pos} needs {n} bytes, {len(data) - pos - 4} left")
            return
        yield codec.decode(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
