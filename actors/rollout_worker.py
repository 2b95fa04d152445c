"""``RolloutWorker``: a Ray actor hosting one vLLM engine for one replica.

Invariant: generation and control run in separate Ray concurrency groups, so a flood of
``generate`` calls can never starve a switch, a weight load or an abort. Ray gives each
group its own event loop thread, but vLLM's ``AsyncLLM`` belongs to the loop it was built
on, so every group hands its coroutine to that one engine loop (built in ``setup``). All logic is in
``shunter.engine.replica.core.RolloutCore``; this shell only decodes commands, picks the core
method and encodes the events it returns.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import ray

from shunter.actors.wire import decode_order, encode_events
from shunter.events import Generate, Stamper


class RolloutWorker:
    def __init__(
        self,
        run_id: str,
        replica_id: str,
        model_dir: str,
        *,
        reward: str,
        task: str,
        mode: str,
        seed: int,
        max_model_len: int,
        max_tokens: int,
        engine_args: dict | None = None,
        cpu_bind: str = "",
        version: int = 0,
        gpu_memory_utilization: float = 0.4,
        enable_sleep_mode: bool = True,
        stream_interval: int = 16,
        weight_transfer: str = "",
        tensor_parallel_size: int = 1,
        weight_update: str = "abort",
        import_paths: list[str] | None = None,
        reward_timeout_s: float = 30.0,
        reward_threads: int = 4,
        environment: str | type = "",
        max_turns: int = 4,
        env_timeout_s: float = 30.0,
        reward_pool: list | None = None,
        progress_every_s: float = 0.0,
        visible_gpus: str = "",
    ) -> None:
        from shunter.policies.registry import use_import_paths

        use_import_paths(import_paths or [])  # the user's task / reward resolve like the config's other import strings
        self.run_id, self.replica_id, self.model_dir = run_id, replica_id, model_dir
        self.reward_spec, self.task = reward, task
        self.mode, self.seed = mode, seed
        self.max_model_len, self.max_tokens = max_model_len, max_tokens
        self.engine_args = dict(engine_args or {})
        self.cpu_bind = cpu_bind
        self.version = version
        self.gpu_memory_utilization, self.enable_sleep_mode = gpu_memory_utilization, enable_sleep_mode
        self.stream_interval = stream_interval
        self.weight_transfer = weight_transfer
        self.tensor_parallel_size = tensor_parallel_size
        self.weight_update = weight_update
        self.reward_timeout_s, self.reward_threads = reward_timeout_s, reward_threads
        self.environment, self.max_turns, self.env_timeout_s = environment, max_turns, env_timeout_s
        self.reward_pool = list(reward_pool or [])  # the run's reward workers (empty: threads here)
        self.progress_every_s = progress_every_s  # beats on long generation streams (engine.replica.heartbeat)
        self.visible_gpus = visible_gpus  # a hybrid TP replica: the GPUs of its span (Ray gave it a share of one)
        self.core = None
        self._backend: Any = None
        self._req: Any = None  # the request counter a stopped sample loop left (ids never repeat)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def setup(self) -> float:
        """Start vLLM and load the tokenizer and reward; returns seconds taken."""
        t0 = time.perf_counter()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind or os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if self.visible_gpus:  # before anything in this process starts CUDA; vLLM's workers inherit it
            os.environ["CUDA_VISIBLE_DEVICES"] = self.visible_gpus
        from transformers import AutoTokenizer

        from shunter.actors.vllm.backend import VLLMBackend
        from shunter.actors.vllm.engine import EngineSpec
        from shunter.engine.models.tokenizer import HFTokenizer
        from shunter.engine.tasks.base import load_reward, load_task

        reward = load_reward(self.reward_spec) if self.reward_spec else load_task(self.task).reward
        tok = AutoTokenizer.from_pretrained(self.model_dir)
        backend = VLLMBackend(
            EngineSpec(
                model_dir=self.model_dir,
                seed=self.seed,
                max_model_len=self.max_model_len,
                gpu_memory_utilization=self.gpu_memory_utilization,
                enable_sleep_mode=self.enable_sleep_mode,
                stream_interval=self.stream_interval,
                weight_transfer=self.weight_transfer,
                tensor_parallel_size=self.tensor_parallel_size,
                extra=self.engine_args,
            )
        )
        await backend.start()
        self._loop = asyncio.get_running_loop()
        self._tok, self._reward, self._backend = HFTokenizer(tok), reward, backend
        self.core = self._new_core(backend)
        return time.perf_counter() - t0

    def _new_core(self, backend):
        """The replica's sample loop around ``backend``, serving ``self.version``."""
        from shunter.actors.reward_workers import PoolRewards
        from shunter.engine.data.environments import environment_name, load_environment
        from shunter.engine.replica.core import RolloutCore

        core = RolloutCore(
            self.replica_id,
            backend,
            self._tok,
            self._reward,
            Stamper(self.run_id, self.replica_id),
            mode=self.mode,
            reward_name=self.reward_spec or f"{self.task}.reward",
            seed=self.seed,
            version=self.version,
            max_model_len=self.max_model_len,
            weight_update=self.weight_update,  # type: ignore[arg-type]
            reward_timeout_s=self.reward_timeout_s,
            reward_threads=self.reward_threads,
            environment=load_environment(self.environment) if self.environment else None,
            env_name=environment_name(self.environment),
            max_turns=self.max_turns,
            env_timeout_s=self.env_timeout_s,
            env_thread=True,  # an async environment call that blocks holds its own loop, not vLLM's
            rewards=PoolRewards(self.reward_pool, timeout_s=self.reward_timeout_s) if self.reward_pool else None,
            progress_every_s=self.progress_every_s,
        )
        if self._req is not None:
            core.requests.ids = self._req
        return core

    SERVING = (
        "run_id",
        "replica_id",
        "reward",
        "task",
        "mode",
        "seed",
        "max_tokens",
        "weight_update",
        "import_paths",
        "reward_timeout_s",
        "reward_threads",
        "environment",
        "max_turns",
        "env_timeout_s",
        "progress_every_s",
    )
    """The settings a run gives its replica besides the engine's (``adopt``'s ``serving``)."""

    @ray.method(concurrency_group="control")
    async def adopt(self, version: int, model_dir: str, reward_pool: list, serving: dict | None = None) -> float:
        """A run takes this replica over instead of starting a new engine — a restarted attempt of
        its own run (``ReplicaLauncher.adopt_kept``) or a later run (``serving``: that run's settings, of
        ``SERVING``; a ``ReplicaPool``): every request still running is cut, the weights of
        ``model_dir`` (version ``version``: the checkpoint the attempt resumes from, or the run's
        model) are loaded into the running engine, and a fresh sample loop serves them, scoring
        with ``reward_pool``. Raises if the engine is dead or a load fails (the launcher then
        starts a new replica in its place); returns seconds taken."""
        t0 = time.perf_counter()
        await self._on_engine_loop(self._renew(version, model_dir, list(reward_pool), dict(serving or {})))
        return time.perf_counter() - t0

    @ray.method(concurrency_group="control")
    async def park(self) -> None:
        """Cut every running request and stop serving, keeping the engine (a ``ReplicaPool``
        holds the replica until a run adopts it)."""
        await self._on_engine_loop(self._stop_serving())

    async def _stop_serving(self) -> Any:
        """The engine of the sample loop, which is stopped: its requests cut, its rewards closed."""
        if self.core is None:
            if self._backend is None:
                raise RuntimeError(f"replica {self.replica_id} never started")
            return self._backend
        old, self.core = self.core, None  # nothing reaches the old loop from here on
        self._req = old.requests.ids  # request ids never repeat within one engine
        await old.shutdown()
        return old.backend

    async def _renew(self, version: int, model_dir: str, reward_pool: list, serving: dict) -> None:
        from pathlib import Path

        backend = await self._stop_serving()
        if backend.dead():
            raise RuntimeError(f"the vLLM engine of replica {self.replica_id} is dead")
        if getattr(backend, "paused", False):  # the attempt ended inside a keep-mode weight load
            await backend.resume()
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
        for f in files:  # one shard at a time: a shard is a whole safetensors state dict
            await backend.load_weights(f.read_bytes())
        if serving:
            self._serve_for(serving)
        label = getattr(backend, "label_version", None)
        if label is not None:  # where vLLM labels tokens (keep mode), the label names their version;
            await label(version if self.weight_update == "keep" else -1)  # else none: the core does
        self.version, self.reward_pool = version, reward_pool
        self.core = self._new_core(backend)

    def _serve_for(self, serving: dict) -> None:
        """Take a new run's settings (``adopt``)."""
        from shunter.engine.tasks.base import load_reward, load_task
        from shunter.policies.registry import use_import_paths

        if unknown := set(serving) - set(self.SERVING):
            raise TypeError(f"adopt() takes no serving setting {sorted(unknown)}")
        use_import_paths(serving.pop("import_paths", []))
        if "reward" in serving:
            self.reward_spec = serving.pop("reward")
        for k, v in serving.items():
            setattr(self, k, v)
        self._reward = load_reward(self.reward_spec) if self.reward_spec else load_task(self.task).reward

    @ray.method(concurrency_group="generate")
    async def generate(self, data: bytes) -> AsyncIterator[bytes]:
        """A streaming generator: the encoded events of each sample of the group as it ends."""
        cmd = decode_order(data)
        if not isinstance(cmd, Generate):
            raise TypeError(f"generate() takes rollout.generate, got {type(cmd).__name__}")
        async for events in self._stream_on_engine_loop(self.core.generate_stream(cmd)):
            yield encode_events(events)

    async def _stream_on_engine_loop(self, stream: AsyncIterator[list]) -> AsyncIterator[list]:
        """Iterate ``stream`` on the engine's loop, handing its items to this (the actor's) loop."""
        if asyncio.get_running_loop() is self._loop:
            async for item in stream:
                yield item
            return
        here, items = asyncio.get_running_loop(), asyncio.Queue()

        async def pump() -> None:
            try:
                async for item in stream:
                    here.call_soon_threadsafe(items.put_nowait, (item, None))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
                here.call_soon_threadsafe(items.put_nowait, (None, e))
                return
            here.call_soon_threadsafe(items.put_nowait, (None, None))

        fut = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                item, err = await items.get()
                if err is not None:
                    raise err
                if item is None:
                    return
                yield item
        finally:
            fut.cancel()  # the consumer went away: stop generating on the engine's loop

    @ray.method(concurrency_group="control")
    async def control(self, data: bytes, payload: bytes | None = None) -> bytes:
        cmd = decode_order(data)
        return encode_events(await self._on_engine_loop(self.core.handle(cmd, payload, max_tokens=self.max_tokens)))

    async def _on_engine_loop(self, coro):
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    @ray.method(concurrency_group="control")
    async def shutdown(self) -> None:
        if self.core is not None:
            await self._on_engine_loop(self.core.shutdown())
            await self._on_engine_loop(self.core.backend.shutdown())

    @ray.method(concurrency_group="watch")
    async def watch(self) -> None:
        """Never returns while the replica lives: the executor keeps one call open so that the
        death of this process is known at once, even while nothing else is asked of it (a
        replica asleep); raises ``EngineDead`` once its vLLM engine is dead — its core, or one of
        its tensor-parallel workers (vLLM's executor then ends the core) — checked every
        ``DEATH_POLL_S``, as a call waiting on the engine is."""
        from shunter.actors.vllm.engine import DEATH_POLL_S
        from shunter.engine.replica.backend import EngineDead

        while True:
            await asyncio.sleep(DEATH_POLL_S)
            backend = self._backend
            if backend is not None and backend.engine.async_llm is not None and backend.dead():
                raise EngineDead(f"the vLLM engine of replica {self.replica_id} died (its core or a worker process)")

    @ray.method(concurrency_group="control")
    async def where(self) -> dict:
        """Node and GPUs of this actor (``ComponentPlaced``)."""
        from shunter.actors.launch.placement import where

        return where()


def remote_class():
    return ray.remote(concurrency_groups={"control": 8, "generate": 100_000, "watch": 1})(RolloutWorker)
