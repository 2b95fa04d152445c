"""``shunter run`` as an operator runs it (issue 14), in its own OS process: while it trains,
every TCP socket its process tree listens on is bound to 127.0.0.1 (the Ray servers, the
autoscaler's metrics, the actors' gRPC servers, the vLLM engine); Ctrl-C (SIGINT to the process
group) stops it at a sync boundary with exit status 130 and says how to resume; ``--resume``
completes it, and over its two attempts every prompt up to the last trained one was trained
exactly once (``on_stale = "wait"``). SIGTERM's stop (143) mid-run is the chaos test's
(``test_chaos.py``, which checks the same of it); a SIGTERM while it starts stops it without
Ray's stack dump. A second Ctrl-C while it stops ends it at once: a line or two saying what
``--resume`` will continue from, no traceback, and no process of its Ray cluster left running."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from shunter.engine.io.records import trained_groups
from shunter.events import LogReader, RunResumed, StepEnd

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30
STOP_AFTER = 11  # mid-cycle (parameter_sync_step = 2)


def _config(folder: Path, tiny_model: str) -> Path:
    """The chaos soak's config (the sort example, short, checkpoints every 4 steps)."""
    from tests.support import chaos_soak

    return chaos_soak.config(folder, tiny_model, STEPS)


def _shunter(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "shunter.cli", "run", *args, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal would start it
        preexec_fn=_as_from_a_terminal,
    )


def _as_from_a_terminal() -> None:
    """SIGINT as a terminal leaves it: a test runner started in the background (``cmd &``)
    ignores SIGINT, and a child would inherit that (Python keeps an ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _steps(log: Path) -> int:
    if not log.is_file():
        return 0
    return max((m.step for m in LogReader(log) if isinstance(m, StepEnd)), default=0)


def _until_steps(proc: subprocess.Popen, log: Path, steps: int) -> None:
    """Wait until the run has logged ``steps`` (a bound, not a synchronisation: the run reports them)."""
    me = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    while _steps(log) < steps:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run did not reach its steps"
        psutil.wait_procs([me], timeout=0.5)  # returns at once if it exits


def _listening(pid: int) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of ``pid``'s process tree."""
    root = psutil.Process(pid)
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            conns = p.net_connections(kind="tcp")
            name = p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out += [(c.laddr.ip, c.laddr.port, name) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_a_run_listens_only_on_loopback_stops_on_ctrl_c_and_resumes_exactly_once(tiny_model, tmp_path):
    """One run: Ctrl-C to its process group at step 11 (exit 130), ``--resume`` to the end."""
    cfg = _config(tmp_path, tiny_model)
    run = tmp_path / "runs" / "op"
    log = run / "events.bin"
    procs = [_shunter(str(cfg), "--run-id", "op")]
    try:
        _until_steps(procs[0], log, STOP_AFTER)
        seen = _listening(procs[0].pid)
        assert len(seen) >= 4, f"expected Ray's servers in the listing, got {seen}"
        exposed = [s for s in seen if not _loopback(s[0])]
        assert not exposed, f"listening beyond 127.0.0.1: {exposed}"
        os.killpg(procs[0].pid, signal.SIGINT)  # Ctrl-C reaches the terminal's whole process group
        err = procs[0].communicate(timeout=240)[1]
        assert procs[0].returncode == 130, err[-3000:]
        assert f"--resume {run}" in err and "Traceback" not in err, err[-3000:]
        stopped = _steps(log)
        assert stopped % 2 == 0, f"stopped mid-cycle at step {stopped}"
        procs.append(_shunter(str(cfg), "--resume", str(run)))
        _, err = procs[-1].communicate(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert procs[-1].returncode == 0, err[-3000:]
    msgs = list(LogReader(log))
    assert sum(isinstance(m, RunResumed) for m in msgs) == 1
    groups = Counter(g for _, gs in trained_groups(log) for g in gs)
    assert len(trained_groups(log)) == STEPS
    assert set(groups.values()) == {1}, "a group trained twice"
    assert sorted(groups) == list(range(len(groups))), "prompts skipped (wait mode trains oldest first)"


def test_a_second_ctrl_c_stops_at_once_quietly_and_leaves_no_process(tiny_model, tmp_path):
    """Was: two Ctrl-C's a second apart exited 130 printing about 77 lines (Ray's shutdown, asyncio's
    'Task exception was never retrieved'), or, a little later, nothing at all."""
    from shunter.actors.launch.cluster import RAY_SESSION

    cfg = _config(tmp_path, tiny_model)
    run = tmp_path / "runs" / "op2"
    log = run / "events.bin"
    proc = _shunter(str(cfg), "--run-id", "op2")
    try:
        _until_steps(proc, log, 5)
        me = psutil.Process(proc.pid)
        tree = [me, *me.children(recursive=True)]
        os.killpg(proc.pid, signal.SIGINT)
        psutil.wait_procs([me], timeout=0.3)  # the second comes while the first stop runs (or just after)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    said = err[err.index("stopping:") :]
    assert "Traceback" not in err and "never retrieved" not in err, err[-3000:]
    assert len(said.strip().splitlines()) <= 5, said  # the stop, then what --resume continues from
    assert f"--resume {run}" in said or "nothing to resume" in said, said
    _, alive = psutil.wait_procs(tree, timeout=30)  # the cluster's processes end with the driver
    session = (run / RAY_SESSION).read_text().strip()
    left = [p for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or ())]
    assert not left, [" ".join(p.info["cmdline"])[:200] for p in left]
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], alive


def test_a_sigterm_while_the_run_starts_stops_it_without_rays_stack_dump(tiny_model, tmp_path):
    """SIGTERM after Ray is up, while the run's actors start (issue 46): the run's own stop (143,
    what is left to do), never Ray's handlers — its core worker's stack dump
    (``*** SIGTERM received ... ***``) and its ``sys.exit`` — which ``ray.init()`` put in place."""
    from shunter.actors.launch.cluster import RAY_SESSION

    cfg = _config(tmp_path, tiny_model)
    run = tmp_path / "runs" / "op3"
    proc = _shunter(str(cfg), "--run-id", "op3")
    try:
        me = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while not (run / RAY_SESSION).is_file():  # written once ray.init() returned
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "Ray did not start"
            psutil.wait_procs([me], timeout=0.1)  # returns at once if it exits
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert "SIGTERM received" not in err and "Traceback" not in err, err[-3000:]
    assert "interrupted: the run stopped" in err, err[-3000:]
