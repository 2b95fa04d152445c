"""A reward worker lost under a replica's calls (``RewardWorkerLost``) is seen by an operator
even when every call it held scored on retry: the replica reports each loss once, with the
next sample it finishes; the coordinator counts it in the run summary (``reward/worker_died``,
``reward/worker_hung``, kept across a resume); the run log has a warning at the 1st, 10th,
100th of each kind. (The real pool's side — one loss a death, however many batches it held — is
in ``tests/actors/test_reward_pool.py``.)"""

from __future__ import annotations

import json

from shunter.engine.data.rewards import Scored
from shunter.engine.io.records import LogSink, make_logger
from shunter.events import RewardFailed, RewardWorkerLost, SampleEnd
from tests.support.configs import cfg
from tests.support.cores import core, ends, gen
from tests.support.fakes import local_run, run_to_end, virtual_time

ENV = {"run_id": "r", "source": "t", "wall_time": 1.0}


class LosesWorkers:
    """Scores every call 1.0 (each retried call scored), but says a worker died at the 3rd call
    and hung at the 7th, as ``actors.reward_workers.PoolRewards`` says what its calls saw."""

    def __init__(self) -> None:
        self.calls = 0
        self._lost: list = []

    async def score(self, prompt, response):
        self.calls += 1
        if self.calls == 3:
            self._lost.append((1, "died", "reward worker 1 died while scoring: killed"))
        if self.calls == 7:
            self._lost.append((0, "hung", "reward worker 0 stopped answering"))
        return Scored(1.0)

    def losses(self):
        out, self._lost = self._lost, []
        return out

    def close(self) -> None:
        pass


@virtual_time
async def test_a_loss_is_one_event_before_the_sample_that_saw_it():
    events = await core(environment=None, rewards=LosesWorkers(), reward_name="m:f").generate(gen(n=4))
    lost = [(i, e) for i, e in enumerate(events) if isinstance(e, RewardWorkerLost)]
    assert [(e.worker, e.loss, e.user_code) for _, e in lost] == [(1, "died", "m:f")]
    third_end = [i for i, e in enumerate(events) if isinstance(e, SampleEnd)][2]
    assert lost[0][0] < third_end  # with the sample whose scoring saw it
    assert all(s.reward == 1.0 for s in ends(events))  # scored on retry: no RewardFailed
    assert not [e for e in events if isinstance(e, RewardFailed)]


@virtual_time
async def test_the_summary_counts_losses_whose_calls_all_scored():
    pools: dict[str, LosesWorkers] = {}
    coord, _, _ = local_run(cfg(), rewards=lambda rid: pools.setdefault(rid, LosesWorkers()))
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed", ended
    n = len(pools)  # each replica's pool saw one death and one hang
    assert ended.summary["reward/worker_died"] == n and ended.summary["reward/worker_hung"] == n
    assert "reward/raised" not in ended.summary


def test_the_run_log_warns_at_milestones(tmp_path):
    sink = LogSink(make_logger(tmp_path / "run.log"))
    for i in range(12):
        sink(
            RewardWorkerLost(
                replica_id="r0", worker=0, loss="died", error=f"reward worker 0 died ({i})", user_code="m:f", **ENV
            )
        )
    got = [json.loads(x) for x in (tmp_path / "run.log").read_text().splitlines()]
    got = [x for x in got if x["event"] == "rollout.reward_worker_lost"]
    assert [(x["level"], x["count"]) for x in got] == [("warning", 1), ("warning", 10)]


@virtual_time
async def test_the_counts_are_kept_across_a_resume(tmp_path):
    from shunter.engine.io.checkpoint import CheckpointStore

    c = cfg(run={"total_steps": 6, "policy": "separate", "checkpoint_every": 2})
    pools: dict[str, LosesWorkers] = {}
    coord, _, _ = local_run(c, checkpoints=tmp_path, rewards=lambda rid: pools.setdefault(rid, LosesWorkers()))
    ended, _ = await run_to_end(coord)
    assert ended.summary["reward/worker_died"] == len(pools)
    ckpt, _, _ = CheckpointStore(tmp_path).latest()  # the end state: resuming runs only the finale
    again, _, _ = local_run(c, checkpoints=tmp_path, resume=ckpt)  # no worker lost this attempt
    resumed, _ = await run_to_end(again)
    assert resumed.reason == "completed", resumed
    assert resumed.summary["reward/worker_died"] == resumed.summary["reward/worker_hung"] == len(pools)


class KillsEveryWorker(LosesWorkers):
    """Every call kills its worker: each is lost, tried alone, lost again, scored 0 as ``raised``."""

    async def score(self, prompt, response):
        self._lost += [(0, "died", "reward worker 0 died while scoring")] * 2
        return Scored(0.0, "raised", "reward worker 0 died while scoring (tried alone)")


@virtual_time
async def test_a_reward_that_kills_every_worker_ends_the_run_naming_it_soon():
    """Was (outsider, 2026-12-03): 67 worker deaths in 190 s, 10 samples resolved, no step — the
    end after a mini-batch of failed samples (128 here) was about 40 minutes away."""
    c = cfg(trainer={"ppo_mini_batch_size": 128, "parameter_sync_step": 1, "train_batch_size": 128})
    coord, _, _ = local_run(c, reward=lambda *a: 1.0, rewards=lambda rid: KillsEveryWorker())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "error" and ended.failed_component, ended
    assert "its reward worker was lost 8 times (died 8) before any sample was scored" in ended.error
    assert len([e for e in seen if isinstance(e, RewardFailed)]) < 128
