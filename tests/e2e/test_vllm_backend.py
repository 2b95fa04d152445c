"""The vLLM-facing module against HF transformers on the same weights (greedy tokens,
log-probs, abort + resume, weight load, sleep/wake, a load with a request paused in place);
the check runs in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_vllm_backend_matches_hf_through_abort_resume_and_weight_load():
    script = Path(__file__).with_name("vllm_backend_check.py")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=400)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def test_a_tensor_parallel_engine_matches_hf_through_loads_a_weight_group_abort_and_sleep():
    """The same checks on an engine of two worker processes (``tensor_parallel_size = 2``, vLLM's
    mp executor; 'nobind': the OS spreads them): each load reaches both ranks (a rank left with
    old weights would change the greedy tokens and log-probs against HF), a weight group's
    bytes through the first."""
    script = Path(__file__).with_name("vllm_backend_check.py")
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "SHUNTER_CHECK_TP": "2",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=400)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def test_a_weight_load_in_flight_when_the_engine_core_is_killed_raises_engine_dead():
    """``kill -9`` of ``VLLM::EngineCore`` during a weight load: the load raises ``EngineDead``
    within seconds (the replica is then down at once), never hangs until run.timeout_s."""
    script = Path(__file__).with_name("vllm_engine_death_check.py")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
