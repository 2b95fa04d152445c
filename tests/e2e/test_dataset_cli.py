"""A dataset in verl's parquet layout, written by a short script, trains with ``shunter run`` and
a config that names it, with the user's reward function by import string: real vLLM replicas
render the chat prompts with the model's template; a prompt too long for the context is left
out at load and counted; validation scores the held-out file."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shunter.events import ComponentReady, RunEnded, SampleEnd, StepEnd, ValidateEnd, read_log

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_a_verl_parquet_trains_with_shunter_run_and_a_users_reward(
    ray_cluster, tiny_model, tmp_path, capsys, monkeypatch, pooled
):
    from shunter.cli import main

    job = tmp_path / "job"
    shutil.copytree(ROOT / "examples", job)
    monkeypatch.syspath_prepend(str(job))
    __import__("make_sort_parquet").main(str(job / "data"), train=500, val=16)
    sys.modules.pop("make_sort_parquet", None)
    train = job / "data" / "sort_train.parquet"
    rows = pq.read_table(train).to_pylist()
    rows.append({**rows[0], "prompt": [{"role": "user", "content": "9" * 40}]})  # 41 tokens: no room in 32
    pq.write_table(pa.Table.from_pylist(rows), train)
    text, found = re.subn(r"(?m)^total_steps = \d+", "total_steps = 6", (job / "sort_data.toml").read_text())
    assert found == 1, "sort_data.toml's run.total_steps moved: this test runs 6 steps of it"
    (job / "sort_data.toml").write_text(
        text.replace('path = ".shunter/models/sort-tiny"', f'path = "{tiny_model}"')
        .replace('build_tiny = "sort_digits"', 'build_tiny = ""')
        .replace('output_dir = "runs"', f'output_dir = "{tmp_path / "runs"}"')
        .replace("every = 50 ", "every = 4 ")
        .replace("prompts = 128", "prompts = 16")
        .replace("[task]\n", "[task]\nreward_workers = 1\nreward_worker_cpus = 0.1\n")
    )
    monkeypatch.chdir(tmp_path)  # not the config's folder: its paths resolve from there anyway
    rc = main(["run", str(job / "sort_data.toml"), "--no-progress", "--run-id", "data"])
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    out = tmp_path / "runs" / "data"
    events = list(read_log(out / "events.bin"))
    summary = next(e for e in events if isinstance(e, RunEnded)).summary
    assert summary["data/rows"] == 500 and summary["data/filtered_too_long"] == 1, summary
    assert [e.step for e in events if isinstance(e, StepEnd)] == list(range(1, 7))
    ends = [e.sample for e in events if isinstance(e, SampleEnd)]
    # the prompt the replica saw is the chat template's rendering: the digits, then ">"
    assert ends and all(s.prompt_token_ids and 0.0 <= s.reward <= 1.0 for s in ends)
    assert any(s.reward == 1.0 for s in ends) and any(
        0.0 < s.reward < 1.0 for s in ends
    )  # compute_score's partial credit
    vals = [e for e in events if isinstance(e, ValidateEnd)]
    assert vals and all(v.metrics["reward_mean"] > 0 for v in vals)
    # scored in a reward worker process of the run's (task.reward_workers), started before the replicas
    assert any(isinstance(e, ComponentReady) and e.component == "reward-0" for e in events)

    # a damaged row in a user's file: the run does not start, and says where and why
    rows[3] = {**rows[3], "reward_model": {"style": "rule"}}
    pq.write_table(pa.Table.from_pylist(rows), train)
    rc = main(["run", str(job / "sort_data.toml"), "--no-progress", "--run-id", "bad"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"{train}:row 4: field 'reward_model.ground_truth' is missing (null)" in err, err[-2000:]
