"""``Relay``: folds the per-sample facts of the replicas behind it into ``RelayReport``s, so the
coordinator's loop takes one message per window instead of one per sample.

Why: on a busy fleet most messages are per sample (begun, resumed, cut, ended) and one weight
load per replica per publish. At 4,096 replicas that is ~12,000 messages a second, and every
message costs the coordinator its fixed part — a loop turn, a frame in the event log, the log
and metrics sinks, the supervisor's and the finale's look — before the part that is the
sample's own (the buffer, the dispatcher). A relay pays the fixed part once per window.

Invariants:

- order: what a relay is given comes out in the same order — a fact it does not fold (a
  failure, a mode change, a replica down) first flushes what it holds, then passes alone;
- bounded delay: a folded fact waits at most ``window_s`` (on the loop's clock, virtual under
  a simulation) and a report holds at most ``max_events`` facts; with ``window_s = 0`` only the
  facts of one push are folded together (a sample's begin, cuts and end come in one push) and
  none waits; ``max_events = 1`` folds nothing (every fact is posted alone, as it comes);
- nothing is lost or made: every fact pushed is posted exactly once, unchanged (the replica's
  own stamp), and :meth:`flush` (the relay closing, a fact from elsewhere that must not
  overtake them) posts what is held.

One ``Relay`` runs in the coordinator's process for the replicas whose streams it holds
itself (``TaskExecutor``), one in each node's relay actor (``actors/relay_actor.py``) for that node's
replicas, and one per simulated node in the simulator (``bench/sim/cluster.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from shunter.events import Codec, Message, Stamper
from shunter.events.relay import REPORTED, RelayReport

Post = Callable[[list[Message]], None]
_FOLDED = frozenset(REPORTED)


class Relay:
    def __init__(
        self,
        name: str,
        post: Post,
        stamp: Stamper,
        *,
        window_s: float,
        max_events: int = 512,
        timer: Callable[[], float] = time.perf_counter,
        encoded: Callable[[Message, bytes], None] | None = None,
    ) -> None:
        """``post`` takes what the relay sends on (reports and the facts it does not fold);
        ``stamp`` stamps its reports; ``timer`` measures the relay's own CPU time (:attr:`cpu_s`);
        ``encoded(report, body)`` gets each report's encoding, made here once, before it is
        posted (the event log writes those bytes instead of encoding the report again)."""
        if window_s < 0 or max_events < 1:
            raise ValueError(f"a relay needs window_s >= 0 and max_events >= 1, got {window_s}, {max_events}")
        self.name, self.post, self.stamp = name, post, stamp
        self.window_s, self.max_events = window_s, max_events
        self.timer = timer
        self.encoded = encoded
        self._codec = Codec() if encoded is not None else None
        self._held: list[Message] = []
        self._flush_at: asyncio.TimerHandle | None = None
        self._since = 0.0  # when the first fact held now came (the loop's clock)
        self.flushes = 0
        """Flushes that posted something (a report, or one fact held alone)."""
        self.folded = 0
        """Facts posted by flushes."""
        self.passed = 0
        """Facts posted alone (not folded)."""
        self.cpu_s = 0.0
        """Seconds spent in :meth:`push` and :meth:`flush` (the relay's own work)."""

    @property
    def held(self) -> int:
        return len(self._held)

    def push(self, events: list[Message]) -> None:
        """Facts from the replicas behind this relay, in their order."""
        t0 = self.timer()
        if self.max_events == 1:
            self.passed += len(events)
            self.post(events)
            self.cpu_s += self.timer() - t0
            return
        alone: list[Message] = []
        for ev in events:
            if ev.__class__ in _FOLDED:
                if alone:  # what came before it goes first
                    self._post_alone(alone)
                    alone = []
                if not self._held:
                    self._since = asyncio.get_running_loop().time()
                self._held.append(ev)
                if len(self._held) >= self.max_events:
                    self._flush()
                elif self._flush_at is None and self.window_s:
                    self._flush_at = asyncio.get_running_loop().call_later(self.window_s, self.flush)
            else:
                if self._held:
                    self._flush()
                alone.append(ev)
        if alone:
            self._post_alone(alone)
        elif not self.window_s:  # no window: what came in one push goes together, now
            self._flush()
        self.cpu_s += self.timer() - t0

    def flush(self) -> None:
        """Post what is held now (the window closed, a stream ended, or the relay closes)."""
        t0 = self.timer()
        self._flush()
        self.cpu_s += self.timer() - t0

    def _flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        if not self._held:
            return
        held, self._held = self._held, []
        self.flushes += 1
        self.folded += len(held)
        held_s = asyncio.get_running_loop().time() - self._since
        if len(held) == 1 and not held_s:  # a report of one fact that never waited is the fact
            self.post(held)
            return
        report = self.stamp(RelayReport(relay=self.name, events=held, held_s=held_s))  # type: ignore[arg-type]
        if self.encoded is not None and self._codec is not None:
            self.encoded(report, self._codec.encode(report))
        self.post([report])

    def _post_alone(self, events: list[Message]) -> None:
        self.passed += len(events)
        self.post(events)


def route_through_relays(
    executor: Any,
    replicas: list[str],
    per: int,
    run_id: str,
    clock: Callable[[], float],
    *,
    window_s: float,
    max_events: int,
    encoded: Callable[[Message, bytes], None] | None = None,
) -> list[Relay]:
    """In one process (the simulator, the unit tier): one relay per ``per`` replicas (a host's),
    each with its own stamp, routed on ``executor`` (``TaskExecutor.route``) — the trainer hands
    new weights to them (``LocalExecutor.deliver``) and their replicas' facts are folded there."""
    out: list[Relay] = []
    per = per or max(1, len(replicas))
    for k in range(0, len(replicas), per):
        relay = Relay(
            f"node:{len(out)}",
            executor.post_through_relay,
            Stamper(run_id, f"relay:{len(out)}", clock),
            window_s=window_s,
            max_events=max_events,
            encoded=encoded,
        )
        out.append(relay)
        for rid in replicas[k : k + per]:
            executor.route(rid, relay)
    return out
