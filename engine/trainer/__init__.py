"""The trainer: an HF causal LM learning by PPO / GRPO in torch, and the host that drives it.

The torch core (imports torch):

- ``trainer``: ``Trainer`` — the model, its frozen reference and AdamW: built, checkpointed,
  offloaded and onloaded; its parts below share its ``counters``;
- ``shards``: a trainer's state on disk — model, optimizer and RNG by torch Distributed
  Checkpoint, loaded at any world size (the old ``model/`` + ``trainer.pt`` too), and the HF
  model folder gathered from a sharded model one bounded file at a time;
- ``counters``: ``TrainerCounters`` — steps, published versions, steps since the last publish;
- ``step``: ``Stepper`` — one optimizer step over a mini-batch (collate, log-probs, the built-in
  objective or the user's loss, micro-batches, clipping), on one process or on each rank;
- ``scoring``: ``TokenScorer`` — the LM as the module that gives the response tokens' log-probs
  (the root a sharded trainer wraps);
- ``rank_group``: ``RankGroup`` — the trainer ranks as one torch.distributed group (rank, mesh,
  the step's own collectives, their deadline);
- ``fsdp``: the model sharded by FSDP2 — built on the meta device, loaded shard by shard,
  gathered bucket by bucket;
- ``publish``: ``WeightPublisher`` — a version published and sent over weight groups;
- ``rl``: the RL math as pure functions of tensors — GRPO advantages, token log-probs, the PPO
  clipped objective, behaviour corrections (TIS, MIS);
- ``loss``: the user-loss protocol — what a ``loss_fn`` receives (``LossInput``), what it
  returns, how its mistakes are named.

Around it (no torch: the in-process executor and the simulator use them):

- ``host``: ``TrainerHost`` — turns the trainer's orders into calls on any trainer core and
  events back, one at a time;
- ``in_order``: ``InOrder`` — numbered orders run in the order they were sent, whatever order
  they arrive in (Ray does not keep it);
- ``shares``: which samples each rank trains (balanced by tokens) and how many passes all take;
- ``batch_stats``: the metrics a trained batch gives (``batch/*``, ``env/*``, ``reward/*``),
  whatever trains it.
"""
