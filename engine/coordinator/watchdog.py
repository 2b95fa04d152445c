"""``Watchdog``: interrupts a call of user code that runs past its deadline in another thread.

A policy's ``decide()`` runs on the coordinator's event loop; one that never returns (an
endless loop) would freeze the run — no event handled, no stall timeout, no ``Stop``. The
watchdog is one daemon thread per process that looks at the calls it watches every
``TICK_S`` and raises :class:`Stuck` inside a thread whose call is past its deadline
(``PyThreadState_SetAsyncExc``: delivered at the next Python bytecode, so a pure-Python loop
is interrupted; a call blocked inside C — ``time.sleep`` — only when it returns).

Invariant: ``Stuck`` is raised in a thread only between :meth:`begin` and :meth:`end` of one
watched call: ``end`` takes the same lock as the firing and withdraws an exception that was
fired but not delivered yet, so it can never surface in the code after the call.
"""

from __future__ import annotations

import ctypes
import threading
import time

TICK_S = 0.05


class Stuck(Exception):
    """Raised inside a watched call that ran past its deadline."""


class Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}  # thread id -> deadline (monotonic)
        self._fired: set[int] = set()
        self._thread: threading.Thread | None = None

    def begin(self, timeout_s: float, tid: int) -> None:
        """Watch thread ``tid``'s (the caller's, ``threading.get_ident()``) next ``timeout_s``
        seconds, until :meth:`end`."""
        if self._thread is None:
            self._start()
        self._deadlines[tid] = time.monotonic() + timeout_s

    def end(self, tid: int) -> None:
        with self._lock:
            self._deadlines.pop(tid, None)
            if tid in self._fired:  # fired but perhaps not delivered: withdraw it
                self._fired.discard(tid)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="shunter-watchdog", daemon=True)
                self._thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            with self._lock:
                for tid, deadline in list(self._deadlines.items()):
                    if now > deadline and tid not in self._fired:
                        self._fired.add(tid)
                        del self._deadlines[tid]
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(Stuck))


WATCHDOG = Watchdog()
"""The process's watchdog (its thread starts on first use)."""
