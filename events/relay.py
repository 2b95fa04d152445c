"""The relay's report: the per-sample facts of several replicas, carried as one message.

Invariant: a ``RelayReport`` holds, in the order their replicas stamped them, only facts
that come once per sample or once per replica (``REPORTED``), each whole and stamped by the
replica that emitted it; reading it is the same as reading those facts one after another
(``flatten``). The coordinator applies each of them, and shows each to the policy, exactly
as if it had come alone; the event log keeps the report as one frame and ``read_log``
yields its facts in place, so nothing downstream needs to know reports exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from shunter.events.base import Event, Message
from shunter.events.rollout import SampleAborted, SampleBegin, SampleEnd, SampleResumed
from shunter.events.training import WeightsLoaded

Reported = SampleBegin | SampleEnd | SampleResumed | SampleAborted | WeightsLoaded
REPORTED: tuple[type[Event], ...] = (SampleBegin, SampleEnd, SampleResumed, SampleAborted, WeightsLoaded)
"""What a relay folds into a report; anything else passes through it alone, in order."""


class RelayReport(Event, frozen=True, kw_only=True, tag="relay.report"):
    """What the replicas behind one relay reported within a short window: samples begun,
    resumed, cut and ended, and weights loaded, in the order they happened.

    ``relay -> coordinator``, when its window (``rollout.report_window_s``) closes, when it
    holds ``rollout.report_max_events`` facts, or just before a fact it does not fold (a
    failure, a mode change) passes through; the coordinator applies each fact in turn and
    shows the policy those it subscribes to (never the report itself)."""

    relay: str
    """Which relay folded it: ``node:<node id prefix>`` for a node's relay actor, ``local`` for
    the one inside the coordinator's process."""
    events: list[Reported]
    held_s: float = 0.0
    """How long its first fact waited in the relay (at most the window)."""
    to_policy = False


def flatten(msgs: Iterable[Message]) -> Iterator[Message]:
    """The messages with every report replaced by the facts it carries."""
    for m in msgs:
        if m.__class__ is RelayReport:
            yield from m.events
        else:
            yield m
