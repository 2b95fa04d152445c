"""``PolicyWorker``: runs a user policy's ``decide()`` on a thread the coordinator can abandon.

A ``decide()`` the coordinator called on its own event loop and that never returns freezes the
run: no event handled, no stall timeout, no ``Stop``. The watchdog (``engine/coordinator/watchdog.py``)
interrupts a call stuck in Python bytecode, but not one blocked inside C (a lock, a socket, a
native library) — only the call's return would deliver it. So a user's policy runs here: the
coordinator hands each call to one daemon thread and waits at most ``timeout_s`` for it; a
call not back by then is given up: the coordinator goes on (and ends the run), the thread is
left where it is (a daemon: it never holds the process's exit).

Invariants: calls run one at a time, in order, on one thread (a policy sees no concurrency
it did not have on the loop); a call's result or exception comes back to the caller exactly
as ``decide()`` gave it; after a call was given up the worker takes no more calls
(:attr:`abandoned`) — the policy's state may be half-updated, and the stuck thread may still
hold it. Cost: about 25 µs a call on the 2-core machine (a queue put and an event wait), which
is why the built-in policies, shunter's own and tested never to block, stay on the loop.
Left out: a call blocked in C that also holds the GIL (a native library that never releases
it) stops every thread of the process; only a policy in its own process would survive that.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from shunter.engine.io.errors import secs


class GivenUp(Exception):
    """The call did not return within its timeout; the worker was abandoned."""


class _Call:
    __slots__ = ("fn", "args", "done", "value", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class PolicyWorker:
    def __init__(self, name: str = "shunter-policy") -> None:
        self.name = name
        self._q: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.abandoned = False

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` on the worker thread; raises ``GivenUp`` if it is not back within
        ``timeout_s`` (and the worker takes no more calls)."""
        if self.abandoned:
            raise GivenUp("the policy's thread was given up earlier")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        c = _Call(fn, args)
        self._q.put(c)
        if not c.done.wait(timeout_s):
            self.abandoned = True
            raise GivenUp(f"did not return within {secs(timeout_s)}s")
        if c.error is not None:
            raise c.error
        return c.value

    def _run(self) -> None:
        while not self.abandoned:
            c = self._q.get()
            try:
                c.value = c.fn(*c.args)
            except BaseException as e:  # noqa: BLE001 - handed back to the caller as it came
                c.error = e
            c.done.set()
