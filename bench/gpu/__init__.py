"""Real engine runs on hardware (``python -m shunter.bench gpu``), the simulator against them (``gpu-sim``).

- ``measure``: ``PARTS``, ``measure``, the entry point of ``bench gpu`` and of its child processes.
- ``runs``: the machine's details, the device copy floor, one engine run, ``published_nbytes``.
- ``figures``: figures from a run's events: weight sync, decode steps, tokens/s, switches, step time.
- ``children``: measurements in a child process: raw vLLM, the rollout core alone, the IPC weight paths.
- ``engine_rpc``: the round trip of vLLM's engine-core calls a weight load waits for (``rpc``).
- ``weights_direct``: weights straight from the trainer to the replicas (``relay_sync``, ``fanout``).
- ``two_gpus``: the parts across two GPUs of one host (``nccl_floor``, ``separate2`` ...).
- ``sim_vs_real``: the simulator calibrated on real runs' logs, predicted against measured (``gpu-sim``).
- ``trainer_ranks``: the trainer alone, plain and FSDP2 by ranks: step time, peak memory per rank.
- ``weight_paths``: the weight path direct vs through the coordinator, on this machine's CPU.
"""
