"""The trainer: an HF causal LM learning by PPO / GRPO in torch, and the host that drives it.

The torch core (imports torch):

- ``trainer``: ``Trainer`` — the model, its frozen reference and AdamW: built, checkpointed,
  offloaded and onloaded; its parts below share its ``counters``;
- ``shards``: a trainer's state on disk — model, optimizer and RNG by torch Distributed
  Checkpoint, loaded at any world size (the old ``model/`` + ``trainer.pt`` too), and the HF
  model folder gathered from a sharded model one bounded file at a time;
- ``counters``: ``TrainerCounters`` — steps, published versions, steps since the last publish;
- ``step``: ``Stepper`` — one optimizer step over a mini-batch (collate, log-probs, the built-in
  objective or the user's loss, micro-batches, clipping);
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
- ``batch_stats``: the metrics a trained batch gives (``batch/*``, ``env/*``, ``reward/*``),
  whatever trains it.
"""
