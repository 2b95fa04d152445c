"""``shunter run`` as an operator sees it: a policy kept next to the config loads by its import
string, and when it fails on every event the run ends at once with the cause and exit status
1; a full disk under the event log ends the run with exit status 1 and says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _config(folder: Path, tiny_model: str, **run) -> Path:
    text = (ROOT / "examples" / "sort_separate.toml").read_text()
    cfg = folder / "job.toml"
    cfg.write_text(
        text.replace('path = ".shunter/models/sort-tiny"', f'path = "{tiny_model}"')
        .replace('output_dir = "runs"', f'output_dir = "{folder / "runs"}"')
        .replace("total_steps = 700", "total_steps = 8")
        .replace('policy = "separate"', f'policy = "{run.get("policy", "separate")}"')
        .replace("[run]\n", f"[run]\npolicy_timeout_s = {run.get('policy_timeout_s', 10.0)}\n", 1)
    )
    return cfg


def test_a_policy_blocked_in_c_ends_the_run_within_seconds_of_its_timeout(
    ray_cluster, tiny_model, tmp_path, capsys, monkeypatch, pooled
):
    """Issue 31: a decide() blocked inside C (a lock nobody releases) froze the run for good; now
    its thread is given up run.policy_timeout_s + 1 s after the call began and the run ends,
    naming the policy, the event and "did not return"."""
    from shunter.cli import main

    folder = tmp_path / "job"
    folder.mkdir()
    began = folder / "blocked_at"
    (folder / "hang_policy.py").write_text(
        "import threading, time\n"
        "from shunter.policies import SeparatePolicy\n\n\n"
        "class HangInC(SeparatePolicy):\n"
        "    def decide(self, event, view):\n"
        "        if view.trainer.step >= 2:\n"
        f"            open({str(began)!r}, 'w').write(repr(time.time()))\n"
        "            threading.Event().wait()\n"
        "        return super().decide(event, view)\n"
    )
    cfg = _config(folder, tiny_model, policy="hang_policy:HangInC", policy_timeout_s=2.0)
    monkeypatch.chdir(tmp_path)
    rc = main(["run", str(cfg), "--no-progress", "--run-id", "hang"])
    ended_at = time.time()
    err = capsys.readouterr().err
    assert rc == 1, err[-2000:]
    assert "policy hang_policy.HangInC.decide() did not return on" in err
    assert "within run.policy_timeout_s = 2s (blocked outside Python" in err
    took = ended_at - float(began.read_text())
    assert took < 2.0 + 1.0 + 15.0, took  # the timeout, the give-up, the finale and the shutdown
    print(f"policy blocked in C: the CLI returned {took:.1f}s after the call blocked")


def test_a_policy_next_to_the_config_that_always_raises_ends_the_run_fast(
    ray_cluster, tiny_model, tmp_path, capsys, monkeypatch, pooled
):
    from shunter.cli import main

    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "typo_policy.py").write_text(
        "from shunter.policies import Policy\n\n\n"
        "class Typo(Policy):\n"
        "    def decide(self, event, view):\n"
        "        return view.bufer.ready_batches\n"
    )
    cfg = _config(folder, tiny_model, policy="typo_policy:Typo")
    monkeypatch.chdir(tmp_path)  # not the config's folder: the import resolves from there anyway
    t0 = time.perf_counter()
    rc = main(["run", str(cfg), "--no-progress", "--run-id", "typo"])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 1
    assert "policy typo_policy.Typo failed 10 times in a row" in err
    assert "AttributeError: 'EngineView' object has no attribute 'bufer'" in err
    log = folder / "runs" / "typo" / "events.bin"
    assert log.stat().st_size < 1_000_000
    print(f"typo policy: ended {took:.1f}s after start (engine start included)")


def test_a_full_disk_under_the_event_log_ends_the_run_with_exit_status_1(
    ray_cluster, tiny_model, tmp_path, capsys, pooled
):
    from shunter.cli import main

    folder = tmp_path / "job"
    (folder / "runs" / "disk-full").mkdir(parents=True)
    (folder / "runs" / "disk-full" / "events.bin").symlink_to("/dev/full")
    cfg = _config(folder, tiny_model)
    rc = main(["run", str(cfg), "--no-progress", "--run-id", "disk-full"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "coordinator loop failed in sink:EventLog" in err and "No space left on device" in err
    assert err.count("sink EventLog also failed") <= 1, "a full disk fails every event alike: said once"
