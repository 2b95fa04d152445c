"""Simulated rollout and trainer backends, spending the times of a stated cost model
(``shunter.bench.sim.cost_model``): ``SimBackend`` (a replica), ``SimTrainer`` (the trainer core),
``SimTokenizer`` and ``sim_reward``.

Invariants: the simulator implements exactly the interfaces the real components do — a
replica is a ``shunter.engine.replica.backend.Backend`` behind the real ``RolloutCore``, the trainer
a core behind the real ``TrainerHost`` — so the coordinator, policies, buffer, dispatcher
and rank table run unchanged while generation, training, weight sync and switches spend
simulated time on the running loop's clock (virtual under ``looptime``). Every random draw
comes from generators seeded by the scenario, so a scenario replays identically — all but
``policy.slow``, which reports the host's real time spent in ``decide()`` (a diagnostic of
the machine, not of the simulated run).

A replica is ``shunter.bench.sim.replica_model.ReplicaModel``: continuous batching as vLLM V1
schedules it — decode steps whose time grows with the batch and with the context every
sequence attends to, chunked prefill as the replica's own work (a resumed sample re-prefills
its prompt and prefix), a finite KV cache with admission and recompute preemption, and a
pause that keeps the KV cache (``pause`` / ``resume``: a weight update in place). Response
lengths are the cost model's (``LengthSampler``). The first generated token carries the sample's target length,
so a sample cut by a weight update and resumed elsewhere keeps its length.

Multi-turn trajectories (``tool_calls_max > 0``; ``shunter.bench.sim.turns``): the first
token carries a key from which the whole trajectory follows (its turns' lengths, each but the
last ending in a tool call), so a trajectory moved to another replica goes on as it would have;
a simulated tool (``SimTool``) answers each call after a long-tailed latency with
``observation_tokens`` tokens. A turn is a request of its own, so a trajectory waiting on its
tool holds no place in the replica's batch (as vLLM's does not); each turn prefills its whole
context again (no prefix cache is modelled).

The trainer (``SimTrainer``) spends the cost model's step, publish and offload times
(``shunter.bench.sim.cost_model.CostModel``, where each term is stated); a replica applies weights
in ``load_s``, sleeps in ``sleep_s``, wakes in ``wake_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from shunter.bench.sim import turns as sim_turns
from shunter.bench.sim.cost_model import CostModel, LengthSampler
from shunter.bench.sim.replica_model import ReplicaModel
from shunter.bench.sim.turns import CALL, EOS, FILL, OBS
from shunter.engine.replica.backend import GenParams, GenResult
from shunter.events import Sample


@dataclass
class _Req:
    first: int  # the length token (first token of the sample; a multi-turn trajectory's key)
    has_prefix: bool
    natural_end: bool  # the turn ends (EOS or a tool call) within this request's budget
    fut: asyncio.Future
    last: int = EOS  # the token a natural end ends with (CALL: a tool call)


@dataclass
class SimBackend:
    """One simulated replica: the asyncio shell around a ``ReplicaModel``."""

    cost: CostModel
    seed: int = 0
    sleeping: bool = False
    lengths: LengthSampler = field(init=False)
    model: ReplicaModel = field(init=False)
    _reqs: dict[str, _Req] = field(default_factory=dict, init=False)
    _timer: asyncio.TimerHandle | None = field(default=None, init=False)
    tokens_out: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.lengths = self.cost.lengths(self.seed)
        self.model = ReplicaModel(self.cost)
        self.plans = sim_turns.Plans(self.cost, self.lengths) if self.cost.tool_calls_max else None

    async def start(self) -> None:
        pass

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: GenParams) -> GenResult:
        if self.sleeping:
            raise RuntimeError("generate on a sleeping simulated replica")
        loop = asyncio.get_running_loop()
        prefix = prompt_token_ids[self.cost.prompt_tokens :]
        last = EOS
        if self.plans is not None:
            first, left, call = self.plans.next_turn(prefix, bool(params.stop))
            last = CALL if call else EOS
        else:
            first = prefix[0] if prefix else self.lengths.draw()
            left = max(0, first - len(prefix))
        target = min(left, params.max_tokens)
        if target == 0:
            return GenResult([], [], "length")
        req = _Req(first, bool(prefix), target == left, loop.create_future(), last)
        self._reqs[request_id] = req
        self._finish(self.model.advance_to(loop.time()))
        self._finish(self.model.submit(request_id, len(prompt_token_ids), target))
        self._rearm(loop)
        return await req.fut

    def _rearm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        dt = self.model.next_event_in()
        if dt is not None:
            self._timer = loop.call_at(self.model.t + dt, self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = None
        self._finish(self.model.advance_to(loop.time()))
        self._rearm(loop)

    def _finish(self, done: list[tuple[str, int]]) -> None:
        for rid, n in done:
            r = self._reqs.get(rid)
            self._resolve(rid, n, "stop" if r is not None and r.natural_end else "length")

    def _resolve(self, rid: str, n: int, reason: str) -> None:
        r = self._reqs.pop(rid, None)
        if r is None or r.fut.done():
            return
        toks = [FILL] * n
        if n and not r.has_prefix:
            toks[0] = r.first
        if reason == "stop" and n:
            toks[-1] = r.last
        self.tokens_out += n
        r.fut.set_result(GenResult(toks, [-1.0] * n, reason))

    async def abort(self, request_ids: list[str]) -> None:
        loop = asyncio.get_running_loop()
        self._finish(self.model.advance_to(loop.time()))
        for rid in request_ids:
            n = self.model.remove(rid)
            if n is not None:
                self._resolve(rid, n, "abort")
        self._rearm(loop)

    async def pause(self) -> dict[str, int]:
        """Stop every request where it is, KV cache kept; the tokens each produced so far."""
        loop = asyncio.get_running_loop()
        self._finish(self.model.freeze(loop.time()))
        self._rearm(loop)
        return {rid: self.model.made(rid) for rid in self._reqs}

    async def resume(self, version: int = -1) -> None:
        loop = asyncio.get_running_loop()
        self.model.thaw(loop.time())
        self._rearm(loop)

    async def load_weights(self, blob: bytes) -> float:
        await asyncio.sleep(self.cost.load_s)
        return self.cost.load_s

    async def sleep(self, level: int = 1) -> None:
        await self.abort(list(self._reqs))
        await asyncio.sleep(self.cost.sleep_s)
        self.sleeping = True

    async def wake_up(self) -> None:
        await asyncio.sleep(self.cost.wake_s)
        self.sleeping = False

    async def shutdown(self) -> None:
        await self.abort(list(self._reqs))


class SimTokenizer:
    """Every prompt is ``prompt_tokens`` ids; text is not modelled. With ``turns``, text
    spells each token (``sim_turns.spell``) and an observation of ``n`` tokens is ``n``
    characters ``~``."""

    eos_token_id = EOS

    def __init__(self, prompt_tokens: int, *, turns: bool = False) -> None:
        self.prompt_tokens = prompt_tokens
        self.turns = turns

    def encode(self, text: str) -> list[int]:
        if self.turns and text and not text.strip(sim_turns.OBS_TEXT):
            return [OBS] * len(text)
        return [FILL] * self.prompt_tokens

    def decode(self, ids: list[int]) -> str:
        return sim_turns.spell(ids) if self.turns else str(len(ids))


def sim_reward(prompt: str, response: str, answer: str) -> float:
    """A deterministic pseudo-reward in [0, 1] (throughput studies only)."""
    h = hashlib.blake2b(f"{prompt}|{response}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "big") / 2**32


class SimTrainer:
    """The trainer core with simulated step, publish and offload times."""

    def __init__(self, cost: CostModel, replicas: int = 0, relays: int = 0) -> None:
        self.cost = cost
        self.replicas = replicas
        """Replicas the weights go to (what a per-replica transport costs the trainer)."""
        self.relays = relays
        """Hosts' relays the trainer hands each version to."""
        self.step = 0
        self.version = 0
        self.published_nbytes = int(cost.weight_bytes)

    async def train_step(self, samples: list[Sample], loss_fn: str = "") -> dict[str, float]:
        tokens = sum(len(s.prompt_token_ids) + len(s.token_ids) for s in samples)
        await asyncio.sleep(self.cost.train_s(tokens))
        self.step += 1
        stale = [self.version - s.min_version for s in samples]
        return {
            "trainer/tokens": float(tokens),
            "batch/reward_mean": sum(s.reward for s in samples) / len(samples),
            "batch/response_len_mean": sum(len(s.token_ids) for s in samples) / len(samples),
            "batch/staleness_mean": sum(stale) / len(stale),
            "batch/staleness_max": float(max(stale)),
        }

    async def publish(self) -> bytes:
        await asyncio.sleep(self.cost.publish_s(self.replicas, self.relays))
        self.version += 1
        return b"sim-weights"

    async def offload(self, parts: list[str]) -> int:
        await asyncio.sleep(self.cost.offload_s)
        return 0

    def save(self, path: str) -> int:
        """The trainer's checkpoint part: its step and version (a simulated run has no weights)."""
        import json

        data = json.dumps({"step": self.step, "version": self.version}).encode()
        (Path(path) / "trainer.json").write_bytes(data)
        return len(data)

    def load(self, path: str) -> None:
        import json

        st = json.loads((Path(path) / "trainer.json").read_text())
        self.step, self.version = int(st["step"]), int(st["version"])

    async def onload(self, parts: list[str]) -> int:
        await asyncio.sleep(self.cost.offload_s)
        return 0
