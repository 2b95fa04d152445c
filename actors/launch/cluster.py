"""The Ray cluster a run lives in: joining or starting it, where the driver's host is, and
whether there is room for what a run asks for.

Invariants: a run started here listens on 127.0.0.1 only (``local_only``); a run joining a
cluster (``run.ray_address``) uses it as it is. What a run asks for — CPUs, GPUs and the custom
resources that pick nodes (``trainer.resources``, ``rollout.resources``) — is checked against
the cluster before an actor is made, so a request no node can ever meet is an error naming the
config key, never an actor that waits for ever; a request the cluster could meet once a node
comes back (or is added) waits for room, saying what it waits for, up to a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from shunter.engine.io.errors import EngineSetupError, secs
from shunter.events.vocab import WaitOutcome

NAMESPACE = "shunter"
RAY_SESSION = "ray_session"
"""In the run folder: the session folder of the local Ray cluster the run started."""


START_TRIES = 2
"""Tries at starting a local Ray cluster: Ray gives its node 30 s (hard-coded in Ray 2.60) to
register, which a machine with every core busy can miss once (seen in CI)."""


def init_ray(address: str, num_cpus: float) -> bool:
    """Join the cluster at ``address`` (empty: start a local one on 127.0.0.1); True when this
    process started or joined it (and so must shut it down), False when Ray was up already.
    The process's SIGINT / SIGTERM handlers are still in force afterwards (:func:`handlers_kept`).
    A join ``ray.init`` refuses is an ``EngineSetupError`` naming the address (``join.reach``
    has asked the cluster first: what is left is rare)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    kw: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": bool(os.environ.get("SHUNTER_RAY_LOGS"))}
    if address:
        try:
            with handlers_kept(after_init=True):
                ray.init(address=address, **kw)
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as e:  # a cluster it cannot join
            said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise EngineSetupError(f"could not join the Ray cluster at {address} (run.ray_address): {said}") from None
        return True
    local_only()
    for attempt in range(1, START_TRIES + 1):
        try:
            with handlers_kept(after_init=True):
                ray.init(
                    num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1", **kw
                )
            return True
        except Exception as e:  # Ray's "timed out during startup" is a bare Exception
            if "during startup" not in str(e):
                raise
            ray.shutdown()  # what the failed start left running goes first
            if attempt == START_TRIES:
                raise EngineSetupError(f"could not start a local Ray cluster ({attempt} tries): {e}") from e
    raise AssertionError("unreachable")


def driver_node() -> str:
    """Ray's id of the node this process runs on: the run's folder is on its disk, so the actors
    that write there (the coordinator, the registry) are pinned to it."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


def on_node(node_id: str) -> dict[str, Any]:
    """Ray options that pin an actor to ``node_id`` (it dies with that node: never moved)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


def request(cpus: float, gpus: float, custom: dict[str, float] | None = None) -> dict[str, float]:
    out = {"CPU": cpus, "GPU": gpus, **(custom or {})}
    return {k: v for k, v in out.items() if v > 0}


def missing(need: dict[str, float], have: dict[str, float]) -> dict[str, float]:
    """What of ``need`` is not in ``have`` (resource -> the amount asked for)."""
    return {k: v for k, v in need.items() if v > float(have.get(k, 0.0)) + 1e-9}


def check_total(need: dict[str, float], what: str, knobs: dict[str, str]) -> None:
    """``EngineSetupError`` if the cluster as a whole (every node, busy or not) cannot meet
    ``need``: no actor Ray could never schedule is made. ``knobs``: resource -> the config key
    that asks for it."""
    import ray

    have = ray.cluster_resources()
    short = missing(need, have)
    if short:
        raise EngineSetupError(f"no room in the Ray cluster for {what}: " + _describe(short, have, knobs))


async def wait_for_room(
    need: dict[str, float],
    what: str,
    knobs: dict[str, str],
    deadline_s: float,
    waiting: Callable[[dict[str, float], dict[str, float]], Awaitable[None]],
    waited: Callable[[WaitOutcome, float], Awaitable[None]],
    *,
    deadline_knob: str = "rollout.replacement_wait_s",
    poll_s: float = 0.5,
) -> float:
    """Wait until the cluster has ``need`` free (a lost node's capacity back, a node added, or
    another run's actors gone); ``waiting(missing, free)`` is awaited once, when it must wait, and
    then ``waited(outcome, seconds)`` once, when the wait ends — every "waiting" line gets its "done
    waiting" line. Returns the seconds waited; ``EngineSetupError`` past ``deadline_s``
    (``deadline_knob``) naming what was missing."""
    import ray

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    said = False
    while True:
        have = ray.available_resources()
        short = missing(need, have)
        if not short:
            if said:
                await waited("placed", loop.time() - t0)
            return loop.time() - t0
        if not said:
            said = True
            await waiting(short, {k: float(have.get(k, 0.0)) for k in short})
        if loop.time() - t0 >= deadline_s:
            await waited("gave_up", loop.time() - t0)
            raise EngineSetupError(
                f"no room in the Ray cluster for {what} within {secs(deadline_s)}s "
                f"({deadline_knob}): " + _describe(short, have, knobs)
            )
        await asyncio.sleep(poll_s)  # polling the cluster's free resources, not a synchronisation


def _describe(short: dict[str, float], have: dict[str, float], knobs: dict[str, str]) -> str:
    parts = []
    for k, v in short.items():
        knob = knobs.get(k, "")
        got = float(have.get(k, 0.0))
        if k in ("CPU", "GPU") or got > 0:
            parts.append(f"it needs {v:g} {k} ({knob}), the cluster has {got:g}")
        else:
            parts.append(
                f"it needs {v:g} of the custom resource {k!r} ({knob}) and no node offers it — start one with "
                f"`ray start --address=<head> --resources='{{\"{k}\": {max(1, round(v))}}}'`"
            )
    return "; ".join(parts)


def local_only() -> None:
    """Make the local Ray cluster about to start listen on 127.0.0.1 only.

    ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough in Ray 2.60: it replaces a
    loopback node address with the machine's routable one (``ray/_private/services.py``,
    ``resolve_ip_for_localhost``) and every server binds from that — the GCS, the raylet,
    each worker's gRPC server, the runtime-env agent on all interfaces, and the autoscaler's
    Prometheus metrics (no token) on ``0.0.0.0``. Ray has no bind-address setting; the switch
    that keeps a node on loopback is ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (it marks the
    node as local-only), read once at import, so both the variable (for the processes Ray
    starts) and the constant (for this one, whose ``ray`` may already be imported) are set.
    ``tests/e2e/test_operator.py`` lists the sockets of a running run's process tree to hold this."""
    import ray._private.ray_constants as ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def shutdown_keeping_signal_handlers() -> None:
    """``ray.shutdown()``, then the SIGINT / SIGTERM handlers Python had put back in force.

    Ray 2.60's shutdown resets the process's SIGTERM disposition to the default (terminate)
    underneath Python, whose ``signal.getsignal`` still reports its own handler: a SIGTERM in
    the moments after a run stopped (an operator's second signal, a scheduler's) killed the
    driver before it could say where to ``--resume`` from (outsider report;
    ``tests/actors/test_ray_shutdown_signals.py``)."""
    import ray

    with handlers_kept():
        ray.shutdown()


@contextlib.contextmanager
def handlers_kept(after_init: bool = False) -> Iterator[None]:
    """The SIGINT / SIGTERM handlers in force before the block are in force after it, at the C
    level too (``signal.signal`` again: Python's ``getsignal`` does not see what Ray put beneath it).

    ``after_init``: around ``ray.init()``, which puts its own Python SIGTERM handler in place
    (``sys.exit``) and, under it, its core worker's C++ failure handler, which prints a stack
    dump (``*** SIGTERM received ... ***``) before handing the signal on. A program's own handler
    (the CLI's: stop at a consistent cut) comes back; where there was none, Ray's Python handler
    stays — registered again, without the dump beneath it. Only in the main thread (the only
    one Python lets set handlers)."""
    main = threading.current_thread() is threading.main_thread()
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        for signum, before in kept.items():
            handler = before
            if after_init and before in (signal.SIG_DFL, None):
                handler = signal.getsignal(signum)
            if handler is not None:
                signal.signal(signum, handler)


def reap_orphans(record: Path) -> list[str]:
    """End the processes of the local Ray cluster an earlier driver of this run started and
    left behind when it was killed (``kill -9`` of ``shunter run``: Ray's GCS, raylet and
    workers die with it, but its dashboard and runtime-env agents live on, orphaned). Only
    processes that name that cluster's session folder and whose parent is gone are touched, and
    none while a GCS of that session still runs: a live GCS is a live cluster — one an operator
    started with ``ray start`` has every daemon re-parented to init, and is never a run's orphan
    (a resume against such a cluster once ended it). Returns their names."""
    import psutil

    try:
        session = record.read_text().strip()
    except OSError:
        return []
    if not session or not Path(session).is_absolute():
        return []
    named = []
    for p in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or ())
        except psutil.Error:
            continue
        if session in cmd:
            named.append(p)
    if any("gcs_server" in (p.info["name"] or "") or "gcs_server" in " ".join(p.info["cmdline"] or ()) for p in named):
        return []  # the cluster lives: nothing of it is an orphan
    gone = []
    for p in named:
        try:
            if p.info["ppid"] == 1:
                p.kill()
                gone.append(p.info["name"])
        except psutil.Error:
            continue
    return gone
