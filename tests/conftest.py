"""Shared fixtures. The heavy ones (a Ray cluster, a tiny model, vLLM) are session-scoped
and built once; the unit tier needs none of them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))  # so tests can import fakes


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from shunter.actors.launch import local_only

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    local_only()  # as a default run: every socket on 127.0.0.1
    # three simulated GPUs: resources only (nothing here runs CUDA), for the placement tests
    ray.init(
        num_cpus=4,
        num_gpus=3,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        namespace="shunter",
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()
