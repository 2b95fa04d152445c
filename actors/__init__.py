"""Thin Ray actor shells around the engine's objects, and the only code that imports vLLM
(``vllm``). An actor decodes the bytes it receives at its boundary with the typed codec,
delegates to an ``engine/`` object, and returns encoded events; no RL logic lives here.

- ``coordinator_actor``: ``CoordinatorActor`` — the shell around the run's ``Coordinator`` (built by
  ``engine/coordinator/assemble.py``): messages in, the feed out, the user's training calls;
- ``ray_executor``: ``RayExecutor`` — orders to the trainer and replica actors over Ray, every call
  bounded, every failure an event (the shared path: ``engine/coordinator/failures.py``); its parts
  ``host_relays`` (``HostRelays``: one relay actor per host that runs replicas) and
  ``weight_groups`` (``WeightGroups``: a weight load as a pair beside the trainer's send);
- ``relay_actor``: ``RelayActor`` — one per host: the shell around a ``Relay``, its replicas' streams
  and weight installs;
- ``rollout_worker``: ``RolloutWorker`` — one replica: a ``RolloutCore`` over vLLM;
- ``trainer_worker``: ``TrainerWorker`` — the torch ``Trainer`` behind a ``TrainerHost``;
- ``registry_actor``: ``ReplicaRegistryActor`` — the single owner of a run's ``RankTable``;
- ``reward_workers``: the user's reward in processes of its own, shared by the replicas;
- ``pool``: ``ReplicaPool`` — replicas that outlive a run, for the next runs;
- ``wire``: bytes in, bytes out — the codec at an actor's boundary;
- ``vllm``: the vLLM backend, its engine, requests and weights, the worker extension, NCCL;
- ``launch``: the ``Launcher`` and its parts, the Ray cluster a run lives in.
"""
