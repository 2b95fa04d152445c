"""The weight path on this machine: ``PublishWeights`` -> last ``WeightsLoaded`` with the trainer
ordering the loads itself (``run.direct_weights``, the default) and through the coordinator,
alternated in one sitting so both see the same machine (CPU: the safetensors blob through the
object store; on a GPU ``bench/gpu/weights_direct.py`` measures the same paths with CUDA IPC).

    python -m shunter.bench.gpu.weight_paths [--config examples/sort_separate.toml] [--steps 60]
        [--repeats 2] [--out bench/results/weight_paths_cpu.json]

Each run: the config with ``run.total_steps = --steps``, no validation and no checkpoints; the
figures are ``shunter.bench.gpu.figures.sync_figures`` of its event log (medians of the publishes past the
first, in ms), per run and the median across the runs of each path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

PATHS = {"direct": True, "coordinator": False}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shunter.bench.gpu.weight_paths", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="examples/sort_separate.toml")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="bench/results/weight_paths_cpu.json")
    a = p.parse_args(argv)

    import msgspec

    from shunter.bench.gpu.figures import sync_figures
    from shunter.bench.gpu.runs import machine, run_engine
    from shunter.engine.config.load import load_config

    base = load_config(a.config)
    runs: dict[str, list[dict]] = {k: [] for k in PATHS}
    for _ in range(a.repeats):
        for path, direct in PATHS.items():
            run = msgspec.structs.replace(
                base.run, total_steps=a.steps, direct_weights=direct, progress=False, checkpoint_every=0
            )
            cfg = msgspec.structs.replace(base, run=run, validation=msgspec.structs.replace(base.validation, every=0))
            _, out_dir = asyncio.run(run_engine(cfg))
            f = sync_figures(out_dir / "events.bin", float("nan"))
            row = {k.removeprefix("median_"): round(v * 1e3, 2) for k, v in f.items() if k.startswith("median_")}
            runs[path].append({**row, "publishes": f["n"]})
            print(f"{path}: end to end {row['end_to_end_s']} ms", flush=True)
    res = {
        "machine": machine(),
        "config": a.config,
        "steps": a.steps,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "unit": "ms",
        "runs": runs,
        "median_end_to_end_ms": {k: statistics.median(r["end_to_end_s"] for r in v) for k, v in runs.items()},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["median_end_to_end_ms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
