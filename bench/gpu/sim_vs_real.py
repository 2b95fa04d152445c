"""How well does the simulator predict a real run? Calibrate the simulator's cost model from
real event logs (``events_<part>.bin.gz`` that ``python -m shunter.bench gpu`` keeps beside its
JSON), run the simulator on the same configs, and put predicted step times and ratios next
to the measured ones.

    python -m shunter.bench gpu-sim DIR [DIR ...] --config examples/gpu2_qwen05b.toml --out bench/results/gpu2_sim.json

Calibration, every figure from the logs (medians unless said):

- decode: each finished sample's time per token against the mean number of samples in
  flight on its replica during its life, fitted to ``decode_step_s + decode_step_s_per_seq *
  batch`` (least squares; samples of the standalone replica of ``separate2``, which has its GPU
  alone);
- lengths: the response lengths of the run (``lengths_file``), prompt tokens their median;
- train: ``StepEnd.duration_s`` per ``trainer/tokens``, past each run's first two steps
  (allocator and kernel warm-up make them 2-3x slower);
- weights: ``WeightsReady.duration_s`` (publish) and ``WeightsLoaded.duration_s`` (load);
- switches: ``sleep_s`` / ``wake_s`` from ``ModeChanged`` details, offload from ``Offloaded``.

Invariant: the simulator runs the real coordinator and policies on the same config as the
real run (``run.total_steps`` steps), so a difference between prediction and measurement is
the cost model's, not the scheduling's.
"""

from __future__ import annotations

import gzip
import json
import statistics
import tempfile
from pathlib import Path

import msgspec

from shunter.bench.analysis.summary import summarize
from shunter.bench.gpu.figures import step_time as steady_step_s
from shunter.bench.gpu.two_gpus import two_gpu_overrides
from shunter.engine.config.load import from_dict, load_config, merge
from shunter.events import (
    ModeChanged,
    Offloaded,
    SampleBegin,
    SampleEnd,
    StepEnd,
    WeightsLoaded,
    WeightsReady,
)

WARMUP_STEPS = 2


def read_gz(path: Path) -> list:
    from shunter.events import read_log

    with gzip.open(path, "rb") as f, tempfile.NamedTemporaryFile(suffix=".bin") as tmp:
        tmp.write(f.read())
        tmp.flush()
        return list(read_log(tmp.name))


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope, both clipped at 0."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var) if var else 0.0
    return max(0.0, my - slope * mx), slope


def decode_fit(msgs: list, replica: str) -> tuple[float, float, int]:
    """(decode_step_s, decode_step_s_per_seq, samples used) for one replica."""
    begins = {e.sample_id: e.wall_time for e in msgs if isinstance(e, SampleBegin) and e.replica_id == replica}
    ends = [
        (begins[e.sample.sample_id], e.wall_time, len(e.sample.token_ids))
        for e in msgs
        if isinstance(e, SampleEnd) and e.replica_id == replica and e.sample.sample_id in begins
    ]
    changes = sorted([(b, 1) for b, _, _ in ends] + [(e, -1) for _, e, _ in ends])
    times, level, levels = [], 0, []
    for t, d in changes:
        level += d
        times.append(t)
        levels.append(level)
    import bisect

    def mean_level(a: float, b: float) -> float:
        i = bisect.bisect_right(times, a)
        area, t0, lv = 0.0, a, levels[i - 1] if i else 0
        while i < len(times) and times[i] < b:
            area += lv * (times[i] - t0)
            t0, lv = times[i], levels[i]
            i += 1
        area += lv * (b - t0)
        return area / (b - a) if b > a else lv

    xs, ys = [], []
    for b, e, n in ends:
        if n >= 16 and e > b:  # a few tokens measure the stream interval, not the decode rate
            xs.append(mean_level(b, e))
            ys.append((e - b) / n)
    a, s = _fit(xs, ys)
    return a, s, len(xs)


def calibrate(runs: dict[str, list]) -> dict:
    """Cost-model fields from the real runs' messages (see the module docstring)."""
    sep = runs["separate2"]
    a, s, n = decode_fit(sep, "standalone-0")
    ends = [e.sample for m in runs.values() for e in m if isinstance(e, SampleEnd)]
    steps = [
        e
        for m in runs.values()
        for e in m
        if isinstance(e, StepEnd) and "trainer/tokens" in e.metrics and e.step > WARMUP_STEPS
    ]
    t0, t1 = 0.0, statistics.median(e.duration_s / e.metrics["trainer/tokens"] for e in steps)
    pub = [e.duration_s for m in runs.values() for e in m if isinstance(e, WeightsReady)]
    load = [e.duration_s for m in runs.values() for e in m if isinstance(e, WeightsLoaded) and e.duration_s > 0]
    modes = [e for m in runs.values() for e in m if isinstance(e, ModeChanged)]
    sleep = [e.detail["sleep_s"] for e in modes if "sleep_s" in e.detail]
    wake = [e.detail["wake_s"] for e in modes if "wake_s" in e.detail]
    off = [e.duration_s for m in runs.values() for e in m if isinstance(e, Offloaded)]
    nbytes = next(e.nbytes for m in runs.values() for e in m if isinstance(e, WeightsReady))
    med = statistics.median
    return {
        "prompt_tokens": int(med(len(x.prompt_token_ids) for x in ends)),
        "decode_step_s": a,
        "decode_step_s_per_seq": s,
        "decode_fit_samples": n,
        "train_step_s": t0,
        "train_s_per_token": t1,
        "train_fit_steps": len(steps),
        "weight_bytes": float(nbytes),
        "sync_latency_s": med(pub),
        "sync_bandwidth_Bps": 1e15,
        "load_s": med(load),
        "sleep_s": med(sleep) if sleep else 0.0,
        "wake_s": med(wake) if wake else 0.0,
        "offload_s": med(off) if off else 0.0,
        "lengths": [len(x.token_ids) for x in ends if x.finish_reason != "abort"],
    }


def predict(config: str, fields: dict, parts: list[str]) -> dict:
    """Simulated summaries of each part's config under the calibrated cost model."""
    from shunter.bench.sim.cluster import run_sim
    from shunter.bench.sim.cost_model import CostModel

    base = msgspec.to_builtins(load_config(config))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(map(str, fields["lengths"])))
    cost = CostModel(
        **{k: v for k, v in fields.items() if k not in ("lengths",) and not k.endswith(("_samples", "_steps"))},
        lengths_file=f.name,
    )
    out = {}
    for part in parts:
        over = two_gpu_overrides(part)
        # the simulated replica draws each response's length from the run's own lengths; the
        # config's length_dist would cut those short a second time
        over.setdefault("rollout", {}).update(engine_args={}, length_dist="", ignore_eos=False)
        cfg = from_dict(merge(json.loads(json.dumps(base)), over))
        res = run_sim(cfg, cost, keep=True)
        out[part] = {**summarize(res.messages), "steady_step_s": steady_step_s(res.messages)}
    Path(f.name).unlink()
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m shunter.bench gpu-sim", description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+", help="folders holding events_<part>.bin.gz")
    p.add_argument("--config", default="examples/gpu2_qwen05b.toml")
    p.add_argument("--out", default="bench/results/gpu2_sim.json")
    a = p.parse_args(argv)
    runs = {}
    for d in a.dirs:
        for f in sorted(Path(d).glob("events_*.bin.gz")):
            runs[f.name.removeprefix("events_").removesuffix(".bin.gz")] = read_gz(f)
    if "separate2" not in runs:
        raise SystemExit("needs events_separate2.bin.gz (the decode rate is fitted on its standalone replica)")
    fields = calibrate(runs)
    measured = {part: {**summarize(m), "steady_step_s": steady_step_s(m)} for part, m in runs.items()}
    predicted = predict(a.config, fields, sorted(runs))
    keys = ("steady_step_s", "step_s", "trainer_idle_frac", "rollout_idle_frac", "rollout_tokens_per_s")
    rows = {
        part: {k: {"measured": measured[part].get(k), "predicted": predicted[part].get(k)} for k in keys}
        for part in sorted(runs)
    }
    ratios = {}
    for a_, b_ in (("colocated2", "separate2"), ("separate2", "lend2")):
        if a_ in runs and b_ in runs:
            ratios[f"{a_}_over_{b_}"] = {
                k: {"measured": measured[a_][k] / measured[b_][k], "predicted": predicted[a_][k] / predicted[b_][k]}
                for k in ("steady_step_s", "step_s")
            }
    out = {
        "config": a.config,
        "cost_model": {k: v for k, v in fields.items() if k != "lengths"},
        "lengths": {
            "n": len(fields["lengths"]),
            "median": statistics.median(fields["lengths"]),
            "mean": statistics.fmean(fields["lengths"]),
            "max": max(fields["lengths"]),
        },
        "parts": rows,
        "step_time_ratios": ratios,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({"step_time_ratios": ratios, "parts": rows}, indent=1))
    return 0
