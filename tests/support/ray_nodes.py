"""Ray nodes started the way operators start them — the ``ray`` CLI, a token file of their own —
for the tests that join a cluster (``tests/e2e/test_cluster.py``, ``tests/e2e/test_join.py``),
ended by their own pids: never ``ray stop``, which ends every Ray cluster on the machine."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

RAY = Path(sys.executable).parent / "ray"
MARK = "SHUNTER_TEST_RAY_NODES"


class RayNodes:
    """Raylets started with the ``ray`` CLI under a temp folder of their own, so their processes
    are told apart from any other Ray cluster on the machine (the test session's) and ended
    without ``ray stop`` (which would end every cluster here)."""

    def __init__(self) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="shr", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
        # every process `ray start` starts (and theirs) inherits MARK: this cluster's, whatever else runs here
        # its own token, as an operator's cluster has: every process it starts and the run read it
        # (not ~/.ray/auth_token, which a fresh machine lacks until a local ray.init() writes it —
        # `ray start` with token auth on and no token refuses to start; a test racing that write
        # failed on a fresh machine)
        token = self.temp / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_DEDUP_LOGS": "0",
            MARK: str(self.temp),
        }
        self.env.pop("RAY_AUTH_TOKEN", None)
        self.env.pop("RAY_ADDRESS", None)
        # set to 0 by a local run in this process (actors.launch.cluster.local_only): it forbids a second node
        self.env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        self.address = ""
        self.raylets: set[str] = set()  # pids of its raylets, living or killed
        self.seen: set[psutil.Process] = set()  # every process of it found so far

    def _start(self, *args: str) -> None:
        out = subprocess.run(
            [str(RAY), "start", "--num-cpus=2", "--disable-usage-stats", "--node-ip-address=127.0.0.1", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]

    def head(self, resources: dict[str, float]) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._start(
            "--head", f"--port={port}", f"--temp-dir={self.temp}", "--include-dashboard=false",
            f"--resources={json.dumps(resources)}",
        )  # fmt: skip
        self.address = f"127.0.0.1:{port}"
        self.processes()  # remember its raylet
        return self.address

    def add(self, resources: dict[str, float]) -> None:
        self._start(f"--address={self.address}", f"--resources={json.dumps(resources)}")
        self.processes()  # remember its raylet

    def processes(self) -> list[psutil.Process]:
        """Its processes: those naming its folder, and those whose environment carries its mark or
        one of its raylets' pids (Ray's daemons and agents set their own process titles, but keep
        the environment they were started with), their descendants (the dashboard and runtime-env
        agents a raylet starts show neither), and any found before that still runs (the agents of
        a raylet killed mid-test live on, orphaned) — never another cluster's, so tests may run
        side by side."""
        mine = str(self.temp)
        found = [p for p in psutil.process_iter(["cmdline", "name"]) if mine in " ".join(p.info["cmdline"] or ())]
        self.raylets |= {str(p.pid) for p in found if "raylet" in (p.info["name"] or "")}
        for p in psutil.process_iter():
            try:
                env = p.environ()
                if p not in found and (env.get(MARK) == mine or env.get("RAY_RAYLET_PID") in self.raylets):
                    found.append(p)
            except psutil.Error:
                continue
        for p in list(found):
            try:
                found += [c for c in p.children(recursive=True) if c not in found]
            except psutil.Error:
                continue
        self.seen |= set(found)
        return found + [p for p in self.seen - set(found) if p.is_running()]

    def kill_node(self, resource: str) -> int:
        """``kill -9`` the raylet of the node that offers ``resource``; its pid."""
        for p in self.processes():
            try:
                if "raylet" in p.name() and resource in " ".join(p.cmdline()):
                    p.kill()
                    return p.pid
            except psutil.Error:
                continue
        raise AssertionError(f"no raylet offers {resource}: {[p.name() for p in self.processes()]}")

    def stop(self) -> None:
        procs = self.processes()
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=30)
        shutil.rmtree(self.temp, ignore_errors=True)
