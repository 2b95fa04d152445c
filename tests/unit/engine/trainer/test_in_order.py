"""``InOrder`` and the trainer host's turns: orders numbered by their sender run in that order
whatever order they arrive in (Ray does not keep the order of calls to an asyncio actor). The
case that made it needed: a ``SaveCheckpoint`` sent right after a publish, overtaken by the
``Train`` sent after it, saved the next step's state under this step's checkpoint."""

from __future__ import annotations

import asyncio

import pytest

from shunter.engine.trainer.host import TrainerHost
from shunter.engine.trainer.in_order import InOrder
from shunter.events import SaveCheckpoint, Stamper, Train, TrainerStateSaved
from tests.support.fakes import FakeTrainerCore, one_token_sample, virtual_time

SAMPLE = one_token_sample()


async def _run_in(order, arrivals):
    """Start ``arrivals`` (turn numbers) in that order; return the order they ran in."""
    ran = []

    async def one(n):
        ordered = await order.take(n)
        ran.append(n)
        await asyncio.sleep(0)  # a turn that yields keeps the next one waiting
        if ordered:
            order.release(n)

    await asyncio.gather(*(one(n) for n in arrivals))
    return ran


@pytest.mark.parametrize("arrivals", [[1, 2, 3, 4], [4, 3, 2, 1], [2, 4, 1, 3], [3, 1, 4, 2]])
@virtual_time
async def test_turns_run_in_their_numbers_order_whatever_order_they_arrive_in(arrivals):
    assert await _run_in(InOrder(), arrivals) == [1, 2, 3, 4]


@virtual_time
async def test_a_turn_whose_caller_went_away_is_passed_over():
    order = InOrder()
    ran = []

    async def one(n):
        await order.take(n)
        ran.append(n)
        order.release(n)

    three = asyncio.ensure_future(one(3))
    two = asyncio.ensure_future(one(2))
    await asyncio.sleep(0)
    two.cancel()  # its caller gave up while it waited
    await asyncio.gather(one(1), three, two, return_exceptions=True)
    assert ran == [1, 3] and order.next == 4


@virtual_time
async def test_unordered_and_skipped_turns_never_wait():
    order = InOrder()
    assert await order.take(0) is False  # not numbered: runs as it comes
    order.skip(2)  # runs beside the others (a weight-group order)
    assert await _run_in(order, [3, 1]) == [1, 3]
    assert await order.take(1) is False  # a number already passed (a restarted sender): not held up


@virtual_time
async def test_a_checkpoint_overtaken_by_the_next_train_still_saves_the_state_it_was_sent_for(tmp_path):
    core = FakeTrainerCore(step_s=1.0)
    host = TrainerHost(core, Stamper("t", "trainer"), threaded=False)
    train = asyncio.ensure_future(host.handle(Train(batch_id=0, samples=[SAMPLE]), turn=2))
    await asyncio.sleep(0)  # the Train arrived first and would take the lock
    save = asyncio.ensure_future(host.handle(SaveCheckpoint(step=0, path=str(tmp_path)), turn=1))
    (saved, _), _ = await asyncio.gather(save, train)
    assert [type(e) for e in saved] == [TrainerStateSaved] and saved[0].step == 0, saved
    assert core.step == 1
