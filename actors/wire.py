"""Bytes in, bytes out: the codec at an actor's boundary.

Invariant: one ``Codec`` per process (encoders cannot be pickled); commands that fail to
decode raise ``BadMessage`` naming the sender-side cause, never a crash deeper in.
"""

from __future__ import annotations

import msgspec

from shunter.events import Codec, Command, Message

_codec: Codec | None = None


class BadMessage(ValueError):
    pass


def codec() -> Codec:
    global _codec
    if _codec is None:
        _codec = Codec()
    return _codec


def decode_command(data: bytes) -> Command:
    try:
        msg = codec().decode(data)
    except msgspec.MsgspecError as e:
        raise BadMessage(f"command bytes do not decode: {e}") from None
    if not isinstance(msg, Command):
        raise BadMessage(f"expected a command, got event {type(msg).__name__}")
    return msg


def encode_events(events: list[Message]) -> bytes:
    return codec().encode_batch(events)
