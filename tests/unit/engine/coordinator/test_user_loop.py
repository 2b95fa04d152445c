"""A user's own training loop (``run.trainer_driver = "user"``) at the coordinator: batches
are trained once, a failing user loss is the user's error and not the run's end, publishing
with nothing new is a no-op, and "no batch" comes with the reason (virtual time)."""

from __future__ import annotations

import asyncio

import msgspec

from shunter.engine.config import from_dict
from shunter.events import (
    CommandFailed,
    IntentRejected,
    Message,
    PublishWeights,
    RunEnded,
    StepEnd,
    TrainBatch,
    WeightsReady,
)
from tests.support.fakes import local_run, virtual_time


def cfg(**over):
    base = {
        "run": {"total_steps": 100, "policy": "separate", "trainer_driver": "user"},
        "rollout": {
            "standalone_replicas": 1,
            "n_samples_per_prompt": 4,
            "max_tokens": 12,
            "max_staleness": 1,
            "max_in_flight_per_replica": 16,
        },
        "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 2, "train_batch_size": 16},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    return from_dict(base)


def good_loss(inp):
    return -(inp.advantages * inp.logp * inp.mask).sum(), {"tokens": float(inp.mask.sum())}


def reinforce_with_baseline(inp):
    """The loss the old signature could not express: it needs rewards and group ids."""
    import torch

    means = {int(g): inp.rewards[inp.group_ids == g].mean() for g in inp.group_ids.unique()}
    baseline = torch.stack([means[int(g)] for g in inp.group_ids])
    adv = (inp.rewards - baseline)[:, None]
    return -(adv * inp.logp * inp.mask).sum() / inp.mask.sum(), {"baseline": float(baseline.mean())}


def missing_name(inp):
    return undefined_thing(inp)  # noqa: F821 - the user's typo


def wrong_return(inp):
    return inp.logp.sum()  # forgot the stats


def old_signature(logp, old_logp, advantages, mask, ref_logp, cfg):
    return logp.sum(), {}


class Answers:
    """A sink resolving futures with the first message matching a predicate."""

    def __init__(self) -> None:
        self.waiting: list[tuple] = []

    def __call__(self, m: Message) -> None:
        for pred, fut in list(self.waiting):
            if not fut.done() and pred(m):
                fut.set_result(m)
                self.waiting.remove((pred, fut))

    def expect(self, pred) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((pred, fut))
        return fut


async def started(**over):
    coord, _, trainer = local_run(cfg(**over))
    answers = Answers()
    coord.sinks.append(answers)
    task = asyncio.create_task(coord.run())
    return coord, trainer, answers, task


async def next_batch(coord, answers):
    while (batch := coord.take_batch()) is None:
        await answers.expect(lambda m: type(m).__name__ in ("BatchReady", "RunEnded"))
    return batch


async def train(coord, answers, batch, loss_fn=""):
    intent = coord.stamp(TrainBatch(batch_id=batch.batch_id, samples=batch.samples, loss_fn=loss_fn))
    fut = answers.expect(
        lambda m: (
            (isinstance(m, StepEnd) and m.batch_id == batch.batch_id)
            or (isinstance(m, IntentRejected) and m.intent_seq == intent.seq)
            or (isinstance(m, CommandFailed) and m.batch_id == batch.batch_id)
            or isinstance(m, RunEnded)
        )
    )
    coord.post(intent)
    return await fut


async def stop(coord, task):
    from shunter.events import Stop

    coord.post(Stop(reason="test done"))
    ended = await task
    await coord.executor.close()
    return ended


@virtual_time
async def test_a_batch_is_trained_once_and_a_failing_loss_leaves_the_run_alive():
    coord, trainer, answers, task = await started()
    batch = await next_batch(coord, answers)
    for spec, says in [
        (
            f"{__name__}:missing_name",
            "raised NameError: name 'undefined_thing' is not defined",
        ),
        (f"{__name__}:wrong_return", "returned Tensor"),
        (f"{__name__}:old_signature", "takes 6 required arguments"),
        (f"{__name__}:no_such_loss", "has no attribute 'no_such_loss'"),
    ]:
        out = await train(coord, answers, batch, spec)
        assert isinstance(out, CommandFailed) and out.user_code == spec, out
        assert out.error.startswith(spec) and says in out.error, out.error
        assert coord.ended is None and trainer.step == 0
    out = await train(coord, answers, batch, f"{__name__}:reinforce_with_baseline")
    assert isinstance(out, StepEnd) and trainer.step == 1  # the same batch, once the loss is fixed
    again = await train(coord, answers, batch, f"{__name__}:good_loss")
    assert isinstance(again, IntentRejected) and again.reason == "already_trained"
    assert "trained at step 1" in again.detail
    forged = msgspec.structs.replace(batch, batch_id=batch.batch_id + 50)
    unknown = await train(coord, answers, forged)
    assert isinstance(unknown, IntentRejected) and unknown.reason == "unknown_batch"
    ended = await stop(coord, task)
    assert ended.reason == "stopped" and ended.steps == 1


@virtual_time
async def test_publishing_with_nothing_new_is_a_no_op_that_says_so():
    coord, trainer, answers, task = await started()
    intent = coord.stamp(PublishWeights())
    fut = answers.expect(lambda m: isinstance(m, IntentRejected | WeightsReady))
    coord.post(intent)
    out = await fut
    assert isinstance(out, IntentRejected) and out.reason == "nothing_new" and trainer.version == 0
    await train(coord, answers, await next_batch(coord, answers))
    for expected in (WeightsReady, IntentRejected):  # one publish, then nothing new again
        fut = answers.expect(lambda m: isinstance(m, IntentRejected | WeightsReady))
        coord.post(coord.stamp(PublishWeights()))
        assert isinstance(await fut, expected)
    assert trainer.version == 1 and coord.buffer.counters()["dropped"] == 0
    await stop(coord, task)


@virtual_time
async def test_no_batch_says_the_gate_waits_for_a_publish():
    coord, trainer, answers, task = await started()
    for _ in range(4):  # (max_staleness 1 + version 0 + 1) * 2 mini-batches per version, never published
        await train(coord, answers, await next_batch(coord, answers))
    while coord.buffer.in_flight or coord.buffer.ready_batches():
        await answers.expect(lambda m: True)
    assert coord.take_batch() is None
    why = coord.why_no_batch()
    assert "staleness gate is closed" in why and "publish_weights()" in why and "4 steps since version 0" in why
    ended = await stop(coord, task)
    assert "the run ended (stopped)" in coord.why_no_batch() and ended.reason == "stopped"


@virtual_time
async def test_a_gate_closed_by_admit_staleness_says_so():
    coord, trainer, answers, task = await started(rollout={"max_staleness": 2, "admit_staleness": 0})
    for _ in range(2):  # (admit_staleness 0 + version 0 + 1) * 2 mini-batches per version
        await train(coord, answers, await next_batch(coord, answers))
    while coord.buffer.in_flight or coord.buffer.ready_batches():
        await answers.expect(lambda m: True)
    assert coord.take_batch() is None and coord.buffer.dispatched == 4  # groups of 4 samples, 2 a batch
    why = coord.why_no_batch()
    assert "staleness gate is closed" in why and "rollout.admit_staleness = 0" in why, why
    await stop(coord, task)


@virtual_time
async def test_an_engine_driven_run_whose_loss_fails_ends_cleanly_naming_it():
    coord, _, trainer = local_run(
        cfg(
            run={"trainer_driver": "engine", "total_steps": 4},
            trainer={"loss_fn": f"{__name__}:missing_name"},
        )
    )
    ended = await coord.run()
    await coord.executor.close()
    assert ended.reason == "error" and not ended.failed_component  # not restarted: it would fail again
    assert ended.error.startswith(f"trainer.loss_fn failed: {__name__}:missing_name raised NameError")
    assert ended.summary["buffer/trained_groups"] == 0, "the batch the failed step took counts as dropped"
    assert ended.summary["buffer/dropped_run_end_groups"] >= 2
