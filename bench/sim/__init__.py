"""The simulated cluster: the real engine over simulated replicas and trainer, in virtual time.

- ``cost_model``: ``CostModel`` (a scenario's ``[cost]``: every simulated time) and ``LengthSampler``.
- ``replica_model``: ``ReplicaModel``, one replica as vLLM V1 schedules it (pure, event-driven); ``Books``.
- ``kv_pool``: ``KvPool``, a replica's KV blocks and the prefix cache that keeps a preempted request's.
- ``turns``: multi-turn trajectories (``Plans``), the simulated tool (``SimTool``), the token spelling.
- ``backends``: ``SimBackend`` (a replica), ``SimTrainer`` (the trainer core), ``SimTokenizer``, ``sim_reward``.
- ``accounting``: ``SimResult``, ``kv_occupancy``, ``ChargedInbox`` (charged coordinator CPU), ``CoordinatorTime``
  (its CPU and wall time), ``RelayWire`` (relays' bytes decoded by the coordinator), ``GcPauses``.
- ``cluster``: ``run_sim``, one simulated job to ``RunEnded``.
"""
