"""``shunter run --address`` at a cluster it cannot join, as an operator meets it (issue 46): a
port where nothing listens, a port where something that is not Ray's GCS listens, and a real
cluster with token authentication that the run has no token for. Each ends within
``run.connect_timeout_s`` with one ``shunter:`` line naming the address and what to check, exit
status 1 (was: Ray's "Failed to connect to GCS" lines for ever, or ~20 lines of
``InvalidAuthToken`` and a traceback). Ctrl-C or SIGTERM while the run waits for the cluster ends
it at once, in one line (was: ignored; SIGTERM took ~30 s)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.ray_nodes import RayNodes

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CONNECT_TIMEOUT_S = 3


def _config(folder: Path, tiny_model: str, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> Path:
    text = (ROOT / "examples" / "sort_separate.toml").read_text()
    cfg = folder / "job.toml"
    cfg.write_text(
        text.replace('path = ".shunter/models/sort-tiny"', f'path = "{tiny_model}"')
        .replace('output_dir = "runs"', f'output_dir = "{folder / "runs"}"')
        .replace("[run]\n", f"[run]\nconnect_timeout_s = {connect_timeout_s}\n", 1)
    )
    return cfg


def _env(**extra: str) -> dict[str, str]:
    """This environment without Ray's auth settings or a default address (the tests set their own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env.pop("RAY_ADDRESS", None)
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


def _shunter(cfg: Path, address: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "shunter.cli", "run", str(cfg), "--no-progress", "--address", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _env(),
        start_new_session=True,  # its own process group, as a terminal would start it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal leaves SIGINT
    )


def _ended(proc: subprocess.Popen, timeout: float) -> tuple[int, list[str]]:
    """Its exit status and stderr's lines, once it exits within ``timeout`` (else killed, failing)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"still running after {timeout:g}s; its stderr: {err[-3000:]}") from None
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def listener():
    """A TCP port where something listens that is not Ray: connections wait in its backlog,
    never answered. On every interface: Ray resolves 127.0.0.1 to the machine's address."""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen(8)
        yield s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("where", ["nothing listens", "something else listens"])
def test_a_dead_or_wrong_address_ends_in_one_line_within_the_connect_timeout(tiny_model, tmp_path, listener, where):
    port = _free_port() if where == "nothing listens" else listener.getsockname()[1]
    proc = _shunter(_config(tmp_path, tiny_model), f"127.0.0.1:{port}")
    status, lines = _ended(proc, timeout=60)  # connect_timeout_s = 3; was: 20 tries of up to 40 s each
    assert status == 1 and len(lines) == 1, lines
    said = lines[0]
    assert said.startswith(f"shunter: the run did not start: no Ray cluster at 127.0.0.1:{port} (run.ray_address"), said
    assert f"no answer within {CONNECT_TIMEOUT_S}s (run.connect_timeout_s)" in said, said
    assert ("nothing listens on port" if where == "nothing listens" else "it does not answer as a Ray GCS") in said
    assert "ray start --head" in said and "docs/cluster.md" in said, said
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "a run that never began left a run folder"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_while_the_run_waits_for_its_cluster_ends_it_at_once(tiny_model, tmp_path, listener, signum):
    port = listener.getsockname()[1]
    proc = _shunter(_config(tmp_path, tiny_model, connect_timeout_s=300), f"127.0.0.1:{port}")
    try:
        listener.settimeout(120)
        conn, _ = listener.accept()  # the run is asking this port for a GCS now
        conn.close()
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the run never reached the address: {proc.communicate()[1][-3000:]}") from None
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's whole process group
    else:
        proc.send_signal(signal.SIGTERM)
    status, lines = _ended(proc, timeout=30)  # at once: the 300 s of connect_timeout_s are not waited out
    assert status == (130 if signum == signal.SIGINT else 143), lines
    assert lines == [f"interrupted while reaching the Ray cluster at 127.0.0.1:{port}: nothing was started"], lines


def test_a_missing_auth_token_is_one_line_naming_the_settings(tiny_model, tmp_path):
    """A real head with token authentication (``ray start`` with ``RAY_AUTH_MODE=token`` and a
    token file of its own); the run is started without them. The same probe with the cluster's
    token answers (the check refuses only what ``ray.init`` would fail on)."""
    nodes = RayNodes()
    try:
        address = nodes.head({"node_a": 1})
        status, lines = _ended(_shunter(_config(tmp_path, tiny_model), address), timeout=60)
        assert status == 1 and len(lines) == 1, lines  # was: ~20 InvalidAuthToken lines and a traceback
        said = lines[0]
        assert said.startswith(f"shunter: the run did not start: the Ray cluster at {address}"), said
        assert "RAY_AUTH_MODE is unset here, so it sent no auth token" in said, said
        assert "RAY_AUTH_MODE=token" in said and "RAY_AUTH_TOKEN_PATH" in said and "docs/cluster.md" in said, said
        probe = textwrap.dedent(
            f"""
            import asyncio
            from shunter.actors.launch.join import reach
            asyncio.run(reach({address!r}, 30))
            """
        )
        wrong = tmp_path / "other_token"
        wrong.write_text("0" * 64)
        other = subprocess.run(
            [sys.executable, "-c", probe],
            env=_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(wrong)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"the token it sent (RAY_AUTH_TOKEN_PATH={wrong}) is not the cluster's" in other.stderr, other.stderr
        right = subprocess.run([sys.executable, "-c", probe], env=nodes.env, capture_output=True, text=True, timeout=60)
        assert right.returncode == 0, right.stderr[-3000:]
    finally:
        nodes.stop()
