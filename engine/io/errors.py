"""Error text that stays readable and small, and the error type of users' code.

Invariants: every error text the engine puts into an event or a log line goes through
:func:`bounded` — at most ``LIMIT`` characters, terminal colour codes removed, the head and
the tail kept (a wrapped error's useful line is often its last); :func:`describe` names an
exception by type and message, the user's own frame first when the exception came from user
code; :func:`secs` writes a number of seconds with sensible rounding. Nothing here embeds the
repr of an earlier error event, so errors never grow by nesting.
"""

from __future__ import annotations

import math
import re
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shunter.events import IntentRejected, RunEnded

LIMIT = 2048
"""Characters of error text kept in one event or log line."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def bounded(text: str, limit: int = LIMIT) -> str:
    """``text`` without terminal codes, cut to ``limit`` characters (head and tail kept)."""
    text = _ANSI.sub("", text)
    if len(text) <= limit:
        return text
    keep = max(0, limit - 40)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    return f"{text[:head]} … [{len(text) - head - tail} characters cut] … {text[len(text) - tail :]}"


def secs(value: float) -> str:
    """A number of seconds as a message shows it: three significant digits (``6.67``, ``0.3``,
    ``2``), whole from 100 up (``7200``), never an exponent — a computed timeout of 20/3 s is
    ``6.67``, not ``6.66667``."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    text = f"{value:.3g}"
    if "e" in text:  # below 0.0001: as many places as it takes, trailing zeros dropped
        text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text


def describe(exc: BaseException, *, limit: int = LIMIT) -> str:
    """``"KeyError: 'x'"``-style text for an exception, bounded."""
    msg = str(exc)
    return bounded(f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__, limit)


def user_frame(exc: BaseException, module_hint: str = "") -> str:
    """``"file.py:12 in fn"`` of the innermost traceback frame outside shunter (the user's
    own line), or of the innermost frame in ``module_hint``'s file; empty if none."""
    frames = traceback.extract_tb(exc.__traceback__)
    hint = module_hint.replace(".", "/")
    for f in reversed(frames):
        if (hint and hint in f.filename) or "/shunter/" not in f.filename.replace("\\", "/"):
            if "site-packages/torch" in f.filename or "/asyncio/" in f.filename:
                continue
            return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"
    return ""


class EngineError(RuntimeError):
    """Base of the errors the ``Engine`` raises in the caller."""


class UserCodeError(EngineError):
    """User code (a loss, a reward, a task, a policy) raised or returned something unusable.

    ``str()`` starts with the user's own message: ``"<spec> raised KeyError: 'x' (loss.py:12 in
    my_loss)"`` or ``"<spec> returned None; expected ..."``."""

    def __init__(self, spec: str, message: str) -> None:
        super().__init__(bounded(f"{spec} {message}"))
        self.spec = spec

    @classmethod
    def from_report(cls, spec: str, text: str) -> UserCodeError:
        """Rebuild the error from its reported text (``CommandFailed.error``), in the caller's process."""
        return cls(spec, text[len(spec) :].lstrip() if text.startswith(spec) else text)

    @classmethod
    def raised(cls, spec: str, exc: BaseException) -> UserCodeError:
        where = user_frame(exc, spec.partition(":")[0])
        return cls(spec, f"raised {describe(exc)}" + (f" ({where})" if where else ""))


def type_name(value: object) -> str:
    """A short description of what a value is, for "returned X; expected Y" messages."""
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text[:80] + '…' if len(text) > 80 else text}"


# -- what the Engine facade raises in the caller ---------------------------------------------


class TrainerGroupBroken(EngineError):
    """The trainer's ranks can no longer work as one group: a rank died, or a collective failed
    or ran past ``trainer.collective_timeout_s``. Raised by trainer rank 0 (its ``control`` or its
    ``watch``); the executor takes it as the trainer's death, so the run restarts from its
    checkpoint with every rank new."""


class EngineSetupError(EngineError):
    """A component failed to start; the message names it and the cause."""


class RestartError(EngineSetupError):
    """The run lost a component (the trainer, the coordinator) and could not start again from its
    last checkpoint — no room for the trainer within ``run.restart_wait_s``, say; the message says
    what was lost at which step, why the restart failed, and the ``--resume`` line that continues
    the run once the cause is fixed. (An ``EngineSetupError``: callers that catch that still do.)"""


class RunEndedError(EngineError):
    """The run is over (``.ended``: its ``RunEnded``); nothing more can be asked of it."""

    def __init__(self, ended: RunEnded) -> None:
        super().__init__(f"the run ended ({ended.reason}" + (f": {ended.error})" if ended.error else ")"))
        self.ended = ended


class IntentRefused(EngineError):
    """The coordinator refused an intent (``.rejected``: the ``IntentRejected``, with its reason)."""

    def __init__(self, rejected: IntentRejected) -> None:
        super().__init__(f"{rejected.intent_kind} refused ({rejected.reason}): {rejected.detail}")
        self.rejected = rejected


class NoBatchError(EngineError, TimeoutError):
    """No mini-batch became ready in time; the message says why."""
