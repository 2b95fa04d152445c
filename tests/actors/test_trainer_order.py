"""The trainer's orders run in the order the executor sent them, through real Ray: Ray does not
keep the order of calls to an asyncio actor (measured: a few in a hundred back-to-back calls
from one caller started out of order), and a ``SaveCheckpoint`` sent right after a publish was
once overtaken by the ``Train`` sent after it — the checkpoint held the next step's trainer
state under this step's coordinator snapshot, and the resumed run skipped a step. The core is a
stand-in (what it computes is not what is tested here)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from shunter.actors.ray_executor import RayExecutor
from shunter.actors.trainer_worker import TrainerWorker
from shunter.events import Sample, SaveCheckpoint, StepEnd, Train, TrainerStateSaved, flatten

pytestmark = pytest.mark.actors


def _ship_by_value():
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_ship_by_value()


class Core:
    """Counts steps; a checkpoint reports the step it saw (nothing is written)."""

    def __init__(self) -> None:
        self.step, self.version = 0, 0

    async def train_step(self, samples, loss_fn):
        self.step += 1
        return {}

    async def publish(self) -> bytes:
        self.version += 1
        return b"w"

    def save(self, path: str) -> int:
        return 1


class Trainer(TrainerWorker):
    async def setup(self) -> float:  # the real actor, around a stand-in core
        from shunter.engine.trainer.host import TrainerHost
        from shunter.events import Stamper

        self.host = TrainerHost(Core(), Stamper(self.run_id, "trainer"), threaded=False)
        return 0.0


def batch(n: int) -> list[Sample]:
    """A mini-batch big enough (~150 kB encoded) to travel through Ray's object store."""
    ids = list(range(2048))
    return [
        Sample(
            sample_id=f"{n}.{k}",
            group_id=n,
            prompt_id=n,
            prompt_token_ids=ids,
            token_ids=ids,
            logprobs=[-1.0] * len(ids),
            versions=[0] * len(ids),
            max_tokens=len(ids),
        )
        for k in range(4)
    ]


async def test_a_checkpoint_sent_before_the_next_train_saves_the_step_it_was_sent_for(ray_cluster):
    import msgspec

    from shunter.engine.config import TrainerConfig

    trainer = ray_cluster.remote(num_cpus=0)(Trainer).remote("t-order", msgspec.msgpack.encode(TrainerConfig()), "")
    await trainer.setup.remote()
    ex = RayExecutor("t-order", trainer, {}, timeout_s=60)
    got: list = []
    ex.bind(got.extend)
    rounds = 40
    try:
        for step in range(rounds):  # as the coordinator does after each publish: save, then train on
            ex.send("trainer", SaveCheckpoint(step=step, path=f"/nowhere/{step}"))
            ex.send("trainer", Train(batch_id=step, samples=batch(step)))
        async with asyncio.timeout(120):
            while ex.pending():
                await asyncio.sleep(0.05)  # polling what the executor posted (from Ray's threads)
    finally:
        await ex.close()
    msgs = list(flatten(got))
    saved = {m.path: m.step for m in msgs if isinstance(m, TrainerStateSaved)}  # (answers may cross)
    assert saved == {f"/nowhere/{s}": s for s in range(rounds)}, "a checkpoint saw a later step"
    assert sorted(m.step for m in msgs if isinstance(m, StepEnd)) == list(range(1, rounds + 1))
