"""Bytes in, bytes out: the codec at an actor's boundary.

Invariant: one ``Codec`` per process (encoders cannot be pickled); a component takes orders
only — bytes that fail to decode, or decode to anything but an order, raise ``BadMessage``
naming the cause, never a crash deeper in.
"""

from __future__ import annotations

import msgspec

from shunter.events import Codec, Message, Order

_codec: Codec | None = None


class BadMessage(ValueError):
    pass


def codec() -> Codec:
    global _codec
    if _codec is None:
        _codec = Codec()
    return _codec


def decode_order(data: bytes) -> Order:
    try:
        msg = codec().decode(data)
    except msgspec.MsgspecError as e:
        raise BadMessage(f"order bytes do not decode: {e}") from None
    if not isinstance(msg, Order):
        raise BadMessage(f"expected an order, got {msg.role} {type(msg).__name__}")
    return msg


def encode_events(events: list[Message]) -> bytes:
    return codec().encode_batch(events)
