"""Where a run's messages go: the event log, structured logs, metrics, a live feed.

Invariants: every message the coordinator handles reaches every sink in handling order;
the event log is length-prefixed frames of the codec (``shunter.events.read_log`` reads
it back, a torn tail included); log event names are the message tags, metric keys are
``<tag prefix>/<name>`` (``trainer/loss``, ``rollout/tokens_per_s``, ``validate/exact``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

from shunter.engine.io.errors import bounded
from shunter.events import (
    CheckpointSaved,
    Codec,
    GroupDropped,
    Message,
    RelayReport,
    RunEnded,
    StepEnd,
    ValidateEnd,
    WeightsLoaded,
    tag_of,
)
from shunter.events.codec import frame_header
from shunter.events.logfile import Repair, repair
from shunter.events.rollout import (
    EnvFailed,
    RewardFailed,
    RewardWorkerLost,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
)

QUIET = (SampleBegin, SampleEnd, SampleResumed)
"""Per-sample messages: never a log line of their own (the event log and metrics have them)."""


Sink = Callable[[Message], None]
"""Where the coordinator hands every message it handles, in handling order."""


def sink_name(sink: Sink) -> str:
    """A sink as an error names it (its qualified name, else its type's)."""
    return getattr(sink, "__qualname__", None) or type(sink).__name__


class EventLog:
    """Appends frames to ``events.bin``. A resumed attempt appends to the same log; if the
    previous writer left it damaged (a tail torn by a kill, or worse) it is repaired first
    without losing a byte (``shunter.events.logfile.repair``: the damaged bytes are kept aside,
    ``repaired`` says where, and the coordinator announces it as ``run.log_repaired``), so the
    log stays readable end to end. Written through at least every 0.5 s and on every
    ``RunEnded`` / ``CheckpointSaved``, so a killed coordinator loses at most the last half second."""

    FLUSH_S = 0.5

    def __init__(self, path: Path, feed: Feed | None = None) -> None:
        self.path = path
        self.repaired: Repair | None = repair(path) if path.is_file() else None
        self._f = open(path, "ab", buffering=1 << 20)  # noqa: SIM115 - closed in close(); flushed below
        self._encode = Codec().encode
        self._known: dict[int, tuple[Message, bytes]] = {}
        self._n = 0
        self._flushed = time.monotonic()
        self.feed = feed
        """Gets each message's bytes as encoded here: one encoding per message for both."""

    def remember(self, msg: Message, body: bytes) -> None:
        """``msg``, about to be recorded, is ``body`` encoded (by the relay that made it, or as it
        came over the wire): written as it is, never encoded twice. Held with the message itself,
        so no other message can be taken for it."""
        self._known[id(msg)] = (msg, body)

    def __call__(self, msg: Message) -> None:
        known = self._known.pop(id(msg), None) if self._known else None
        body = known[1] if known is not None and known[0] is msg else self._encode(msg)
        self._f.write(frame_header(body))  # a frame, as Codec.frame makes it, from the one encoding
        self._f.write(body)
        if self.feed is not None:
            self.feed.push(body, msg)
        self._n += 1
        now = time.monotonic()
        if self._n % 256 == 0 or now - self._flushed > self.FLUSH_S or isinstance(msg, RunEnded | CheckpointSaved):
            self._f.flush()
            self._flushed = now

    def close(self) -> None:
        self._known.clear()
        self._f.close()


def make_logger(path: Path) -> Any:
    """JSON lines through structlog, rendered by msgspec (a third of ``json.dumps``'s cost per
    line; anything msgspec cannot encode is written as its ``repr``)."""
    f = open(path, "ab")  # noqa: SIM115 - lives as long as the process
    enc = msgspec.json.Encoder(enc_hook=repr)
    return structlog.wrap_logger(
        structlog.BytesLogger(f),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer(serializer=lambda obj, **_: enc.encode(obj)),
        ],
        cache_logger_on_first_use=True,
    )


class LogSink:
    """One structlog line per message, named by its tag (per-sample messages summarised).

    Per-sample messages are not logged (but a failed sample); per-replica weight loads and
    group drops are logged on the 1st, 10th, 100th … of a version / reason, with ``count``.
    Every string field is bounded (``engine.io.errors.bounded``); an error repeated word for word
    is logged the 1st, 10th, 100th … time with ``repeats`` instead of every time."""

    def __init__(self, logger: Any) -> None:
        self.log = logger
        self._repeats: dict[tuple[str, str], int] = {}
        self._routine: dict[tuple[object, ...], int] = {}

    def __call__(self, msg: Message) -> None:
        if msg.__class__ is RelayReport:  # its facts, as if alone (most return at the next line)
            for ev in msg.events:
                if ev.__class__ is WeightsLoaded or (ev.__class__ is SampleAborted and ev.reason == "failed"):
                    self(ev)
            return
        if isinstance(msg, QUIET) or (msg.__class__ is SampleAborted and msg.reason != "failed"):
            return  # routine per-sample messages; a sample that failed is worth a line
        count = 0
        if (key := _routine_key(msg)) is not None:  # one per replica or group: milestones only
            count = self._routine[key] = self._routine.get(key, 0) + 1
            if len(self._routine) > 64:  # old versions: their count is final
                self._routine = {key: count}
            if not _milestone(count):
                return
        tag = tag_of(msg)
        fields: dict[str, Any] = {"count": count} if count else {}
        for k in msg.__struct_fields__:
            if k in ("run_id", "wall_time", "samples", "prompts", "resume"):
                continue
            v = getattr(msg, k)
            if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                # ValidateEnd.errors, replica ids and the like: the first 8, and how many more (never dropped unsaid)
                v = [bounded(x) for x in v[:8]] + ([f"... {len(v) - 8} more"] if len(v) > 8 else [])
            fields[k] = bounded(v) if isinstance(v, str) else v
        if "partial" in fields:
            fields["partial"] = fields["partial"] is not None
        if isinstance(err := fields.get("error"), str) and err and not count:  # routine ones: milestones already
            key = (tag, err)
            n = self._repeats[key] = self._repeats.get(key, 0) + 1
            if len(self._repeats) > 10_000:
                self._repeats = {key: n}
            if not _milestone(n):
                return
            if n > 1:
                fields["repeats"] = n
        level = (
            "warning"
            if tag.endswith(("slow", "lost", "pending")) or fields.get("errors")
            else "error"
            if tag.endswith(("failed", "rejected")) or fields.get("reason") == "error"
            else "info"
        )
        getattr(self.log, level)(tag, **fields)


def _routine_key(msg: Message) -> tuple[object, ...] | None:
    """Messages that come once per replica (a weight load) or per group (a drop): logged on the
    1st, 10th, 100th … of their kind with ``count``, so a line budget does not grow with the fleet
    (the event log keeps every one)."""
    if msg.__class__ is WeightsLoaded:
        return (WeightsLoaded, msg.version)
    if msg.__class__ is GroupDropped:
        return (GroupDropped, msg.reason)
    if msg.__class__ is RewardFailed:
        return (RewardFailed, msg.failure)
    if msg.__class__ is EnvFailed:
        return (EnvFailed, msg.failure)
    if msg.__class__ is RewardWorkerLost:
        return (RewardWorkerLost, msg.loss)
    return None


def _milestone(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


class MetricsSink:
    """Per-step metrics as JSON lines (and TensorBoard when the package is installed);
    ``extra`` adds figures of the step's moment (``coordinator/decide_ms_p50`` …)."""

    def __init__(
        self, path: Path, tensorboard_dir: Path | None = None, extra: Callable[[], dict[str, float]] | None = None
    ) -> None:
        self.extra = extra
        self._f = open(path, "a")  # noqa: SIM115 - closed in close()
        self._t0 = time.time()
        self._tokens = 0
        self._tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tensorboard_dir))
            except Exception:  # noqa: BLE001 - tensorboard is optional
                self._tb = None

    def __call__(self, msg: Message) -> None:
        if msg.__class__ is RelayReport:
            for ev in msg.events:
                if ev.__class__ is SampleEnd:
                    self._tokens += len(ev.sample.token_ids)
        elif isinstance(msg, SampleEnd):
            self._tokens += len(msg.sample.token_ids)
        elif isinstance(msg, StepEnd):
            wall = msg.wall_time - self._t0
            row = {
                "step": msg.step,
                "wall_s": wall,
                **msg.metrics,
                "rollout/tokens_per_s": self._tokens / wall if wall > 0 else 0.0,
                **(self.extra() if self.extra is not None else {}),
            }
            self._write(msg.step, row)
        elif isinstance(msg, ValidateEnd):
            self._write(None, {"version": msg.version, **{f"validate/{k}": v for k, v in msg.metrics.items()}})

    def _write(self, step: int | None, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        if self._tb is not None:
            x = step if step is not None else row.get("version", 0)
            for k, v in row.items():
                if isinstance(v, int | float) and k not in ("step", "version"):
                    self._tb.add_scalar(k, v, x)

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


class Feed:
    """A bounded ring of encoded messages for readers outside the actor (``Engine.events``).
    Cursors are absolute positions; a reader that falls behind ``maxlen`` is told how many
    messages it missed rather than silently skipping them."""

    def __init__(self, maxlen: int = 200_000) -> None:
        self._codec = Codec()
        self._buf: deque[bytes] = deque(maxlen=maxlen)
        self._end = 0
        self._changed = asyncio.Event()
        self.ended = False
        """A ``RunEnded`` went into the feed."""

    def __call__(self, msg: Message) -> None:
        self.push(self._codec.encode(msg), msg)

    def push(self, data: bytes, msg: Message) -> None:
        """``msg`` already encoded (by the event log)."""
        self._buf.append(data)
        self._end += 1
        if msg.__class__ is RunEnded:
            self.ended = True
        if not self._changed.is_set():
            self._changed.set()

    async def read(self, cursor: int, max_n: int = 4096, wait_s: float = 1.0) -> tuple[list[bytes], int, int]:
        """Messages from ``cursor`` on; returns (items, new cursor, missed)."""
        if cursor >= self._end:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), wait_s)
            except TimeoutError:
                return [], cursor, 0
        start = self._end - len(self._buf)
        missed = max(0, start - cursor)
        cursor = max(cursor, start)
        items = [self._buf[i - start] for i in range(cursor, min(self._end, cursor + max_n))]
        return items, cursor + len(items), missed


def trained_groups(path: str | Path) -> list[tuple[int, list[int]]]:
    """(step, prompt groups) of every optimizer step that counts, from an event log: a
    resumed attempt (``RunResumed(step=k)``) redoes the steps after ``k``, so those of the
    earlier attempt are replaced. Each group appearing once over the result is the
    exactly-once guarantee, checkable on any run."""
    from shunter.events import RunResumed, StepBegin, read_log

    steps: dict[int, list[int]] = {}
    for msg in read_log(path):
        if isinstance(msg, RunResumed):
            steps = {k: v for k, v in steps.items() if k <= msg.step}
        elif isinstance(msg, StepBegin):
            steps[msg.step] = list(msg.group_ids)
    return sorted(steps.items())


@dataclass(frozen=True)
class RunSinks:
    """The sinks every coordinator of a run writes to, in this order — the actor's and the
    simulated cluster's alike, so a benchmark pays for exactly what production pays for.
    Iterating gives the sinks to call; the feed is not among them: the event log hands it each
    message's bytes (one encoding for both)."""

    log: EventLog
    run_log: LogSink
    metrics: MetricsSink
    feed: Feed

    @classmethod
    def open(cls, out: Path, extra: Callable[[], dict[str, float]] | None = None) -> RunSinks:
        feed = Feed()
        return cls(
            EventLog(out / "events.bin", feed=feed),
            LogSink(make_logger(out / "run.log")),
            MetricsSink(out / "metrics.jsonl", out / "tensorboard", extra=extra),
            feed,
        )

    def __iter__(self) -> Iterator[Sink]:
        yield from (self.log, self.run_log, self.metrics)

    def close(self) -> None:
        self.log.close()
        self.metrics.close()
