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
from pathlib import Path

import structlog

from shunter.events import Codec, Message, StepEnd, ValidateEnd, tag_of
from shunter.events.rollout import SampleBegin, SampleEnd, SampleResumed

QUIET = (SampleBegin, SampleEnd, SampleResumed)


class EventLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "ab")  # noqa: SIM115 - closed in close()
        self._codec = Codec()
        self._n = 0

    def __call__(self, msg: Message) -> None:
        self._f.write(self._codec.frame(msg))
        self._n += 1
        if self._n % 256 == 0:
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def make_logger(path: Path) -> structlog.BoundLogger:
    f = open(path, "a")  # noqa: SIM115 - lives as long as the process
    return structlog.wrap_logger(
        structlog.WriteLogger(f),
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.processors.JSONRenderer()],
    )


class LogSink:
    """One structlog line per message, named by its tag (per-sample messages summarised)."""

    def __init__(self, logger) -> None:
        self.log = logger

    def __call__(self, msg: Message) -> None:
        if isinstance(msg, QUIET):
            return
        fields = {k: getattr(msg, k) for k in msg.__struct_fields__ if k not in ("run_id", "wall_time", "samples", "prompts")}
        if "partial" in fields:
            fields["partial"] = fields["partial"] is not None
        level = "error" if tag_of(msg).endswith(("failed", "rejected")) else "info"
        getattr(self.log, level)(tag_of(msg), **fields)


class MetricsSink:
    """Per-step metrics as JSON lines (and TensorBoard when the package is installed)."""

    def __init__(self, path: Path, tensorboard_dir: Path | None = None) -> None:
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
        if isinstance(msg, SampleEnd):
            self._tokens += len(msg.sample.token_ids)
        elif isinstance(msg, StepEnd):
            wall = msg.wall_time - self._t0
            row = {"step": msg.step, "wall_s": wall, **msg.metrics,
                   "rollout/tokens_per_s": self._tokens / wall if wall > 0 else 0.0}
            self._write(msg.step, row)
        elif isinstance(msg, ValidateEnd):
            self._write(None, {"version": msg.version, **{f"validate/{k}": v for k, v in msg.metrics.items()}})

    def _write(self, step: int | None, row: dict) -> None:
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

    def __call__(self, msg: Message) -> None:
        self._buf.append(self._codec.encode(msg))
        self._end += 1
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
