"""Event logs on disk: length-prefixed frames, read back with every damage named.

Format: a sequence of frames, each a 4-byte big-endian length and one message encoded by the
codec. There is no header, so a log is valid from its first byte to its last.

Invariants:

- reading never stops quietly: every byte range that does not hold whole, decodable frames is
  reported as a :class:`Damage` with its byte offsets and the cause (an empty file, a torn tail,
  a frame that does not decode, bytes that are not frames at all), and reading goes on at the
  next offset where whole frames start again, so one damaged frame costs only its own bytes;
- a range of bytes is taken as a frame only if its length fits and its body decodes as a
  message of the typed union (a tagged map with every field of its type), so random bytes
  are not read as messages; a frame overwritten with bytes that still decode cannot be told
  apart (frames carry no checksum);
- :func:`repair` never deletes a byte: the damaged original is renamed aside and the readable
  frames are written under the original name (``EventLog`` does this when a resumed run opens a
  damaged log; ``shunter events --repair`` on request).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from shunter.events.base import Message
from shunter.events.codec import Codec

FRAME = struct.Struct(">I")
MAX_FRAME = 64 << 20
"""No message comes near this (a whole group of samples is kilobytes); a longer 'frame' is damage."""


class TornLog(ValueError):
    """The log is damaged (its tail torn by a writer that stopped mid-frame, or worse) and the
    reader was asked to be strict."""


@dataclass(frozen=True)
class Damage:
    """Bytes ``[start, end)`` of a log that hold no readable frame, and why."""

    start: int
    end: int
    why: str

    @property
    def torn_tail(self) -> bool:
        return self.why.startswith("torn")

    def describe(self, path: str | Path) -> str:
        return f"{path}: bytes {self.start}-{self.end} ({self.end - self.start} bytes) unreadable: {self.why}"


class LogReader:
    """Iterate the messages of a log; afterwards ``damage`` lists what could not be read and
    ``frames`` / ``size`` say how much could. ``strict``: raise ``TornLog`` at the first damage."""

    def __init__(self, path: str | Path, *, strict: bool = False) -> None:
        self.path = Path(path)
        self.strict = strict
        self.damage: list[Damage] = []
        self.frames = 0
        self.size = 0
        self.good: list[tuple[int, int]] = []
        """Byte ranges of whole, decodable frames (merged), for :func:`repair`."""
        self._codec = Codec()

    def __iter__(self) -> Iterator[Message]:
        data = self.path.read_bytes()  # FileNotFoundError names the path
        self.size = len(data)
        if not data:
            self._damaged(Damage(0, 0, "empty file: no events were ever written"))
            return
        pos = 0
        while pos < len(data):
            msg = self._decode(data, pos)  # in step with the frames: a frame that decodes is one
            if msg is None:
                nxt, msg = self._resync(data, pos + 1)
                self._damaged(Damage(pos, nxt, self._why(data, pos, nxt)))
                if msg is None:
                    return
                pos = nxt
            end = pos + 4 + FRAME.unpack_from(data, pos)[0]
            self._keep(pos, end)
            self.frames += 1
            yield msg
            pos = end

    # -- reading -------------------------------------------------------------------------
    def _decode(self, data: bytes, pos: int) -> Message | None:
        """The message of a whole frame at ``pos``, else None."""
        if pos + 4 > len(data):
            return None
        (n,) = FRAME.unpack_from(data, pos)
        if n == 0 or n > MAX_FRAME or pos + 4 + n > len(data):
            return None
        try:
            return self._codec.decode(data[pos + 4 : pos + 4 + n])
        except msgspec.MsgspecError:
            return None

    def _resync(self, data: bytes, start: int) -> tuple[int, Message | None]:
        """The next offset at or after ``start`` where a frame decodes, with its message (or the
        end, None). Decoding is typed (a tagged map whose every field has its type), so damaged
        or random bytes that pass for a message are not a practical concern."""
        for q in range(start, len(data)):
            if (msg := self._decode(data, q)) is not None:
                return q, msg
        return len(data), None

    @staticmethod
    def _why(data: bytes, pos: int, nxt: int) -> str:
        if pos + 4 > len(data):
            return f"torn tail: {len(data) - pos} bytes, not even a frame header"
        (n,) = FRAME.unpack_from(data, pos)
        if pos == 0 and nxt == len(data):
            return "no whole event frame anywhere in the file (not an event log, or torn in its first frame)"
        if nxt == len(data) and pos + 4 + n > len(data) and n <= MAX_FRAME:
            return f"torn tail: the frame at byte {pos} needs {n} bytes, {len(data) - pos - 4} are left"
        if n == 0 or n > MAX_FRAME or pos + 4 + n > len(data):
            return f"the frame at byte {pos} claims {n} bytes (a damaged length)"
        return f"the frame at byte {pos} ({n} bytes) does not decode as a message"

    def _damaged(self, d: Damage) -> None:
        if self.strict:
            raise TornLog(d.describe(self.path))
        self.damage.append(d)

    def _keep(self, start: int, end: int) -> None:
        if self.good and self.good[-1][1] == start:
            self.good[-1] = (self.good[-1][0], end)
        else:
            self.good.append((start, end))


def read_log(path: str | Path, *, strict: bool = False, reports: bool = False) -> Iterator[Message]:
    """The readable messages of an event log. Damaged bytes are skipped (``LogReader`` says
    where), or raise ``TornLog`` if ``strict``. A relay's report (``RelayReport``, one frame) is
    read as the facts it carries, in their order, unless ``reports``."""
    from shunter.events.relay import flatten

    reader = LogReader(path, strict=strict)
    yield from (reader if reports else flatten(reader))


def whole_frames(data: bytes) -> int:
    """Length of the longest prefix of ``data`` made of whole frames by their lengths alone
    (where a torn tail starts; it does not decode them)."""
    pos = 0
    while pos + 4 <= len(data):
        (n,) = FRAME.unpack_from(data, pos)
        if pos + 4 + n > len(data):
            break
        pos += 4 + n
    return pos


@dataclass(frozen=True)
class Repair:
    """What :func:`repair` did: the readable frames stay under ``path``; ``kept_as`` holds the
    original file whole, or — when only the tail was torn — just the torn tail's bytes."""

    path: Path
    kept_as: Path
    frames: int
    damage: list[Damage]
    whole: bool

    def describe(self) -> str:
        what = "the original file" if self.whole else "the torn tail's bytes"
        return (
            f"{self.path} was damaged ({'; '.join(d.describe(self.path) for d in self.damage[:5])}"
            f"{f' and {len(self.damage) - 5} more' if len(self.damage) > 5 else ''}); "
            f"kept its {self.frames} readable frames, {what} at {self.kept_as}"
        )


def repair(path: str | Path) -> Repair | None:
    """Make a damaged log readable end to end without losing a byte; None (nothing touched)
    when it is whole or empty. A torn tail (a writer killed mid-frame) is moved to
    ``<name>.torn-<offset>`` and cut off; any other damage keeps the whole original as
    ``<name>.damaged-<unix time>`` and writes the readable frames under the original name."""
    path = Path(path)
    reader = LogReader(path)
    for _ in reader:
        pass
    if not reader.damage or reader.size == 0:
        return None
    data = path.read_bytes()
    (first, *rest) = reader.damage
    if not rest and first.torn_tail and first.end == len(data) and reader.good in ([(0, first.start)], []):
        kept = _free(path, f"torn-{first.start}")
        _write(kept, data[first.start :])
        with open(path, "rb+") as f:
            f.truncate(first.start)
            os.fsync(f.fileno())
        return Repair(path=path, kept_as=kept, frames=reader.frames, damage=reader.damage, whole=False)
    kept = _free(path, f"damaged-{int(time.time())}")
    tmp = path.with_name(f".{path.name}.repair.tmp")
    _write(tmp, b"".join(data[a:b] for a, b in reader.good))
    os.link(path, kept)  # the original is reachable under its new name before it is replaced
    os.replace(tmp, path)
    return Repair(path=path, kept_as=kept, frames=reader.frames, damage=reader.damage, whole=True)


def _free(path: Path, suffix: str) -> Path:
    kept, n = path.with_name(f"{path.name}.{suffix}"), 0
    while kept.exists():
        n += 1
        kept = path.with_name(f"{path.name}.{suffix}.{n}")
    return kept


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
