"""Environments for multi-turn rollouts: the protocol, loading by import string, contained
calls, and the built-in calculator tool.

A multi-turn sample alternates: the model generates until one of the environment's ``stop``
strings (a tool call's end) or its own end; on a ``stop`` the environment's ``step(action)``
answers with an observation, whose tokens are appended to the sample (kept for context, masked
out of the loss) and generation goes on. See ``shunter.engine.replica.core`` for the loop.

Invariants:

- one environment object per trajectory on a replica: ``reset(prompt, transcript)`` is called
  once before its first step there; ``transcript`` is the response so far ("" for a new
  trajectory; the text before the cut when a partial trajectory moved here from another
  replica), so an environment whose state follows from its transcript survives the move;
- every environment object made is closed once: its ``close()``, when the class has one, is
  called when the trajectory ends on that replica (finished, failed, or cut to move on);
- a call never raises out of :class:`EnvCalls`: one that raises, returns something other than
  a :class:`StepResult` or outlives ``timeout_s`` is an ``EnvFailure`` with its cause;
- a synchronous ``reset``/``step``/``close`` runs in a worker thread, an async one on the
  replica's loop under the timeout: either way the replica's other requests go on while the
  environment thinks.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from shunter.engine.data.turns import FAILURES
from shunter.engine.io.errors import describe, secs, type_name
from shunter.events import PromptSpec
from shunter.events.vocab import EnvFailure


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one environment step answers."""

    observation: str = ""
    """Text appended to the trajectory (tokenized by the replica, never trained on)."""
    reward: float = 0.0
    """Added to the sample's reward (on top of the task's reward of the final response)."""
    done: bool = False
    """True: the trajectory ends after this observation."""
    metrics: dict[str, float] = {}
    """Reported per trajectory as ``env/<name>`` in the step metrics (the largest value any of
    its steps reported: report running counts, not increments). The engine's own names, those
    of a failed call (``raised``, ``returned``, ``timeout``: ``engine.data.turns.FAILURES``), are refused."""


class Environment(Protocol):
    """A user's environment: a class made once per trajectory, with no arguments. It may also
    have a ``close()`` (sync or ``async``), called once when the trajectory ends on the replica,
    to release what it holds (a sandbox, a socket)."""

    stop: Sequence[str]
    """The strings that end a tool call: generation stops there and ``step`` is called."""

    async def reset(self, prompt: PromptSpec, transcript: str) -> None: ...
    async def step(self, action: str) -> StepResult: ...


BUILTIN_ENVIRONMENTS = {"calculator": "shunter.engine.data.environments:Calculator"}


def load_environment(spec: str | type) -> Callable[[], Any]:
    """A built-in name (``"calculator"``), ``"module:Class"`` or the class itself -> the class;
    ValueError naming it and what is wrong (not importable, not a class, no
    ``step``/``reset``/``stop``)."""
    from shunter.policies.registry import import_object

    if isinstance(spec, str):
        target = BUILTIN_ENVIRONMENTS.get(spec, spec)
        if ":" not in target:
            known = ", ".join(sorted(BUILTIN_ENVIRONMENTS))
            raise ValueError(f"unknown environment {spec!r}: not a built-in ({known}) nor 'module:Class'")
        cls = import_object(target, "environment")
    else:
        cls = spec
    name = environment_name(spec)
    if not isinstance(cls, type):
        raise ValueError(f"environment {name}: {cls!r:.80} is not a class (one object is made per trajectory)")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"environment {name}: {cls.__name__} lacks {', '.join(missing)}")
    _check_arity(cls, name)
    stop = getattr(cls, "stop", None)
    if (
        isinstance(stop, str)
        or not isinstance(stop, list | tuple)
        or not stop
        or not all(isinstance(x, str) and x for x in stop)
    ):
        raise ValueError(
            f"environment {name}: {cls.__name__}.stop must be a non-empty list of non-empty "
            f"strings (the text that ends a tool call), got {stop!r}"
        )
    return cls


def _check_arity(cls: type, name: str) -> None:
    """The class is made with no arguments, ``reset`` takes (prompt, transcript), ``step``
    (action), ``close`` (if the class has one) nothing."""
    calls = [
        (f"{cls.__name__}()", cls, 0),
        (f"{cls.__name__}.reset", getattr(cls, "reset"), 3),  # noqa: B009 - checked callable above
        (f"{cls.__name__}.step", getattr(cls, "step"), 2),  # noqa: B009
    ]
    if callable(close := getattr(cls, "close", None)):
        calls.append((f"{cls.__name__}.close", close, 1))
    for what, fn, args in calls:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: taken on trust
            continue
        try:
            sig.bind(*([None] * args))
        except TypeError as e:
            want = {0: "no arguments", 3: "(self, prompt, transcript)", 2: "(self, action)", 1: "(self)"}[args]
            raise ValueError(f"environment {name}: {what} cannot be called with {want}: {e}") from None


def environment_name(spec: str | type | object) -> str:
    """How events and messages name an environment: its spec, or a class's ``module:qualname``."""
    if isinstance(spec, str):
        return spec
    return f"{getattr(spec, '__module__', '?')}:{getattr(spec, '__qualname__', repr(spec))}"


MAX_STUCK_LOOPS = 16
"""Environment loops a replica gives up on (each held by an ``async`` call that blocks and
never returns) before new calls wait on the last one, and time out."""


class EnvLoop:
    """A replica's own event loop for its environments' ``async`` calls, in a daemon thread: an
    ``async def step`` that blocks (``time.sleep``, a synchronous HTTP call) holds this loop,
    never the replica's — so vLLM's outputs and the other samples go on and the call's timeout
    fires. A loop still held by a call that timed out is left to it and calls go to a fresh one
    (up to ``MAX_STUCK_LOOPS``)."""

    def __init__(self) -> None:
        self._loop = self._start()
        self.stuck = 0
        self.closed = False

    @staticmethod
    def _start() -> asyncio.AbstractEventLoop:
        import threading

        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="shunter-env-loop", daemon=True).start()
        return loop

    async def run(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
        """``await fn(*args)`` on the environment loop, bounded by ``timeout_s`` on the caller's."""
        import concurrent.futures

        if self.closed:  # a stopped loop would never run the call: it would only time out
            raise RuntimeError("the replica's environment loop is closed (the replica is shutting down)")
        fut: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(_awaited(fn, args), self._loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)
        except TimeoutError:
            if not fut.done() and self.stuck < MAX_STUCK_LOOPS:  # the loop may be blocked: use a fresh one
                self.stuck += 1
                self._loop = self._start()
            raise

    def close(self) -> None:
        self.closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)


async def _awaited(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return await fn(*args)


async def _made(factory: Callable[[], Any]) -> Any:
    """The environment object, made on the environment loop."""
    return factory()


class EnvCalls:
    """One trajectory's environment on one replica, every call contained and bounded.

    ``loop``: where ``async`` calls run (an :class:`EnvLoop` on real replicas); None: on the
    caller's loop (the in-process fakes and the simulator, whose virtual clock must not race a
    real thread)."""

    def __init__(self, factory: Callable[[], Any], name: str, timeout_s: float, loop: EnvLoop | None = None) -> None:
        self.factory, self.name, self.timeout_s, self.loop = factory, name, timeout_s, loop
        self.env: Any = None
        self.closed = False

    @property
    def stop(self) -> tuple[str, ...]:
        return tuple(getattr(self.env, "stop", ()) or ())

    async def make(self) -> tuple[EnvFailure | None, str]:
        """Make the environment object; ``(failure, error)`` when that failed. With an
        environment loop, it is made there (where its ``async`` calls run), bounded by
        ``env_timeout_s`` like them: a constructor that opens a sandbox or a socket and hangs
        holds that loop, not the replica's."""
        try:
            if self.loop is None:
                self.env = self.factory()
            else:
                async with asyncio.timeout(self.timeout_s):
                    self.env = await self.loop.run(_made, (self.factory,), self.timeout_s + 1.0)
        except TimeoutError:
            return (
                "timeout",
                f"environment {self.name}() took longer than task.env_timeout_s = {secs(self.timeout_s)} s",
            )
        except Exception as e:  # noqa: BLE001 - the user's class: reported
            return "raised", f"environment {self.name}() raised {describe(e, limit=500)}"
        return None, ""

    async def reset(self, prompt: PromptSpec, transcript: str) -> tuple[EnvFailure | None, str]:
        """Reset the environment made; ``(failure, error)`` when that failed."""
        failure, error, _ = await self._call("reset", prompt, transcript)
        return failure, error

    async def step(self, action: str) -> tuple[StepResult | None, EnvFailure | None, str]:
        failure, error, out = await self._call("step", action)
        if failure is not None:
            return None, failure, error
        if not isinstance(out, StepResult):
            return (
                None,
                "returned",
                f"environment {self.name}.step returned {type_name(out)}; expected shunter.StepResult",
            )
        bad = (
            [f"metrics[{k!r}] {v!r:.40} (not a finite number)" for k, v in out.metrics.items() if not _finite(v)]
            + [f"metrics[{k!r}] (a name the engine reports itself)" for k in out.metrics if k in FAILURES]
            if isinstance(out.metrics, dict)
            else [f"metrics {type_name(out.metrics)} (not a dict)"]
        )
        bad += [] if isinstance(out.observation, str) else [f"observation {type_name(out.observation)} (not a str)"]
        bad += [] if _finite(out.reward) else [f"reward {out.reward!r:.40} (not a finite number)"]
        if bad:
            return None, "returned", f"environment {self.name}.step returned a StepResult with bad {', '.join(bad)}"
        return out, None, ""

    async def close(self) -> tuple[EnvFailure | None, str]:
        """Call the environment's ``close()``, when it has one, the first time only (the object
        is done with either way); ``(failure, error)`` when it failed."""
        if self.closed:
            return None, ""
        self.closed = True
        if self.env is None or not _has_close(self.env):
            return None, ""
        failure, error, _ = await self._call("close")
        return failure, error

    async def _call(self, method: str, *args: Any) -> tuple[EnvFailure | None, str, Any]:
        try:
            fn = getattr(self.env, method)
            async with asyncio.timeout(self.timeout_s):
                if inspect.iscoroutinefunction(fn) and self.loop is not None:
                    out = await self.loop.run(fn, args, self.timeout_s + 1.0)  # the outer timeout fires first
                elif inspect.iscoroutinefunction(fn):
                    out = await fn(*args)
                else:
                    out = await asyncio.to_thread(fn, *args)
                    if inspect.isawaitable(out):
                        out = await out
        except TimeoutError:
            return (
                "timeout",
                f"environment {self.name}.{method} took longer than task.env_timeout_s = {secs(self.timeout_s)} s",
                None,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's environment: reported
            return "raised", f"environment {self.name}.{method} raised {describe(e, limit=500)}", None
        return None, "", out


def _finite(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def _has_close(env: object) -> bool:
    try:
        return callable(getattr(env, "close", None))
    except Exception:  # noqa: BLE001 - a __getattr__ that raises: the call reports it
        return True


# -- the built-in calculator tool ---------------------------------------------------------------
_CALL = re.compile(r"([0-9+\-* ]+)=$")
_OPS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
MAX_OPERAND = 10**12
MAX_EXPRESSION = 200


def evaluate(expr: str) -> int:
    """An integer expression of ``+ - *`` on non-negative integers (precedence as in Python);
    ValueError for anything else or operands beyond ``MAX_OPERAND``."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= MAX_OPERAND:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if max(abs(left), abs(right)) > MAX_OPERAND:
                raise ValueError("operand too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"not an arithmetic expression: {expr!r}")

    if len(expr) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
        return walk(tree.body)
    except (SyntaxError, RecursionError, MemoryError):
        raise ValueError(f"not an arithmetic expression: {expr[:40]!r}") from None


class Calculator:
    """A calculator tool: the model writes an expression ending in ``=`` (``23+45=``), the
    tool answers its value (``68``); a malformed call is answered ``err``. The expression is
    the run of digits, ``+ - *`` and spaces just before the ``=`` (``7/2=`` evaluates ``2``). Metrics per
    trajectory: ``tool_calls`` (calls made), ``tool_ok`` (1 when a call's value was the
    prompt's answer)."""

    stop = ("=",)
    max_calls = 4

    def __init__(self) -> None:
        self.answer = ""
        self.calls = 0
        self.ok = 0.0

    async def reset(self, prompt: PromptSpec, transcript: str) -> None:
        self.answer = prompt.answer.strip()
        self.calls = transcript.count("=")

    async def step(self, action: str) -> StepResult:
        self.calls += 1
        m = _CALL.search(action)
        try:
            value = str(evaluate(m.group(1))) if m else "err"
        except ValueError:
            value = "err"
        if value == self.answer:
            self.ok = 1.0
        return StepResult(
            observation=value,
            done=self.calls >= self.max_calls,
            metrics={"tool_calls": float(self.calls), "tool_ok": self.ok},
        )
