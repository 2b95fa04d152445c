"""The GPU bench's figures are computed from event logs by plain functions; they are
checked here on synthetic logs (the GPU runs themselves happen on the lent machine)."""

from __future__ import annotations

import json

from shunter.bench.gpu.figures import decode_steps, switch_figures, sync_figures
from shunter.bench.gpu.two_gpus import two_gpu_overrides
from shunter.bench.report.gpu_sections import gpu_section
from shunter.events import (
    Codec,
    LoadWeights,
    ModeChanged,
    PublishWeights,
    WeightsLoaded,
    WeightsReady,
)

ENV = {"run_id": "r", "source": "t"}


def test_sync_figures_pair_each_publish_with_its_last_load_and_the_floor(tmp_path):
    c = Codec()
    log = tmp_path / "events.bin"
    msgs = []
    for v, t in ((1, 10.0), (2, 20.0), (3, 30.0)):
        msgs += [
            PublishWeights(wall_time=t, **ENV),
            WeightsReady(
                version=v,
                handle=f"cuda_ipc:{v}",
                transport="cuda_ipc",
                nbytes=10**9,
                duration_s=0.01,
                wall_time=t + 0.01,
                **ENV,
            ),
            LoadWeights(version=v, replica_ids=["a", "b"], wall_time=t + 0.03, **ENV),
            WeightsLoaded(replica_id="a", version=v, duration_s=0.04, wall_time=t + 0.05, **ENV),
            WeightsLoaded(
                replica_id="b",
                version=v,
                duration_s=0.05,
                wall_time=t + 0.1,
                detail={"abort_s": 0.03, "load_s": 0.02, "backend_planned": float(v > 1)},
                **ENV,
            ),
        ]
    log.write_bytes(b"".join(c.frame(m) for m in msgs))
    f = sync_figures(log, floor_gbps=4000.0)
    assert f["n"] == 3 and f["transport"] == "cuda_ipc"
    assert abs(f["median_end_to_end_s"] - 0.1) < 1e-6 and f["median_load_s"] == 0.05
    assert abs(f["floor_s"] - 10**9 / 2e12) < 1e-12 and f["ratio_to_floor"] > 100
    assert abs(f["median_back_and_decide_s"] - 0.02) < 1e-6 and abs(f["median_to_replica_and_load_s"] - 0.07) < 1e-6
    assert f["median_replica_abort_s"] == 0.03
    assert f["planned_share"] == 1.0 and f["first"]["replica_backend_planned"] == 0.0  # the loader first, then the plan


def test_switch_figures_and_the_report_section():
    evs = [
        ModeChanged(replica_id="h", mode=m, previous="x", duration_s=d, detail={"sleep_s": d}, wall_time=i, **ENV)
        for i, (m, d) in enumerate([("trainer", 0.1), ("rollout", 0.2), ("trainer", 0.3), ("rollout", 0.4)])
    ]
    sw = switch_figures(evs)
    assert sw["to_trainer_s"] == 0.3 and sw["to_rollout_s"] == 0.4  # past the first switch
    r = {
        "machine": {"gpu": "G", "gpu_memory_gib": 1},
        "copy_gbps": 1000.0,
        "switch": sw,
        "sync": {
            "median_end_to_end_s": 0.1,
            "nbytes": 2**30,
            "transport": "cuda_ipc",
            "floor_s": 0.001,
            "ratio_to_floor": 100.0,
        },
        "rollout": {"efficiency": 0.9, "engine": {"tokens_per_s": 9.0}, "raw_vllm": {"tokens_per_s": 10.0}},
    }
    text = "\n".join(gpu_section(json.loads(json.dumps(r)), __import__("pathlib").Path("x.json")))
    assert "100 ms for 1.00 GiB over cuda_ipc" in text and "90%" in text


def test_the_simulator_calibrated_on_its_own_runs_predicts_them(tmp_path):
    """``bench gpu-sim`` on logs the simulator itself wrote with a known cost model: the
    calibration recovers the model and the prediction matches the 'measurement'."""
    import gzip

    import msgspec

    from shunter.bench.gpu import sim_vs_real as gpu_sim
    from shunter.bench.sim.cluster import run_sim
    from shunter.bench.sim.cost_model import CostModel
    from shunter.engine.config import from_dict, load_config, merge

    truth = CostModel(
        prompt_tokens=7,
        decode_step_s=0.0,
        decode_step_s_per_seq=1e-4,
        length_median=200,
        length_sigma=0.8,
        train_step_s=0.0,
        train_s_per_token=5e-5,
        load_s=0.08,
        sleep_s=0.15,
        wake_s=0.2,
        offload_s=0.25,
        weight_bytes=1e9,
        sync_bandwidth_Bps=1e15,
        sync_latency_s=0.01,
    )
    base = msgspec.to_builtins(load_config("examples/gpu2_qwen05b.toml"))
    c = Codec()
    for part in ("separate2", "colocated2", "lend2"):
        over = two_gpu_overrides(part)
        over.setdefault("rollout", {}).update(length_dist="", ignore_eos=False, engine_args={})
        res = run_sim(from_dict(merge(json.loads(json.dumps(base)), over)), truth)
        with gzip.open(tmp_path / f"events_{part}.bin.gz", "wb") as f:
            f.write(b"".join(c.frame(m) for m in res.messages))
    out = tmp_path / "sim.json"
    assert gpu_sim.main([str(tmp_path), "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    cm = r["cost_model"]
    assert abs(cm["decode_step_s_per_seq"] - 1e-4) / 1e-4 < 0.15 and cm["decode_step_s"] < 0.005
    assert abs(cm["train_s_per_token"] - 5e-5) / 5e-5 < 0.05
    assert abs(cm["load_s"] - 0.08) < 1e-6 and abs(cm["sleep_s"] - 0.15) < 1e-6
    for v in r["step_time_ratios"].values():  # eight steps per run, as on the GPU: ~10 % noise in a pace
        st = v["steady_step_s"]
        assert abs(st["predicted"] / st["measured"] - 1) < 0.2, v
    from shunter.bench.report.gpu_sections import gpu_sim_section

    assert any("ratio colocated2_over_separate2" in line for line in gpu_sim_section(r, out))


def test_decode_steps_estimate_the_step_a_load_waits_for_from_the_runs_samples():
    """Two sequences generate for 10 s, 100 tokens each (20 tokens/s in all, 2 in flight): a
    step is 2 / 20 = 0.1 s, a load waits half of one at least; one of them is cut by a weight
    load at t=4 and resumes at once, which changes neither figure."""
    from shunter.events import SampleAborted, SampleBegin, SampleEnd, SampleResumed
    from shunter.events.data import Sample

    def s(k: int) -> Sample:
        return Sample(sample_id=f"1.{k}", group_id=1, prompt_id=0, prompt_token_ids=[0], token_ids=[1] * 100)

    ids = {"group_id": 1, "replica_id": "a", **ENV}
    msgs = [
        SampleBegin(sample_id="1.0", version=0, wall_time=0.0, **ids),
        SampleBegin(sample_id="1.1", version=0, wall_time=0.0, **ids),
        SampleAborted(sample_id="1.1", reason="weights_update", wall_time=4.0, **ids),
        SampleResumed(sample_id="1.1", prefix_len=40, remaining_tokens=60, version=1, wall_time=4.0, **ids),
        SampleEnd(replica_id="a", sample=s(0), wall_time=10.0, **ENV),
        SampleEnd(replica_id="a", sample=s(1), wall_time=10.0, **ENV),
    ]
    f = decode_steps(msgs, [3.0])
    assert abs(f["decode_tokens_per_s"] - 20.0) < 1e-9 and abs(f["mean_in_flight"] - 2.0) < 1e-9
    assert abs(f["decode_step_s"] - 0.1) < 1e-9 and abs(f["step_wait_floor_s"] - 0.05) < 1e-9
    assert f["in_flight_at_load"] == 2.0
    assert decode_steps([], []) == {}
