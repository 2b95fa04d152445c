"""One example instance of every message type on the bus.

Invariant: ``CASES`` holds exactly one instance per message class (``tests/unit/events/test_events.py``
checks it); their encodings are the golden files under ``tests/golden``, and the policy
contract (``shunter.contract``) feeds every event among them to a policy.
"""

from __future__ import annotations

from typing import Any

from shunter import events as e

ENV: dict[str, Any] = {"run_id": "golden-run", "source": "golden", "seq": 7, "wall_time": 1795950000.25}
SAMPLE = e.Sample(
    sample_id="3.1",
    group_id=3,
    prompt_id=42,
    prompt_token_ids=[30, 31, 40],
    token_ids=[29, 30, 0],
    logprobs=[-0.5, -0.25, -1.0],
    versions=[1, 1, 2],
    finish_reason="stop",
    max_tokens=8,
    reward=0.9,
    response_text="34",
)
PROMPT = e.PromptSpec(prompt_id=42, text="43>", answer="34")
SAMPLING = e.SamplingSpec(max_tokens=8, temperature=1.0)

CASES: list[e.Message] = [
    e.RunStarted(policy="separate", replicas=3, **ENV),
    e.RunEnded(reason="completed", steps=10, summary={"wall_s": 12.5}, **ENV),
    e.ComponentReady(component="trainer", setup_s=1.5, **ENV),
    e.ComponentFailed(component="standalone-0", error="boom", **ENV),
    e.EventRejected(origin="user", error="truncated", nbytes=3, **ENV),
    e.PolicyFailed(policy="separate", on_kind="trainer.step_end", error="ValueError: x", **ENV),
    e.ComponentPlaced(
        component="standalone-0", bundle=1, node="10.0.0.1", gpu_ids=["1"], node_id="5e1f0c2a9b7d", **ENV
    ),
    e.CommandFailed(command_kind="rollout.generate", target="standalone-0", error="died", group_id=3, **ENV),
    e.SampleBegin(sample_id="3.1", group_id=3, replica_id="standalone-0", version=1, **ENV),
    e.SampleEnd(replica_id="standalone-0", sample=SAMPLE, **ENV),
    e.RewardFailed(
        replica_id="standalone-0",
        sample_id="7.0",
        group_id=7,
        failure="timeout",
        error="took longer than task.reward_timeout_s = 30 s",
        user_code="my_reward:compute_score",
        **ENV,
    ),
    e.RewardWorkerLost(
        replica_id="standalone-0",
        worker=1,
        loss="died",
        error="reward worker 1 died while scoring: The actor died unexpectedly before finishing this task.",
        user_code="my_reward:compute_score",
        **ENV,
    ),
    e.EnvFailed(
        replica_id="standalone-0",
        sample_id="7.1",
        group_id=7,
        failure="raised",
        turn=1,
        error="ValueError: bad expression",
        user_code="calculator",
        **ENV,
    ),
    e.SampleAborted(
        sample_id="3.1", group_id=3, replica_id="hybrid-1", reason="reclaimed", tokens=2, partial=SAMPLE, **ENV
    ),
    e.SampleResumed(
        sample_id="3.1", group_id=3, replica_id="standalone-0", prefix_len=2, remaining_tokens=6, version=2, **ENV
    ),
    e.GroupDropped(group_id=4, reason="stale", samples=8, **ENV),
    e.BatchReady(batch_id=2, samples=16, groups=2, min_version=1, max_staleness=1, **ENV),
    e.StepBegin(step=3, batch_id=2, samples=16, version=1, **ENV),
    e.StepEnd(step=3, batch_id=2, duration_s=0.2, metrics={"trainer/loss": 0.1}, **ENV),
    e.WeightsReady(
        version=2,
        handle="ray:2",
        transport="ray",
        nbytes=2_000_000,
        duration_s=0.01,
        detail={"copy_s": 0.001, "sync_s": 0.002},
        **ENV,
    ),
    e.WeightsLoaded(replica_id="standalone-0", version=2, duration_s=0.02, interrupted=5, **ENV),
    e.WeightsSent(replica_id="standalone-0", version=2, nbytes=2_000_000, buckets=1, duration_s=0.003, **ENV),
    e.WeightGroupOpened(replica_id="standalone-0", backend="nccl", host="10.0.0.1", port=29500, **ENV),
    e.WeightGroupJoined(replica_id="standalone-0", backend="nccl", duration_s=0.8, **ENV),
    e.ModeChanged(
        replica_id="hybrid-1", mode="rollout", previous="trainer", duration_s=0.3, detail={"wake_s": 0.1}, **ENV
    ),
    e.Offloaded(parts=["optimizer"], nbytes=1024, duration_s=0.01, **ENV),
    e.Onloaded(parts=["optimizer"], nbytes=1024, duration_s=0.01, **ENV),
    e.RankAssigned(replica_id="hybrid-1", replica_kind="hybrid", rank=1, actor_name="shunter.r.rollout.r1.g2", **ENV),
    e.RankReleased(replica_id="hybrid-1", rank=1, reason="replica.down", **ENV),
    e.ReplicaUp(replica_id="hybrid-1", replica_kind="hybrid", rank=1, mode="trainer", setup_s=3.0, **ENV),
    e.ReplicaDown(replica_id="hybrid-1", reason="actor died", **ENV),
    e.ReplicaRestart(
        replica_id="standalone-0",
        replica_kind="standalone",
        rank=0,
        attempt=1,
        delay_s=2.0,
        reason="its inference engine died during rollout.generate: EngineDead: the vLLM engine core is gone",
        **ENV,
    ),
    e.ReplicaPending(
        replica_kind="standalone",
        replacing="standalone-0",
        missing={"node_b": 1.0},
        free={"node_b": 0.0},
        deadline_s=300.0,
        **ENV,
    ),
    e.ReplicaWaited(replica_kind="standalone", replacing="standalone-0", outcome="placed", waited_s=34.5, **ENV),
    e.TrainerPending(
        reason="trainer failed: its node died",
        checkpoint_step=30,
        missing={"node_t": 1.0},
        free={"node_t": 0.0},
        deadline_s=300.0,
        **ENV,
    ),
    e.TrainerWaited(outcome="gave_up", waited_s=300.0, **ENV),
    e.ReplicaGivenUp(
        replica_id="standalone-4", replica_kind="standalone", rank=0, attempts=3, reason="actor died", **ENV
    ),
    e.ValidateBegin(version=2, prompts=64, replica_ids=["standalone-0"], **ENV),
    e.ValidateEnd(version=2, duration_s=0.5, metrics={"exact": 0.5}, **ENV),
    e.IntentRejected(
        intent_kind="trainer.train_batch",
        reason="already_trained",
        detail="batch 2 trained at step 3",
        intent_source="user",
        intent_seq=4,
        **ENV,
    ),
    e.PolicySlow(
        policy="MyPolicy", on_kind="rollout.sample_end", decide_ms=52.5, budget_ms=10.0, slow_calls=10, calls=40, **ENV
    ),
    e.LoopIdle(in_flight=0, **ENV),
    e.RelayReport(
        relay="node:5e1f0c2a",
        events=[
            e.SampleBegin(sample_id="3.1", group_id=3, replica_id="standalone-0", version=1, **ENV),
            e.SampleEnd(replica_id="standalone-0", sample=SAMPLE, **ENV),
            e.WeightsLoaded(replica_id="standalone-1", version=2, duration_s=0.02, **ENV),
        ],
        held_s=0.004,
        **ENV,
    ),
    # intents
    e.SwitchToRollout(replica_ids=["hybrid-1"], **ENV),
    e.SwitchToTrainer(replica_ids=["hybrid-1"], sleep_level=2, **ENV),
    e.Offload(parts=["optimizer", "params"], **ENV),
    e.Onload(parts=["optimizer"], **ENV),
    e.TrainStep(loss_fn="my.mod:loss", **ENV),
    e.TrainBatch(batch_id=2, samples=[SAMPLE], loss_fn="my.mod:loss", **ENV),
    e.PublishWeights(replica_ids=["standalone-0"], **ENV),
    e.LoadWeights(version=2, replica_ids=["standalone-0"], **ENV),
    e.Rebalance(replica_ids=["standalone-0"], count=12, **ENV),
    e.Validate(replica_ids=["standalone-0"], **ENV),
    e.Consolidate(replica_ids=["standalone-3"], max_in_flight=16, after_s=120.0, **ENV),
    e.Stop(reason="user", **ENV),
    # orders
    e.Generate(group_id=3, prompt=PROMPT, n=8, sampling=SAMPLING, resume=[SAMPLE], **ENV),
    e.EnterRollout(version=2, handle="ray:2", **ENV),
    e.EnterTrainer(sleep_level=2, **ENV),
    e.InstallWeights(version=2, handle="ray:2", **ENV),
    e.ShedGroups(count=12, **ENV),
    e.CutSamples(sample_ids=["3.1", "4.7"], **ENV),
    e.RunValidation(prompts=[PROMPT], **ENV),
    e.Train(batch_id=2, samples=[SAMPLE], loss_fn="my.mod:loss", **ENV),
    e.Publish(deliver=[e.Delivery(relay="node:5e1f0c2a", replica_ids=["standalone-0"])], **ENV),
    e.OffloadState(parts=["optimizer", "params"], **ENV),
    e.OnloadState(parts=["optimizer"], **ENV),
    e.JoinWeightGroup(replica_ids=["standalone-0"], backend="nccl", host="10.0.0.1", port=29500, **ENV),
    e.SendWeights(replica_ids=["standalone-0"], version=2, handle="nccl:2", **ENV),
    e.LeaveWeightGroup(replica_ids=["standalone-0"], **ENV),
    e.SaveCheckpoint(step=10, path="runs/r/checkpoints/.step-00000010.tmp", **ENV),
    e.TrainerStateSaved(
        step=10, version=5, path="runs/r/checkpoints/.step-00000010.tmp", nbytes=4096, duration_s=0.1, **ENV
    ),
    e.CheckpointSaved(step=10, version=5, path="runs/r/checkpoints/step-00000010", nbytes=8192, duration_s=0.2, **ENV),
    e.LogRepaired(
        path="runs/r/events.bin",
        kept_as="runs/r/events.bin.torn-4096",
        frames=120,
        whole=False,
        damage=["runs/r/events.bin: bytes 4096-4100 (4 bytes) unreadable: torn tail: 4 bytes, not even a frame header"],
        **ENV,
    ),
    e.RunResumed(
        checkpoint="runs/r/checkpoints/step-00000010",
        step=10,
        version=5,
        attempt=1,
        reason="trainer died",
        skipped={"step-00000012": "runs/r/checkpoints/step-00000012: trainer.pt is missing"},
        **ENV,
    ),
]
