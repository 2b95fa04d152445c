"""GPU parts of issue 28: weights straight from the trainer to the replicas, with requests in
flight (staleness 8, so each replica is still generating as each load lands).

- ``relay_sync``: one replica sharing the device with the trainer; ``PublishWeights`` -> last
  ``WeightsLoaded`` per version (median of the publishes past the first), its hops from the
  stamps and the copy floor beside it, for each path in one machine start:
  ``direct`` (the default: the trainer orders the replica's load itself, trainer -> replica),
  ``relay`` (``run.relays = "all"``: trainer -> the host's relay -> replica) and
  ``coordinator`` (``run.direct_weights = false``: trainer -> coordinator -> replica, the
  coordinator ordering the load once ``WeightsReady`` is back); ``SHUNTER_SYNC_PATHS`` picks some;
- ``fanout``: 1, 2 and 4 replicas on the device, on the path ``SHUNTER_FANOUT_PATH`` names
  (default ``direct``): the trainer's publish time (what a publish costs it) must not grow with
  the replicas (one publish, one copy, many readers; on the direct path one small call per
  replica, on the relay path one per host).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

ROLLOUT = {"max_staleness": 8}
PATHS = {
    "direct": {"run": {"policy": "separate"}, "rollout": ROLLOUT},
    "relay": {"run": {"policy": "separate", "relays": "all"}, "rollout": ROLLOUT},
    "coordinator": {"run": {"policy": "separate", "direct_weights": False}, "rollout": ROLLOUT},
}


def relay_sync(cfg: Callable[[dict], Any], run, sync_figures, floor: float, ended) -> dict:
    out: dict = {}
    for path in os.environ.get("SHUNTER_SYNC_PATHS", ",".join(PATHS)).split(","):
        try:
            events, run_dir = run(cfg(PATHS[path]))
        except Exception as e:  # noqa: BLE001 - one path failing leaves the others' figures
            out[path] = {"error": str(e)[:2000]}
            continue
        figs = sync_figures(run_dir / "events.bin", floor)
        figs["ended"] = ended(events)
        out[path] = figs
        print(f"relay_sync {path}: end-to-end {figs.get('median_end_to_end_s')}", flush=True)
    return out


def fanout(cfg: Callable[[dict], Any], run, sync_figures, floor: float, ended) -> dict:
    out: dict = {}
    mems = {1: 0.25, 2: 0.18, 3: 0.14, 4: 0.12}
    wanted = [int(x) for x in os.environ.get("SHUNTER_FANOUT", "1,2,4").split(",")]  # a shorter call: fewer
    path = PATHS[os.environ.get("SHUNTER_FANOUT_PATH", "direct")]
    for n, mem in ((n, mems[n]) for n in wanted):
        over = {
            **path,
            "rollout": {
                **path["rollout"],
                "standalone_replicas": n,
                "num_gpus": round(0.6 / n, 3),
                "gpu_memory_utilization": mem,
            },
        }
        try:
            events, run_dir = run(cfg(over))
        except Exception as e:  # noqa: BLE001 - one size failing leaves the others' figures
            out[f"replicas_{n}"] = {"error": str(e)[:2000]}
            continue
        figs = sync_figures(run_dir / "events.bin", floor)
        figs["ended"] = ended(events)
        out[f"replicas_{n}"] = figs
        print(
            f"fanout {n}: publish {figs.get('median_publish_s')} end-to-end {figs.get('median_end_to_end_s')}",
            flush=True,
        )
    pub = {k: v.get("median_publish_s") for k, v in out.items() if isinstance(v, dict)}
    out["trainer_publish_s"] = pub
    return out
