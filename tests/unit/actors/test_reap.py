"""After ``kill -9`` of ``shunter run``, Ray's dashboard and runtime-env agents of its local
cluster live on, orphaned (issue 14, chaos soak); the next start of the run ends them — only
orphans that name the recorded session folder."""

from __future__ import annotations

import subprocess

import psutil

from shunter.actors.launch.cluster import reap_orphans


def _orphan(tag: str) -> int:
    """A process whose parent is gone (as the agents after their driver's kill)."""
    out = subprocess.run(
        ["setsid", "bash", "-c", f'exec -a "ray::Agent {tag}" sleep 300 >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.split()[-1])
    return pid


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
        for pid in (ours, other):
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
