"""The GPU tier (issue 5): run on a machine with an NVIDIA GPU (skipped elsewhere, so CI
skips it). A developer runs it on the lent machine:

    pytest tests/gpu -m gpu

- a full short run of the tiny model on one GPU (trainer + replica sharing the device,
  bf16 autocast, cuda_ipc weight sync) that completes and improves its reward;
- a weight update through CUDA IPC that provably changes the replica's outputs, and makes
  them those of the new weights (shunter's worker extension, and vLLM's own IPC
  weight-transfer engine) — twice, the second time through the direct copy plan the first
  load verified;
- a sleep / wake cycle that frees GPU memory and gives back the same outputs;
- with two GPUs: the same weight update over an NCCL weight group (trainer on one GPU,
  replica on the other), and a short run with the replica on its own GPU.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]
ROOT = Path(__file__).resolve().parents[2]


def _ship_by_value():
    """Functions and actor classes here run in Ray workers, which cannot import this module."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


if torch.cuda.is_available():
    _ship_by_value()
    # engines started in this process (after torch touched CUDA) must spawn their workers
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from shunter.engine.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "sort-tiny", sft_steps=25))


def _run_events(cfg, timeout_s: float = 900) -> list:
    """Every event of one whole run."""
    from shunter import Engine

    async def go():
        evs = []
        async with asyncio.timeout(timeout_s):
            async with Engine(cfg) as engine:
                async for ev in engine.events():
                    evs.append(ev)
        return evs

    return asyncio.run(go())


def test_a_short_run_on_one_gpu_completes_and_learns(tiny, tmp_path):
    from shunter.engine.config import load_config
    from shunter.events import RunEnded, WeightsLoaded, WeightsReady

    cfg = load_config(
        ROOT / "examples" / "gpu_tiny.toml",
        {"run": {"output_dir": str(tmp_path)}, "model": {"path": tiny, "build_tiny": ""}},
    )
    evs = _run_events(cfg)
    ended = evs[-1]
    assert isinstance(ended, RunEnded) and ended.reason == "completed", ended
    ready = [e for e in evs if isinstance(e, WeightsReady)]
    assert ready and all(e.transport == "cuda_ipc" for e in ready)
    assert [e for e in evs if isinstance(e, WeightsLoaded) and e.version == ready[-1].version]
    s = ended.summary
    assert s["batch/reward_last"] > s["batch/reward_first"], s


def _greedy(backend, prompts, n_tokens=8):
    from shunter.engine.replica.backend import GenParams

    async def one(i, p):
        r = await backend.generate(f"g{i}-{os.urandom(3).hex()}", p, GenParams(max_tokens=n_tokens, temperature=0.0))
        return r.token_ids

    return asyncio.get_event_loop().run_until_complete(asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.mark.parametrize("transport", ["cuda_ipc", "vllm_ipc", pytest.param("nccl", marks=two_gpus)])
def test_an_ipc_weight_update_changes_outputs_to_those_of_the_new_weights(tiny, transport):
    """Trainer and replica in two processes on one GPU (Ray actors), as in a run; through
    shunter's worker extension (cuda_ipc) and through vLLM's own IPC weight-transfer engine;
    with ``nccl`` each on a GPU of its own, the weights broadcast over their weight group."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    gpus = 1 if transport == "nccl" else 0.5
    try:
        ray.get(ray.remote(num_gpus=gpus)(_ipc_round_trip).remote(tiny, transport), timeout=600)
    finally:
        ray.shutdown()


@two_gpus
def test_a_short_run_on_two_gpus_sends_weights_over_nccl(tiny, tmp_path):
    from shunter.engine.config import load_config
    from shunter.events import ComponentPlaced, RunEnded, WeightsLoaded, WeightsSent

    cfg = load_config(
        ROOT / "examples" / "gpu2_qwen05b.toml",
        {
            "run": {"output_dir": str(tmp_path), "total_steps": 6},
            "model": {"path": tiny, "build_tiny": ""},
            "rollout": {
                "max_tokens": 16,
                "max_model_len": 64,
                "length_dist": "",
                "ignore_eos": False,
                "gpu_memory_utilization": 0.2,
            },
            "trainer": {"ppo_mini_batch_size": 64, "train_batch_size": 64},
        },
    )
    evs = _run_events(cfg)
    assert isinstance(evs[-1], RunEnded) and evs[-1].reason == "completed", evs[-1]
    placed = {e.component: e.gpu_ids for e in evs if isinstance(e, ComponentPlaced)}
    assert placed["trainer"] != placed["standalone-0"], placed
    sent = {(e.replica_id, e.version) for e in evs if isinstance(e, WeightsSent)}
    loaded = {(e.replica_id, e.version) for e in evs if isinstance(e, WeightsLoaded) and e.version > 0}
    assert loaded and loaded <= sent


def _ipc_round_trip(model_dir: str, transport: str) -> None:
    """In a GPU worker: a replica (vLLM) loads weights published by a trainer actor over
    CUDA IPC; its greedy outputs change and match HF greedy under the new weights."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from shunter.actors.vllm.backend import VLLMBackend
    from shunter.actors.vllm.engine import EngineSpec

    @ray.remote(num_gpus=1 if transport == "nccl" else 0.4)
    class Pub:
        def __init__(self, d):
            from shunter.engine.config import TrainerConfig
            from shunter.engine.trainer.trainer import Trainer

            self.t = Trainer(TrainerConfig(weight_transport=transport), d)
            self.t.setup()

        def publish(self):
            with torch.no_grad():
                for p in self.t.model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            return self.t.publish(), {k: v.detach().cpu() for k, v in self.t.model.state_dict().items()}

        def open(self):
            return self.t.open_weight_group("r0")

        def send(self, version):
            return self.t.send_weights("r0", version)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    be = VLLMBackend(
        EngineSpec(
            model_dir=model_dir,
            max_model_len=64,
            gpu_memory_utilization=0.2,
            weight_transfer="ipc" if transport == "vllm_ipc" else "",
            extra={"dtype": "bfloat16"},
        )
    )
    loop.run_until_complete(be.start())
    prompts = [[30, 31, 32, 40], [33, 34, 40], [35, 31, 36, 37, 40]]
    before = _greedy(be, prompts)
    pub = Pub.remote(model_dir)
    if transport == "nccl":
        host, port = ray.get(pub.open.remote())
        loop.run_until_complete(be.join_weight_group("nccl", host, port, 120.0))
    from shunter.engine.weights.transport import payload_kind

    paths = []
    # the second load goes through the copy plan the first one verified; the third (cuda_ipc)
    # comes from the trainer's first buffer again, mapped and bound already: one fused copy
    for version in (1, 2, 3):
        package, sd = ray.get(pub.publish.remote())
        assert payload_kind(package) == ("cuda_ipc" if transport == "nccl" else transport) and len(package) < 1 << 16
        sent = pub.send.remote(version) if transport == "nccl" else None
        loop.run_until_complete(be.load_weights(package))
        if sent is not None:
            assert ray.get(sent, timeout=120)["nbytes"] > 0
        paths.append(be.last_load.get("path"))
        after = _greedy(be, prompts)
        assert after != before
        before = after
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        ref.load_state_dict(sd)
        ref = ref.to(torch.bfloat16).cuda().eval()  # vLLM got bf16 weights
        for p, got in zip(prompts, after, strict=True):
            ids = ref.generate(torch.tensor([p], device="cuda"), max_new_tokens=8, do_sample=False, eos_token_id=None)[
                0, len(p) :
            ].tolist()
            assert got[:4] == ids[:4], (version, paths, p, got, ids)  # bf16 near-ties may split later tokens
    if transport == "cuda_ipc":
        assert paths == ["load_weights+plan_verified", "copy_plan", "copy_plan_mapped"], paths
    elif transport == "nccl":
        assert paths == ["load_weights+plan_verified", "copy_plan", "copy_plan"], paths
    loop.run_until_complete(be.shutdown())


def test_sleep_frees_gpu_memory_and_wake_gives_the_same_outputs(tiny):
    from shunter.actors.vllm.backend import VLLMBackend
    from shunter.actors.vllm.engine import EngineSpec

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    be = VLLMBackend(
        EngineSpec(
            model_dir=tiny,
            max_model_len=64,
            gpu_memory_utilization=0.2,
            enable_sleep_mode=True,
            extra={"dtype": "bfloat16"},
        )
    )
    loop.run_until_complete(be.start())
    prompts = [[30, 31, 32, 40], [33, 34, 40]]
    first = _greedy(be, prompts)
    used = be.device_memory_used()
    loop.run_until_complete(be.sleep(1))
    freed = used - be.device_memory_used()
    loop.run_until_complete(be.wake_up())
    assert freed > 10 * 2**30, f"sleep level 1 freed only {freed / 2**30:.2f} GiB"
    assert _greedy(be, prompts) == first
    loop.run_until_complete(be.shutdown())
