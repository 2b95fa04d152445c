"""After the run's own Ray cluster is shut down, the driver's SIGTERM / SIGINT handlers are
still in force (``actors.launch.cluster.shutdown_keeping_signal_handlers``): Ray 2.60's shutdown resets
SIGTERM to terminate underneath Python, so a signal in the moments after a stopped run killed
``shunter run`` before it said where to resume from; and after ``init_ray`` the program's
SIGTERM handler is in force, not Ray's. In a process of its own (the tier's shared cluster must
stay up)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.actors, pytest.mark.timeout(120)]

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import ray
    from shunter.actors.launch.cluster import shutdown_keeping_signal_handlers

    got = []
    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, f: got.append(s))
    {shutdown}
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the handlers run between bytecodes of this loop
    print("handled", sorted(got), flush=True)
    """
)


def _run(shutdown: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    code = SCRIPT.format(shutdown=shutdown)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=100)


def test_the_drivers_signal_handlers_outlive_the_clusters_shutdown():
    out = _run("shutdown_keeping_signal_handlers()")
    assert out.returncode == 0 and "handled [2, 15]" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_ray_shutdown_alone_leaves_sigterm_deadly():
    """What the function works around (if Ray fixes it, this fails and the workaround can go)."""
    out = _run("ray.shutdown()")
    assert out.returncode == -15, out.stdout[-2000:] + out.stderr[-2000:]


INIT = textwrap.dedent(
    """
    import os, signal, sys, time
    from shunter.actors.launch.cluster import init_ray, shutdown_keeping_signal_handlers

    got = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    init_ray("", 1)
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs between bytecodes of this loop
    print("handled", got, flush=True)
    shutdown_keeping_signal_handlers()
    """
)


def test_the_programs_sigterm_handler_outlives_ray_init_without_rays_stack_dump():
    """``ray.init()`` puts its own SIGTERM handler (``sys.exit``) in place and, beneath it, its core
    worker's, which prints a stack dump (``*** SIGTERM received ... ***``); ``init_ray`` gives
    the program's handler back (issue 46)."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    out = subprocess.run([sys.executable, "-c", INIT], capture_output=True, text=True, env=env, timeout=100)
    assert out.returncode == 0 and "handled [15]" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert "SIGTERM received" not in out.stderr, out.stderr[-2000:]
