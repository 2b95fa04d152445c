"""Multi-turn rollouts on real vLLM replicas and the torch trainer, through ``shunter run``: a
user's environment by import string (next to the config), vLLM stopping at its stop string,
observations appended masked out of the loss, weight loads landing mid-trajectory and the
trajectories resuming with their turns; then a broken environment, which ends the run naming it."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from shunter.events import EnvFailed, RunEnded, SampleEnd, SampleResumed, StepEnd, read_log

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

ENV = '''
import asyncio

from shunter import StepResult


class Echo:
    """Answers every "5" the model writes with "ab", a little later."""

    stop = ["5"]

    async def reset(self, prompt, transcript):
        self.calls = transcript.count("5")

    async def step(self, action):
        await asyncio.sleep(0.01)
        self.calls += 1
        return StepResult(observation="ab", metrics={"calls": float(self.calls)})


class Slow(Echo):
    """A tool that takes 4 s a call: three calls outlast rollout.generate_timeout_s = 10."""

    async def step(self, action):
        await asyncio.sleep(4.0)
        return await super().step(action)


class Broken(Echo):
    async def step(self, action):
        raise RuntimeError("the tool server is down")
'''


def job_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train: int) -> Path:
    """The examples copied with the user's environment module beside them and ``train`` sort rows
    written; the working directory is ``tmp_path``."""
    job = tmp_path / "job"
    shutil.copytree(ROOT / "examples", job)
    (job / "echo_env.py").write_text(ENV)
    monkeypatch.syspath_prepend(str(job))
    __import__("make_sort_parquet").main(str(job / "data"), train=train, val=16)
    sys.modules.pop("make_sort_parquet", None)
    monkeypatch.chdir(tmp_path)
    return job


def job_config(job: Path, tiny_model: str, tmp_path: Path, environment: str) -> Path:
    text, found = re.subn(r"(?m)^total_steps = \d+", "total_steps = 8", (job / "sort_data.toml").read_text())
    assert found == 1, "sort_data.toml's run.total_steps moved: this test runs 8 steps of it"
    cfg = job / f"{environment.split(':')[1].lower()}.toml"
    cfg.write_text(
        text.replace('path = ".shunter/models/sort-tiny"', f'path = "{tiny_model}"')
        .replace('build_tiny = "sort_digits"', 'build_tiny = ""')
        .replace('output_dir = "runs"', f'output_dir = "{tmp_path / "runs"}"')
        .replace(
            'reward = "my_reward:compute_score"',
            f'reward = "my_reward:compute_score"\nenvironment = "{environment}"\nmax_turns = 3',
        )
        .replace("max_tokens = 12", "max_tokens = 24\nignore_eos = true")
        .replace("max_model_len = 32", "max_model_len = 48")
        .replace("max_staleness = 1", "max_staleness = 2")
        .replace("parameter_sync_step = 2", "parameter_sync_step = 1")
        .replace("ppo_mini_batch_size = 128", "ppo_mini_batch_size = 64")
        .replace("train_batch_size = 256", "train_batch_size = 64")
        .replace("every = 50 ", "every = 0 ")
    )
    return cfg


def test_multi_turn_trajectories_train_and_resume_across_weight_loads(
    ray_cluster, tiny_model, tmp_path, capsys, monkeypatch, pooled
):
    from shunter.cli import main

    job = job_folder(tmp_path, monkeypatch, train=2000)
    rc = main(["run", str(job_config(job, tiny_model, tmp_path, "echo_env:Echo")), "--no-progress", "--run-id", "mt"])
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    events = list(read_log(tmp_path / "runs" / "mt" / "events.bin"))
    ends = [e.sample for e in events if isinstance(e, SampleEnd)]
    multi = [s for s in ends if s.turns]
    assert multi, "no trajectory called the environment"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)  # (with ignore_eos an eos may sit mid-response: count tokens)
    for s in multi:
        s.check()
        assert len(s.turns) <= 3 and len(s.token_ids) <= 24
        assert s.loss_mask.count(0) == sum(t.observed for t in s.turns)
        at = 0
        for t in s.turns:  # each turn: generated tokens ending in the stop string, then the observation
            assert tok.decode(s.token_ids[at : at + t.generated]).endswith("5")
            seen = tok.decode(s.token_ids[at + t.generated : at + t.generated + t.observed])
            end = at + t.generated + t.observed
            assert seen == "ab" or ("ab".startswith(seen) and end == len(s.token_ids) == 24)  # cut by the budget
            assert s.loss_mask[at + t.generated : at + t.generated + t.observed] == [0] * t.observed
            at += t.generated + t.observed
    steps = [e for e in events if isinstance(e, StepEnd)]
    assert len(steps) == 8 and any(e.metrics.get("batch/turns_mean", 0) > 0 for e in steps)
    assert any(e.metrics.get("env/calls", 0) > 0 for e in steps)
    # weight loads landed mid-trajectory: trajectories resumed after a tool call, on new weights
    later_turns = [e for e in events if isinstance(e, SampleResumed) and e.turn > 0]
    assert later_turns, "no weight load landed after a tool call"
    resumed = {e.sample_id for e in later_turns}
    assert any(len(set(s.versions)) > 1 for s in multi if s.sample_id in resumed)
    summary = next(e for e in events if isinstance(e, RunEnded)).summary
    assert summary["env/steps"] >= len(multi)

    # the user's environment breaks: every call raises; the run ends naming it, exit status 1
    rc = main(["run", str(job_config(job, tiny_model, tmp_path, "echo_env:Broken")), "--no-progress", "--run-id", "b"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "environment echo_env:Broken.step raised RuntimeError: the tool server is down" in err, err[-2000:]
    failed = [e for e in read_log(tmp_path / "runs" / "b" / "events.bin") if isinstance(e, EnvFailed)]
    assert failed and failed[0].user_code == "echo_env:Broken"


def test_the_embedding_api_takes_rows_and_an_environment_class_as_objects(
    ray_cluster, tiny_model, tmp_path, replica_pool
):
    """``Engine(cfg, train_data=rows, environment=Echo)``: no file, no import string in the config;
    the class travels to the replicas pickled."""
    import asyncio

    from shunter import Engine
    from shunter.engine.config import from_dict
    from shunter.events import StepEnd

    namespace: dict = {}
    exec(compile(ENV, "echo_env_inline", "exec"), namespace)  # a class the replicas cannot import by name
    echo = namespace["Echo"]
    echo.__module__ = "__main__"  # as in a user's script: cloudpickle sends it by value
    rows = [
        {
            "prompt": [{"role": "user", "content": digits}],
            "data_source": "sort",
            "reward_model": {"ground_truth": "".join(sorted(digits))},
        }
        for digits in ("31942", "5551", "804215", "97531", "24680", "15951")
    ]
    cfg = from_dict(
        {
            "run": {"total_steps": 3, "output_dir": str(tmp_path / "runs"), "progress": False},
            "model": {"path": str(tiny_model)},
            "task": {"max_turns": 2},
            "rollout": {
                "standalone_replicas": 1,
                "n_samples_per_prompt": 4,
                "max_tokens": 16,
                "max_model_len": 32,
                "ignore_eos": True,
            },
            "trainer": {"ppo_mini_batch_size": 8, "train_batch_size": 8, "parameter_sync_step": 1},
            "validation": {"every": 0},
        }
    )

    async def main():
        async with Engine(cfg, train_data=rows, val_data=rows[:2], environment=echo, pool=replica_pool) as engine:
            _ = [ev async for ev in engine.events()]
            return engine.out_dir, engine.ended

    out, ended = asyncio.run(main())
    events = list(read_log(out / "events.bin"))
    assert ended.reason == "completed", ended
    assert len([e for e in events if isinstance(e, StepEnd)]) == 3
    ends = [e.sample for e in events if isinstance(e, SampleEnd)]
    assert any(s.turns for s in ends) and ended.summary["data/rows"] == 6


def test_trajectories_longer_than_generate_timeout_s_live_while_they_make_progress(
    ray_cluster, tiny_model, tmp_path, capsys, monkeypatch, pooled
):
    """Was: ``rollout.generate_timeout_s`` bounded a group's whole generation, so trajectories
    of slow tool calls (here 3 x 4 s against 10 s) got their replica killed as hung. It bounds
    silence now: the replica reports progress (a turn, a tool answer) and lives."""
    from shunter.cli import main
    from shunter.events import ReplicaDown, SampleBegin

    job = job_folder(tmp_path, monkeypatch, train=400)
    cfg = job_config(job, tiny_model, tmp_path, "echo_env:Slow")
    text = cfg.read_text().replace("total_steps = 8", "total_steps = 2")
    text = text.replace("max_turns = 3", "max_turns = 3\nenv_timeout_s = 8")
    cfg.write_text(text.replace("max_staleness = 2", "max_staleness = 2\ngenerate_timeout_s = 10"))
    rc = main(["run", str(cfg), "--no-progress", "--run-id", "slow"])
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    events = list(read_log(tmp_path / "runs" / "slow" / "events.bin"))
    assert not [e for e in events if isinstance(e, ReplicaDown)], err[-3000:]
    began = {e.sample_id: e.wall_time for e in events if isinstance(e, SampleBegin)}
    spans = [
        e.wall_time - began[e.sample.sample_id] for e in events if isinstance(e, SampleEnd) and len(e.sample.turns) == 3
    ]
    assert spans and max(spans) > 10.0  # trajectories outlived the timeout, and nothing was killed
