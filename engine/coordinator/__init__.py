"""The control plane: one coroutine turns every event into state, asks the policy, carries out
its intents as orders and starts new work. Pure asyncio — no torch, Ray or vLLM — so all of it
runs in unit tests over in-process components and in the simulator in virtual time.

The loop and how a run is built:

- ``coordinator``: ``Coordinator`` — the loop (record -> apply -> decide -> pump -> finale) and
  its one fault barrier; its parts wired in its constructor;
- ``assemble``: the one place a run's coordinator is built (prompts, policy, checkpoints, resume),
  for the coordinator actor, the tests and the simulator;
- ``snapshot``: the coordinator's part of a checkpoint, as plain data.

The loop's parts (each an object handed the others it needs):

- ``apply``: ``Applier`` — where each event changes the state;
- ``intents``: ``Intents`` — where an intent becomes orders, or is refused;
- ``guard``: ``PolicyGuard`` — the only caller of ``Policy.decide``, containing what it does;
  ``policy_worker``: a user policy's ``decide()`` on a thread that can be given up;
  ``watchdog``: interrupts a call of user code past its deadline;
- ``inflight``: ``InFlight`` — the samples being generated, what waits to resume, new work;
- ``batches``: ``Batches`` — mini-batches handed to the trainer, each trained at most once;
- ``buffer``: ``SampleBuffer`` — prompt groups from dispatch to trained or dropped, the staleness
  gate; ``groups``: its records; ``deadlines``: which groups the next mini-batches take when
  stale ones wait;
- ``dispatcher``: ``Dispatcher`` — generation balanced over the replicas in rollout;
- ``state``: ``EngineState`` — the bookkeeping the views are built from; ``tally``: ``Tally`` —
  the totals a run reports;
- ``cuts``: ``CheckpointCuts`` — when a checkpoint is cut and how it commits;
- ``finale``: ``Finale`` — how a run ends, one state machine; ``ending``: ``Ending`` — the books
  closed and ``RunEnded`` delivered;
- ``supervisor``: ``Supervisor`` — dead replicas replaced within bounds.

Around the loop:

- ``executor``: the boundary to the components (``Executor``) and what both executors share
  (``TaskExecutor``); ``failures``: ``Failures`` — what a failed call becomes, one path for both;
  ``local_executor``: ``LocalExecutor`` — the components in this process;
- ``relay``: ``Relay`` — a host's per-sample facts folded into reports before the coordinator;
- ``ranks``: ``RankTable`` — non-colliding ranks and actor names for every replica (the registry
  actor's core).
"""
