"""``Heartbeat``: a replica's generation stream says "still making progress" without flooding
the stream.

A group's generation stream hands over each sample's events as the sample ends; between
ends, a long trajectory (many turns, slow tools) can go on for longer than the executor's
``rollout.generate_timeout_s``, which bounds the time a stream goes **without progress** —
not its total time. Progress is a turn generated, an environment call answered, a sample
ended; the stream reports it with an empty item (a beat). A wait bounded elsewhere — a sample
waiting for its reward (the reward's own limits; possibly longer than the timeout: a slow
reward, a queue of samples before it, a reward worker starting again), the stream's samples
waiting on a weight load (``run.timeout_s``) — beats every ``every_s`` while it lasts
(:meth:`Heartbeat.wait_begins` / :meth:`Heartbeat.wait_ends`, a counter: no task or timer per
sample): the replica's loop is turning, and killing it would unstick nothing.

Invariants: progress at loop time ``p`` reaches the stream by ``p + every_s`` at the latest
(a beat, or a sample's events); at most one beat per ``every_s``, none within ``every_s`` of
the stream's start (the executor's clock starts with the call: a group that ends sooner streams
no beat); ``every_s = 0`` never beats (in-process fakes and the simulator keep their streams as
they were). Timers are the loop's (``call_later``), so a virtual clock drives them like the
real one.

``OpenStreams`` (held by ``RolloutCore``, which adds each generation stream's heartbeat while
the stream is open; given to its weights-and-modes part) makes every open stream beat while
their samples wait on a weight load.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator


class Heartbeat:
    """Rate-limits ``beat`` (which must only enqueue) to once per ``every_s``, never losing
    progress; the stream calls :meth:`sent` whenever it hands anything over."""

    def __init__(self, every_s: float, beat: Callable[[], None]) -> None:
        self.every_s = every_s
        self._beat = beat
        # loop time of the last item handed over; at first the stream's start (the executor's deadline began then)
        self._last = asyncio.get_running_loop().time() if every_s > 0 else -math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._queued = False
        self._waits = 0  # waits bounded elsewhere in progress (rewards, a weight load)

    def progressed(self) -> None:
        """Something moved: beat now, or once ``every_s`` has passed since the last item."""
        if self.every_s <= 0 or self._queued or self._timer is not None:
            return  # a beat already covers this progress
        loop = asyncio.get_running_loop()
        wait = self._last + self.every_s - loop.time()
        if wait <= 0:
            self._fire()
        else:
            self._timer = loop.call_later(wait, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._queued = True
        self._beat()

    def sent(self) -> None:
        """The stream handed over an item (a beat or events): it covers all progress so far."""
        self._queued = False
        self._last = asyncio.get_running_loop().time()
        self.cancel()
        if self._waits:  # still waiting on something bounded elsewhere: the next beat in every_s
            self.progressed()

    def wait_begins(self) -> None:
        """A wait bounded elsewhere begins: the stream beats every ``every_s`` until it ends."""
        self._waits += 1
        self.progressed()

    def wait_ends(self) -> None:
        self._waits -= 1
        self.progressed()

    def close(self) -> None:
        """The stream ended: no beat from here on (a sample's late ``wait_ends`` makes none)."""
        self.every_s = 0.0
        self.cancel()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class OpenStreams:
    """The heartbeats of the generation streams open on one replica."""

    def __init__(self) -> None:
        self._beats: set[Heartbeat] = set()

    def add(self, beat: Heartbeat) -> None:
        self._beats.add(beat)

    def discard(self, beat: Heartbeat) -> None:
        self._beats.discard(beat)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Every open stream's samples wait on this (a weight load): they beat meanwhile."""
        beats = list(self._beats)
        for b in beats:
            b.wait_begins()
        try:
            yield
        finally:
            for b in beats:
                b.wait_ends()


BEATS_PER_TIMEOUT = 10
"""A replica beats ``BEATS_PER_TIMEOUT`` times per ``rollout.generate_timeout_s`` at most, so a
beat's lag costs a tenth of the timeout: a call that can legitimately take ``x`` seconds without
progress (an environment call: ``task.env_timeout_s``) must have ``x`` below ``slack(timeout)``."""


def every_for(timeout_s: float) -> float:
    """The beat period for an executor's no-progress timeout."""
    return timeout_s / BEATS_PER_TIMEOUT


def slack(timeout_s: float) -> float:
    """The longest silence between two progress points a stream survives under ``timeout_s``."""
    return timeout_s - every_for(timeout_s)
