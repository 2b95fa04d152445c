"""``RolloutCore``: one replica's sample loop — generate, cut, resume, load, switch.

Invariants:

- every token of a sample carries the weight version that produced it: a weight load
  (``weight_update = "abort"``) first aborts every running request and waits for them to hand
  back their prefix, then swaps weights, then lets them resume (prompt + prefix, only the
  remaining budget) — so a request never mixes two versions and a resumed sample never
  overruns its budget; with ``"keep"`` (a backend that can ``pause``) the running requests
  are paused with their KV cache, the backend says how many tokens each has made, the weights
  are swapped and the requests go on: the tokens after that count get the new version;
- a sample that must leave the replica (``SwitchToTrainer``, shutdown) is returned whole
  as ``SampleAborted.partial``; nothing generated is dropped;
- a multi-turn sample (an ``environment`` is set) generates until a tool call (one of the
  environment's ``stop`` strings) or its end, the environment answers, its observation is
  appended masked out of the loss (``engine.data.turns``) and generation goes on, within the
  sample's one token budget and ``max_turns`` steps; a cut inside any turn resumes like a
  single-turn one (its turns travel in the sample; on another replica a fresh environment is
  reset with the transcript so far); the environment's calls never block the replica's loop
  and never raise (``engine.data.environments``); each environment made is closed once, when its
  trajectory ends here (finished, failed or cut), before the sample's ``SampleEnd`` or
  ``SampleAborted``;
- each call returns the events it produced, in order, stamped by this replica; a group's
  generation (:meth:`generate_stream`) hands each sample's events over as that sample ends,
  so the coordinator frees its slot then, not when the group's slowest sample ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import msgspec

from shunter.engine.data.rewards import InlineRewards, Rewards, ThreadRewards
from shunter.engine.io.errors import describe
from shunter.engine.replica import lengths
from shunter.engine.replica.backend import Backend, Tokenizer
from shunter.engine.replica.envs import Environments
from shunter.engine.replica.heartbeat import Heartbeat, OpenStreams
from shunter.engine.replica.modes import WeightsAndModes
from shunter.engine.replica.running import RunningRequests
from shunter.engine.replica.samples import SampleRunner
from shunter.engine.replica.serving import Serving
from shunter.engine.replica.validation import Validation
from shunter.engine.tasks.base import as_scorer
from shunter.events import (
    CommandFailed,
    CutSamples,
    EnterRollout,
    EnterTrainer,
    Event,
    Generate,
    InstallWeights,
    JoinWeightGroup,
    Order,
    RunValidation,
    Sample,
    SamplingSpec,
    ShedGroups,
    Stamper,
    WeightGroupJoined,
    sample_id,
    tag_of,
)
from shunter.events.vocab import ROLLOUT, ServingMode, WeightUpdate

Reward = Callable[..., object]
"""A task's ``(prompt, response, answer)`` or verl's ``(data_source, solution_str, ground_truth,
extra_info)``, returning a float (or verl's dict with ``"score"``): see ``shunter.engine.tasks.as_scorer``."""


class RolloutCore:
    """One replica's sample loop: it takes the replica's orders and streams a group's generation;
    one sample's turns, events and score are its ``samples`` (``engine.replica.samples``), weight
    loads and mode switches its ``weights`` (``engine.replica.modes``), validation its
    ``validation`` (``engine.replica.validation``), environment calls its ``envs``
    (``engine.replica.envs``); the requests running here are its ``requests``
    (``engine.replica.running``), what it serves its ``serving`` (``engine.replica.serving``)."""

    def __init__(
        self,
        replica_id: str,
        backend: Backend,
        tokenizer: Tokenizer,
        reward: Reward,
        stamp: Stamper,
        *,
        mode: ServingMode = ROLLOUT,
        reward_name: str = "reward",
        seed: int = 0,
        version: int = 0,
        max_model_len: int = 0,
        weight_update: WeightUpdate = "abort",
        reward_timeout_s: float = 0.0,
        reward_threads: int = 4,
        environment: Callable[[], object] | None = None,
        env_name: str = "",
        env_timeout_s: float = 30.0,
        max_turns: int = 4,
        env_thread: bool = False,
        rewards: Rewards | None = None,
        progress_every_s: float = 0.0,
    ) -> None:
        """``reward_timeout_s > 0``: rewards run in ``reward_threads`` worker threads, each call
        bounded; 0: on this loop, unbounded (in-process fakes and the simulator).
        ``environment``: the class made per trajectory for multi-turn samples (at most
        ``max_turns`` environment steps each, each bounded by ``env_timeout_s``); ``env_thread``:
        its ``async`` calls run on a loop of their own (``environments.EnvLoop``), so one that
        blocks never holds this replica's loop (real replicas; not under a virtual clock).
        ``rewards``: where the samples are scored instead (the run's reward workers,
        ``actors.reward_workers.PoolRewards``). ``progress_every_s > 0``: a generation stream reports
        progress at least that often while it makes any (``engine.replica.heartbeat``)."""
        self.progress_every_s = progress_every_s
        self.streams = OpenStreams()  # the open generation streams' heartbeats
        self.serving = Serving(mode, version)
        self.envs = Environments(
            replica_id, tokenizer, stamp, self.serving, environment, env_name, env_timeout_s, env_thread
        )
        self.replica_id = replica_id
        self.backend = backend
        self.rewards: Rewards = rewards or (
            ThreadRewards(as_scorer(reward), timeout_s=reward_timeout_s, threads=reward_threads)
            if reward_timeout_s > 0
            else InlineRewards(as_scorer(reward))
        )
        self.stamp = stamp
        self.max_model_len = max_model_len  # 0: not checked here
        self.seed = seed
        self.requests = RunningRequests(backend)
        self.weights = WeightsAndModes(
            replica_id, backend, stamp, weight_update, self.serving, self.requests, self.streams
        )
        self.samples = SampleRunner(
            replica_id,
            backend,
            tokenizer,
            self.rewards,
            reward_name,
            stamp,
            self.serving,
            self.requests,
            self.envs,
            max_turns,
        )
        self.validation = Validation(
            replica_id,
            backend,
            tokenizer,
            self.rewards,
            reward_name,
            stamp,
            self.serving,
            self.requests,
            self.samples,
            self.envs,
        )

    @property
    def version(self) -> int:
        """The version of the weights the backend holds."""
        return self.serving.version

    @property
    def mode(self) -> ServingMode:
        return self.serving.mode

    async def handle(self, cmd: Order, payload: bytes | None = None, *, max_tokens: int = 16) -> list[Event]:
        """Carry out one order addressed to this replica; returns the events it produced."""
        match cmd:
            case Generate():
                return await self.generate(cmd)
            case InstallWeights():
                return await self.weights.load_weights(cmd.version, payload)
            case EnterRollout():
                return await self.weights.switch_to_rollout(cmd.version, payload)
            case EnterTrainer():
                return await self.weights.switch_to_trainer(cmd.sleep_level)
            case RunValidation():
                return await self.validation.validate(cmd, max_tokens)
            case ShedGroups():
                return await self.shed(cmd.count)
            case CutSamples():
                return await self.cut_samples(cmd.sample_ids)
            case JoinWeightGroup():
                join = getattr(self.backend, "join_weight_group", None)
                if join is None:
                    raise TypeError(f"{type(self.backend).__name__} cannot join weight groups")
                dt = float(await join(cmd.backend, cmd.host, cmd.port, cmd.timeout_s))
                return [self.stamp(WeightGroupJoined(replica_id=self.replica_id, backend=cmd.backend, duration_s=dt))]
        raise TypeError(f"a rollout replica does not take {type(cmd).__name__}")

    # -- generation --------------------------------------------------------------------
    async def generate(self, cmd: Generate) -> list[Event]:
        """The events of the whole group, once its last sample ends (:meth:`generate_stream`
        hands them over sample by sample)."""
        return [e for evs in [x async for x in self.generate_stream(cmd)] for e in evs]

    def _refuse(self, cmd: Generate, why: str) -> CommandFailed:
        return self.stamp(
            CommandFailed(command_kind=tag_of(cmd), target=self.replica_id, group_id=cmd.group_id, error=why)
        )

    async def generate_stream(self, cmd: Generate) -> AsyncIterator[list[Event]]:
        """Generate a group's samples (or resume its partials); yield each sample's events as
        that sample ends (a failure: one ``CommandFailed`` per order, the first)."""
        try:
            prompt_ids = self.samples.prompt_ids(cmd.prompt)
        except Exception as e:  # noqa: BLE001 - a chat prompt the tokenizer cannot render: the group is dropped
            yield [self._refuse(cmd, f"prompt {cmd.prompt.prompt_id} cannot be tokenized: {describe(e, limit=300)}")]
            return
        need = len(prompt_ids) + cmd.sampling.max_tokens
        if self.max_model_len and need > self.max_model_len:  # refuse before vLLM sees it; the group is dropped
            yield [
                self._refuse(
                    cmd,
                    f"prompt {cmd.prompt.prompt_id} is {len(prompt_ids)} tokens; with rollout.max_tokens = "
                    f"{cmd.sampling.max_tokens} it needs {need} > rollout.max_model_len = {self.max_model_len}",
                )
            ]
            return
        if cmd.resume:
            samples = [
                s if s.prompt_token_ids else msgspec.structs.replace(s, prompt_token_ids=prompt_ids) for s in cmd.resume
            ]
        else:
            samples = [
                Sample(
                    sample_id=sample_id(cmd.group_id, k),
                    group_id=cmd.group_id,
                    prompt_id=cmd.prompt.prompt_id,
                    prompt_token_ids=prompt_ids,
                    max_tokens=self._budget(cmd.sampling, sample_id(cmd.group_id, k)),
                )
                for k in range(cmd.n)
            ]
        ends: asyncio.Queue[asyncio.Future[list[Event]] | None] = asyncio.Queue()  # None: a beat
        beat = Heartbeat(self.progress_every_s, lambda: ends.put_nowait(None))
        self.streams.add(beat)
        tasks = [asyncio.ensure_future(self.samples.run(s, cmd.prompt, cmd.sampling, beat)) for s in samples]
        for t in tasks:
            t.add_done_callback(ends.put_nowait)
        failed, left = False, len(tasks)
        try:
            while left:
                done = await ends.get()
                if done is None:  # progress, no sample ended: tell the executor this replica is not hung
                    beat.sent()
                    yield []
                    continue
                left -= 1
                events = done.result()
                out = [e for e in events if not isinstance(e, CommandFailed)]
                if not failed and len(out) < len(events):
                    failed = True
                    out.append(next(e for e in events if isinstance(e, CommandFailed)))
                beat.sent()
                yield out
        finally:  # the caller went away (its replica is cut off, say): nothing keeps generating
            self.streams.discard(beat)
            beat.close()
            for t in tasks:
                t.cancel()

    def _budget(self, sp: SamplingSpec, sample_id: str) -> int:
        """A new sample's token budget: ``max_tokens``, or a draw from ``length_dist``
        (``engine.replica.lengths``: seeded by this replica's seed and the sample id)."""
        return lengths.budget(sp.length_dist, self.seed, sample_id, sp.max_tokens)

    # -- orders the parts carry out ----------------------------------------------------
    async def load_weights(self, version: int, blob: bytes | None) -> list[Event]:
        return await self.weights.load_weights(version, blob)

    async def switch_to_trainer(self, sleep_level: int) -> list[Event]:
        return await self.weights.switch_to_trainer(sleep_level)

    async def switch_to_rollout(self, version: int, blob: bytes | None) -> list[Event]:
        return await self.weights.switch_to_rollout(version, blob)

    async def shed(self, count: int) -> list[Event]:
        """Cut whole prompt groups, most recently started first, until ``count`` running
        samples are cut; their partials come back through their own ``generate`` calls."""
        await self.requests.shed(count)
        return []

    async def cut_samples(self, sample_ids: list[str]) -> list[Event]:
        """Cut the named samples (those still running here); their partials come back through
        their own ``generate`` calls as ``SampleAborted(reason="rebalanced")``."""
        await self.requests.cut_samples(sample_ids)
        return []

    async def shutdown(self) -> list[Event]:
        self.serving.evicting = True
        await self.requests.cut("shutdown")
        await self.envs.wait_closed()
        self.rewards.close()
        self.envs.close_loop()
        return []
