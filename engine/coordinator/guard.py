"""``PolicyGuard``: the only caller of ``Policy.decide`` — it contains whatever the policy does.

Invariants:

- the policy never sees an event about itself (``Event.to_policy`` false: ``PolicyFailed``,
  ``PolicySlow``, ``IntentRejected``), so a failure can never feed on itself;
- ``decide()`` returns a list (or tuple) of intents, or the call counts as a failure whose
  text says what came back and what is expected — an order, a bare intent, ``None`` …;
- a failure yields no command; identical failures are reported on the 1st, 10th, 100th …
  occurrence with the count (so logs stay small), and after ``max_failures`` failures in a
  row :attr:`fatal` holds the reason the run must end with;
- every call is timed (:attr:`decide_ms`); a call over ``budget_ms`` that returned yields
  ``PolicySlow`` on the 1st, 10th, 100th … slow call (one that did not return is a failure,
  never reported as slow);
- a call still running after ``timeout_s`` ends the run, whatever it is stuck in: one stuck in
  Python bytecode (an endless loop) is interrupted there (``engine/coordinator/watchdog.py``); a user's
  policy runs on a thread the coordinator can abandon (``engine/coordinator/policy_worker.py``), so one
  blocked in C (a lock, a socket, a native call) is given up ``GIVE_UP_AFTER_S`` later and the
  run ends all the same; a built-in policy (``shunter.policies``: ours, tested never to block)
  runs on the loop itself, where a call costs nothing extra.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from threading import get_ident

from shunter.engine.coordinator.policy_worker import GivenUp, PolicyWorker
from shunter.engine.coordinator.watchdog import WATCHDOG, Stuck
from shunter.engine.io.errors import bounded, describe, secs, type_name, user_frame
from shunter.events import Event, Intent, Order, PolicyFailed, PolicySlow, tag_of
from shunter.events.view import EngineView
from shunter.policies import Policy
from shunter.policies.base import checked_ignores


def _where(e: BaseException) -> str:
    where = user_frame(e)
    return f" ({where})" if where else ""


GIVE_UP_AFTER_S = 1.0
"""How long past ``timeout_s`` the coordinator still waits for a user's call the watchdog
could not interrupt (a pure-Python loop is interrupted within a tick of ``timeout_s``)."""


def built_in(policy: object) -> bool:
    """A policy class of shunter's own (``shunter.policies``), not a user's subclass of one."""
    return type(policy).__module__.startswith("shunter.policies.")


def _milestone(n: int) -> bool:
    """1, 10, 100, 1000 …: when a repeated fact is reported again."""
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


class Timings:
    """The last ``size`` durations (ms) and their quantiles."""

    def __init__(self, size: int = 4096) -> None:
        self._ms: deque[float] = deque(maxlen=size)
        self.calls = 0

    def add(self, ms: float) -> None:
        self._ms.append(ms)
        self.calls += 1

    def quantiles(self) -> dict[str, float]:
        if not self._ms:
            return {}
        xs = sorted(self._ms)
        n = len(xs)
        return {"p50": xs[n // 2], "p99": xs[min(n - 1, (n * 99) // 100)], "max": xs[-1]}


class PolicyGuard:
    def __init__(
        self,
        policy: Policy,
        *,
        emit: Callable[[Event], object],
        max_failures: int = 10,
        budget_ms: float = 10.0,
        timeout_s: float = 10.0,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = policy
        shown = getattr(policy, "wrapped", policy)  # a recording wrapper names what it wraps
        self.name = shown.name or type(shown).__name__
        self.label = f"{type(shown).__module__}.{type(shown).__qualname__}"
        self.emit = emit
        self._wants: dict[type, bool] = {}  # event type -> decide() is called on it
        self._ignores = checked_ignores(type(shown))
        self.max_failures = max_failures
        self.budget_ms = budget_ms
        self.timeout_s = timeout_s
        self.timer = timer
        self.decide_ms = Timings()
        self.failures_in_a_row = 0
        self.failures = 0
        self.slow_calls = 0
        self._seen: dict[str, int] = {}  # error text -> times seen
        self.fatal = ""
        """Set once the policy failed ``max_failures`` times in a row, or a call never came
        back: why the run must end."""
        self._worker = None if built_in(shown) else PolicyWorker(f"shunter-policy-{self.name}")

    def wants(self, event: Event) -> bool:
        """Whether ``decide`` is called on this event (else no view need be built for it)."""
        kind = type(event)
        w = self._wants.get(kind)
        if w is None:
            w = self._wants[kind] = kind.to_policy and not issubclass(kind, self._ignores)
        return w and not self.fatal

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        if not self.wants(event):
            return []
        t0 = self.timer()
        try:
            out: list[Intent]  # what the policy declares; _check says what it really returned
            if self._worker is None:
                out = self._watched(event, view)
            else:
                out = self._worker.call(self._watched, event, view, timeout_s=self.timeout_s + GIVE_UP_AFTER_S)
        except (Stuck, GivenUp) as e:
            self._timed(event, t0, returned=False)
            how = not_returned(e, self.timeout_s)
            self._failed(event, f"did not return {how}")
            self.fatal = self.fatal or f"policy {self.label}.decide() did not return on {tag_of(event)} {how}"
            return []
        except Exception as e:  # noqa: BLE001 - the policy is user code: contain it
            self._timed(event, t0)
            return self._failed(event, f"raised {describe(e)}{_where(e)}")
        self._timed(event, t0)
        if out.__class__ is list and not out:  # the common answer: nothing to do
            self.failures_in_a_row = 0
            return out
        problem = self._check(out)
        if problem:
            return self._failed(event, problem)
        self.failures_in_a_row = 0
        return list(out)

    def _watched(self, event: Event, view: EngineView) -> list[Intent]:
        """The policy's call, interrupted by the watchdog if it runs in Python past its time."""
        tid = get_ident()  # the thread that runs it: the loop's, or the policy's worker
        WATCHDOG.begin(self.timeout_s, tid)
        try:
            return self.policy.decide(event, view)
        finally:
            WATCHDOG.end(tid)

    def _timed(self, event: Event, t0: float, *, returned: bool = True) -> None:
        """Time a call; a slow one is counted, and reported (``PolicySlow``) if it returned — one
        that did not is reported as a failure that ends the run, not as a slow call."""
        ms = (self.timer() - t0) * 1e3
        self.decide_ms.add(ms)
        if ms > self.budget_ms:
            self.slow_calls += 1
            if returned and _milestone(self.slow_calls):
                self.emit(
                    PolicySlow(
                        policy=self.label,
                        on_kind=tag_of(event),
                        decide_ms=ms,
                        budget_ms=self.budget_ms,
                        slow_calls=self.slow_calls,
                        calls=self.decide_ms.calls,
                    )
                )

    @staticmethod
    def _check(out: object) -> str:
        """Empty if ``out`` is a list of intents; else what is wrong with it."""
        expected = "expected a list of intents (SwitchToRollout, TrainStep, PublishWeights …; [] to do nothing)"
        if isinstance(out, Intent | Order):
            return f"returned a bare {type(out).__name__}, not a list; {expected}: return [{type(out).__name__}(...)]"
        if not isinstance(out, list | tuple):
            return f"returned {type_name(out)}; {expected}"
        for i, c in enumerate(out):
            if isinstance(c, Order):
                return (
                    f"returned {type(c).__name__} at index {i}, an order only the coordinator gives components; "
                    f"{expected}"
                )
            if not isinstance(c, Intent):
                return f"returned a list holding {type_name(c)} at index {i}; {expected}"
        return ""

    def _failed(self, event: Event, problem: str) -> list[Intent]:
        self.failures += 1
        self.failures_in_a_row += 1
        text = bounded(f"{self.label}.decide() {problem}")
        n = self._seen[text] = self._seen.get(text, 0) + 1
        if len(self._seen) > 1000:  # many distinct errors: keep the counts of the recent ones
            self._seen = {text: n}
        if _milestone(n):
            self.emit(PolicyFailed(policy=self.label, on_kind=tag_of(event), error=text, repeats=n))
        if self.failures_in_a_row >= self.max_failures:
            self.fatal = (
                f"policy {self.label} failed {self.failures_in_a_row} times in a row "
                f"(run.policy_max_failures = {self.max_failures}); last, on {tag_of(event)}: {text}"
            )
        return []

    def metrics(self) -> dict[str, float]:
        """``coordinator/decide_ms_{p50,p99,max}`` and failure counts, for metrics and the summary."""
        out = {f"coordinator/decide_ms_{k}": v for k, v in self.decide_ms.quantiles().items()}
        out["coordinator/policy_failures"] = float(self.failures)
        out["coordinator/policy_slow_calls"] = float(self.slow_calls)
        return out


def not_returned(e: Stuck | GivenUp, timeout_s: float) -> str:
    """Why a ``decide()`` call did not return, for "did not return …": interrupted in Python
    (``Stuck``), or abandoned blocked outside it (``GivenUp``)."""
    how = (
        "an endless loop? It was interrupted"
        if isinstance(e, Stuck)
        else "blocked outside Python — a lock, I/O, a native call — so it could not be "
        "interrupted: its thread was abandoned"
    )
    return f"within run.policy_timeout_s = {secs(timeout_s)}s ({how})"


def check_intents(out: Sequence[object]) -> str:
    """What is wrong with a ``decide()`` result (empty: nothing) — for tools and tests."""
    return PolicyGuard._check(out)
