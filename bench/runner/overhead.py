"""Engine overhead on this machine, next to raw Ray actor calls measured in the same run.

Invariants: every figure comes from one process run; the coordinator figures are the real
``Coordinator`` loop (record -> apply -> decide -> pump) driven by a simulated cluster, so
they include policy and bookkeeping but no Ray transport; the Ray figures are a no-op
async actor called one at a time and pipelined; the ingest figure is the real
``CoordinatorActor`` taking batches of encoded events over Ray.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import msgspec

from shunter.bench.runner.results import result_json
from shunter.bench.runner.scenario_file import Scenario
from shunter.bench.runner.simulated import variant_setup
from shunter.bench.sim.cluster import run_sim


class _Noop:
    async def ping(self, x: int) -> int:
        return x


def _ray_calls(n: int) -> dict[str, float]:
    import ray

    actor = ray.remote(num_cpus=0)(_Noop).remote()

    async def go():
        await actor.ping.remote(0)
        t = time.perf_counter()
        for i in range(n):
            await actor.ping.remote(i)
        seq = n / (time.perf_counter() - t)
        t = time.perf_counter()
        await asyncio.gather(*(actor.ping.remote(i) for i in range(n)))
        pipe = n / (time.perf_counter() - t)
        return seq, pipe

    seq, pipe = asyncio.run(go())
    ray.kill(actor)
    return {"ray_calls_per_s_sequential": seq, "ray_calls_per_s_pipelined": pipe}


def _ingest(n_batches: int, batch: int) -> dict[str, float]:
    """Encoded event batches into a real CoordinatorActor over Ray (no replicas attached)."""
    import ray

    from shunter.actors import coordinator_actor
    from shunter.engine.config.load import from_dict
    from shunter.events import Codec, SampleBegin

    cfg = from_dict({"run": {"output_dir": "/tmp/shunter-bench-overhead"}, "validation": {"every": 0}})
    codec = Codec()
    actor = coordinator_actor.remote_class().remote(
        msgspec.msgpack.encode(cfg), "overhead", None, {}, "/tmp/shunter-bench-overhead"
    )
    payload = codec.encode_batch(
        [SampleBegin(sample_id=f"{i}.0", group_id=i, replica_id="standalone-0", version=0) for i in range(batch)]
    )

    async def go():
        await actor.start.remote(codec.encode_batch([]))
        t = time.perf_counter()
        await asyncio.gather(*(actor.ingest.remote(payload, "bench") for _ in range(n_batches)))
        # wait until the loop has handled all of them
        cursor, total = 0, 0
        while total < n_batches * batch:
            items, cursor, _ = await actor.fetch.remote(cursor, 100_000, 1.0)
            total += sum(1 for _ in items)
        return n_batches * batch / (time.perf_counter() - t)

    rate = asyncio.run(go())
    ray.kill(actor)
    return {"ingest_events_per_s": rate, "ingest_batch": float(batch)}


def run_overhead(sc: Scenario) -> dict:
    import ray

    metrics: dict[str, dict[str, dict[str, float]]] = {}
    for v in sc.variant:
        runs: list[dict[str, float]] = []
        for seed in sc.scenario.seeds:
            cfg, cost = variant_setup(sc, v)
            r = run_sim(cfg, cost, seed=seed, keep=False)
            # a message is handled when its turn ends: each turn's time counts once per message in it
            lat = sorted(dt for dt, n in zip(r.handle_s, r.turn_sizes, strict=True) for _ in range(n))
            m = {
                "replicas": float(cfg.rollout.standalone_replicas + cfg.rollout.hybrid_replicas),
                "messages": float(r.handled),
                "facts_per_cpu_s": r.handled / r.coordinator_cpu_s,
                "latency_p50_ms": 1e3 * lat[len(lat) // 2],
                "latency_p99_ms": 1e3 * lat[int(len(lat) * 0.99)],
                "coordinator_share": r.coordinator_cpu_s / r.sim_s,
            }
            runs.append(m)
            print(
                f"  {v.name:<28} seed {seed}: {m['facts_per_cpu_s']:,.0f} facts per coordinator CPU-second, "
                f"p50 {m['latency_p50_ms']:.3f} ms, p99 {m['latency_p99_ms']:.3f} ms"
            )
        metrics[v.name] = {k: _stats([x[k] for x in runs]) for k in runs[0]}
    from shunter.actors.launch.cluster import local_only

    local_only()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        raw = [_ray_calls(500) for _ in sc.scenario.seeds]
        ing = [_ingest(40, 256) for _ in sc.scenario.seeds]
    finally:
        ray.shutdown()
    metrics["raw Ray actor calls"] = {k: _stats([x[k] for x in raw]) for k in raw[0]}
    metrics["CoordinatorActor ingest over Ray"] = {k: _stats([x[k] for x in ing]) for k in ing[0]}
    for name in ("raw Ray actor calls", "CoordinatorActor ingest over Ray"):
        print(f"  {name}: " + ", ".join(f"{k} {v['median']:,.0f}" for k, v in metrics[name].items()))
    return result_json(sc, metrics)


def _stats(vals: list[float]) -> dict[str, float]:
    return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
