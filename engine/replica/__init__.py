"""One rollout replica's core, over any inference engine that speaks the ``Backend`` protocol
(vLLM in ``actors/vllm/``, fakes in the tests, simulated replicas in ``bench/sim``).

- ``core``: ``RolloutCore`` — takes the coordinator's orders (``handle``), streams each group's
  samples as they end, shuts down; it builds the parts below and hands each what it uses;
- ``samples``: ``SampleRunner`` — one sample: its turns, its events, its token budget, its score;
- ``modes``: ``WeightsAndModes`` — weight loads (``abort`` or ``keep``) and the switches between
  rollout and trainer;
- ``validation``: ``Validation`` — greedy answers to held-out prompts on one weight version;
- ``envs``: ``Environments`` — a trajectory's environment made, stepped and closed, off the loop;
- ``running``: ``RunningRequests`` — the table of requests running here and the cuts made
  through it (the parts share it);
- ``serving``: ``Serving`` — what the replica serves now: version, mode, the open gate;
- ``backend``: the ``Backend`` and ``Tokenizer`` protocols, ``GenParams``, ``GenResult``,
  ``EngineDead``;
- ``heartbeat``: ``Heartbeat`` — a stream's "still making progress" beats; ``OpenStreams``;
- ``lengths``: per-sample token budgets (``rollout.length_dist``);
- ``clock``: ``now`` — the loop's clock that durations are measured on (virtual in a simulation).
"""
