"""Runs over a dataset in verl's layout: the real coordinator, rollout core and buffer over the
in-process fakes, in virtual time. Chat prompts go through the tokenizer's template, a verl
reward gets the row's fields, a dataset whose epochs run out ends the run, and a resumed run
continues the epoch where the checkpoint left it."""

from __future__ import annotations

import asyncio
from collections import Counter
from itertools import islice

import pyarrow as pa
import pyarrow.parquet as pq

from shunter.engine.data.datasets import Dataset, PromptStream, validation_specs
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.events import ComponentFailed, GroupDropped, RunResumed, SampleEnd, StepEnd
from tests.support.configs import cfg
from tests.support.fakes import local_run, run_to_end, run_until, virtual_time


def dataset(tmp_path, n: int, name: str = "train.parquet") -> Dataset:
    rows = [
        {
            "data_source": "digits",
            "prompt": [{"role": "user", "content": f"{(7919 * i) % 100_000:05d}"}],
            "reward_model": {"ground_truth": "".join(sorted(f"{(7919 * i) % 100_000:05d}"))},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / name)
    return Dataset.load([tmp_path / name])


@virtual_time
async def test_a_run_over_chat_prompts_with_a_verl_reward_trains_and_validates(tmp_path):
    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, extra_info["index"]))
        return {"score": float(solution_str == ground_truth), "len": len(solution_str)}

    data = dataset(tmp_path, 40)
    c = cfg()
    coord, _, trainer = local_run(
        c, reward=compute_score, prompts=(PromptStream(data, c.run.seed), validation_specs(data, 8))
    )
    ended, seen = await run_to_end(coord, 3600)
    assert ended.reason == "completed" and trainer.step == c.run.total_steps
    ends = [e for e in seen if isinstance(e, SampleEnd)]
    assert ends and all(e.sample.reward == 1.0 for e in ends)  # the fake answers the rendered prompt "<digits>>"
    assert {s for s, _ in calls} == {"digits"}
    assert ended.summary["validate/exact_last"] == 1.0
    assert ended.summary["data/rows"] == 40.0 and ended.summary["data/filtered_too_long"] == 0.0


@virtual_time
async def test_a_dataset_whose_epochs_run_out_ends_the_run_as_completed_not_a_stall(tmp_path):
    data = dataset(tmp_path, 7)  # 7 prompts, 2 groups a mini-batch: 3 steps, one prompt left over
    c = cfg(run={"total_steps": 50})
    coord, _, trainer = local_run(c, prompts=(PromptStream(data, c.run.seed, epochs=1), []))
    ended, seen = await run_to_end(coord, 3600)
    assert ended.reason == "completed", ended
    assert trainer.step == 3 and ended.summary["data/epoch"] == 1.0
    trained = Counter(s.prompt_id for b in trainer.seen for s in b)
    assert len(trained) == 6 and set(trained) <= set(range(7))  # each prompt at most once
    dropped = [e for e in seen if isinstance(e, GroupDropped)]
    assert len(dropped) == 1  # the leftover prompt, which no mini-batch can take


@virtual_time
async def test_a_resumed_run_continues_the_epoch_where_its_checkpoint_left_it(tmp_path):
    data = dataset(tmp_path, 10)  # 12 steps x 2 groups = 24 prompts: the run crosses two epoch ends
    c = cfg(
        run={"total_steps": 12, "checkpoint_every": 2},
        validation={"every": 0},
        rollout={"standalone_replicas": 2, "max_staleness": 1},
    )
    store = tmp_path / "ckpt"
    coord, _, trainer = local_run(c, token_s=0.002, checkpoints=store, prompts=(PromptStream(data, 5), []))
    seen, task = await run_until(coord, lambda m: isinstance(m, StepEnd) and m.step == 7)
    coord.post(coord.stamp(ComponentFailed(component="trainer", error="killed by the test")))
    async with asyncio.timeout(20):
        assert (await task).reason == "error"
    ckpt, manifest, _ = CheckpointStore(store).latest()
    coord2, _, trainer2 = local_run(
        c, token_s=0.002, checkpoints=store, resume=ckpt, prompts=(PromptStream(data, 5), [])
    )
    seen2 = []
    coord2.sinks.append(seen2.append)
    async with asyncio.timeout(30):
        assert (await coord2.run()).reason == "completed"
    assert next(e for e in seen2 if isinstance(e, RunResumed)).step == manifest.step
    batches = trainer2.restored_batches + [[s.prompt_id for s in b] for b in trainer2.seen]
    per_prompt = Counter(p for b in batches for p in b)
    assert set(per_prompt.values()) == {c.rollout.n_samples_per_prompt}, "a prompt trained twice or partly"
    assert sorted(per_prompt) == list(range(24))  # stream positions 0..23, each once, across the resume
    # each position is the row the uninterrupted stream puts there (epoch 2's order included)
    expected = {p.prompt_id: p.answer for p in islice(PromptStream(data, 5), 24)}
    got = {e.sample.prompt_id: e.sample.response_text for e in seen + seen2 if isinstance(e, SampleEnd)}
    assert got and all(expected[pid] == text for pid, text in got.items())


@virtual_time
async def test_a_reward_failing_on_held_out_prompts_is_said_in_validate_end_not_as_a_failed_command(tmp_path):
    """Was: the validation succeeded, yet it reported its reward failures as a ``CommandFailed``
    of ``rollout.run_validation`` (printed ``command.failed``, as if validation had failed)."""
    from shunter.events import CommandFailed, ValidateEnd

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if extra_info["index"] % 2:
            raise KeyError("units")
        return float(solution_str == ground_truth)

    data = dataset(tmp_path, 40)
    c = cfg()
    coord, _, _ = local_run(
        c, reward=compute_score, prompts=(PromptStream(data, c.run.seed), validation_specs(data, 8))
    )
    ended, seen = await run_to_end(coord, 3600)
    assert ended.reason == "completed"
    assert not [e for e in seen if isinstance(e, CommandFailed)]
    vals = [e for e in seen if isinstance(e, ValidateEnd)]
    assert vals and all(v.metrics["reward_errors"] == 4 and v.metrics["exact"] == 0.5 for v in vals)
    first = "reward function compute_score failed on 4 held-out prompts (scored 0), first: "
    assert all(len(v.errors) == 1 and v.errors[0].startswith(first) for v in vals)
    assert "KeyError" in vals[0].errors[0] and "units" in vals[0].errors[0]
