"""How published weights travel from the trainer to the replicas (torch; no Ray, no vLLM).

- ``transport``: what a publish makes — a flat buffer per version, its layout, IPC packages
  (``FlatPublisher``), and unpacking them on the replica side;
- ``group``: collective groups (gloo on CPU, NCCL through ``actors/vllm/nccl.py`` on GPU) that carry
  a version from the trainer to a replica on another device, each call with a deadline;
- ``copy_plan``: a direct copy plan from HF-named tensors into a vLLM model's parameters, used
  only after it reproduced the model's own loader once.
"""
