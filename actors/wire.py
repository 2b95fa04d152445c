"""Bytes in, bytes out: the codec at an actor's boundary.

Invariant: one ``Codec`` per process (encoders cannot be pickled); a component takes orders
only — bytes that fail to decode, or decode to anything but an order, raise ``BadMessage``
naming the cause, never a crash deeper in.
"""

from __future__ import annotations

import re

import msgspec

from shunter.engine.io.errors import bounded, describe
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


def root_cause(e: BaseException) -> str:
    """The error an actor raised, without Ray's wrapping: ``.cause`` followed down, and for an
    actor that died in its constructor the last ``SomethingError: ...`` line of Ray's report."""
    for _ in range(5):
        inner = getattr(e, "cause", None)
        if not isinstance(inner, BaseException) or inner is e:
            break
        e = inner
    if type(e).__name__.endswith("ActorDiedError"):
        lines = [ln.strip() for ln in str(e).splitlines() if re.match(r"^\s*[\w.]+(Error|Exception): ", ln)]
        if lines:
            return bounded(lines[-1])
    return describe(e)
