"""Starting a run's actors: the cluster it lives in, the room it needs, the replicas it makes.

- ``launcher``: ``Launcher`` — creates, places and removes the actors of one run attempt, built
  from the parts below;
- ``run_site``: ``RunSite`` — what a run opens once and keeps over its attempts: the model folder,
  its data, Ray, the replica registry;
- ``run_data``: the run's data, loaded and checked once with the model's tokenizer before any
  actor starts;
- ``room``: ``Room`` — whether the run's actors fit and where each goes (its placement group);
- ``placement``: ``Placer`` — the placement plan (``engine/config/placement.py``) reserved as Ray
  placement groups;
- ``replica_launcher``: ``ReplicaLauncher`` — each replica registered for a rank, created, placed,
  announced; replicas kept across attempts and brought up mid-run;
- ``attempt``: ``Attempt`` — the attempt in progress, as the parts share it; ``await_setup``;
- ``cluster``: the Ray cluster — joining or starting it, the driver's host, room for what a run
  asks (``replica.pending`` while it waits), Ray on 127.0.0.1 only (``local_only``);
- ``join``: ``reach`` — a cluster to join asked for its id before ``ray.init`` joins it, within
  ``run.connect_timeout_s``: a dead or wrong address, a refused auth token, one error naming it.
"""
