"""After ``kill -9`` of ``shunter run``, Ray's dashboard and runtime-env agents of its local
cluster live on, orphaned (issue 14, chaos soak); the next start of the run ends them — only
orphans that name the recorded session folder."""

from __future__ import annotations

import subprocess

import psutil

from shunter.actors.launch.cluster import reap_orphans


def _orphan(tag: str, name: str = "ray::Agent") -> int:
    """A process whose parent is gone (as the agents after their driver's kill)."""
    out = subprocess.run(
        ["setsid", "bash", "-c", f'exec -a "{name} {tag}" sleep 300 >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.split()[-1])
    return pid


def _kill(*pids: int) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def test_orphans_of_the_recorded_session_are_ended_and_nothing_else(tmp_path):
    session = str(tmp_path / "session_2026-12-01_killed")
    ours, other = _orphan(session), _orphan(str(tmp_path / "session_other"))
    try:
        (tmp_path / "ray_session").write_text(session)
        assert psutil.Process(ours).ppid() == 1, "the sandbox does not reparent orphans to init"
        gone = reap_orphans(tmp_path / "ray_session")
        assert gone == ["sleep"]
        psutil.Process(ours).wait(timeout=10)
        assert psutil.Process(other).is_running()
        assert reap_orphans(tmp_path / "missing") == []
    finally:
        _kill(ours, other)


def test_a_live_cluster_of_the_recorded_session_is_never_reaped(tmp_path):
    """A cluster an operator started (``ray start``: every daemon re-parented to init, its GCS
    running) is not a killed run's leftovers: ``--resume`` against it once ended the whole cluster."""
    session = str(tmp_path / "session_2026-12-07_operators")
    gcs, agent = _orphan(f"--session-dir={session}", "/venv/ray/core/src/ray/gcs/gcs_server"), _orphan(session)
    try:
        (tmp_path / "ray_session").write_text(session)
        assert reap_orphans(tmp_path / "ray_session") == []
        assert psutil.Process(gcs).is_running() and psutil.Process(agent).is_running()
    finally:
        _kill(gcs, agent)
