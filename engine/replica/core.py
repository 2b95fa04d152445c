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
  appended masked out of the loss (``engine.turns``) and generation goes on, within the
  sample's one token budget and ``max_turns`` steps; a cut inside any turn resumes like a
  single-turn one (its turns travel in the sample; on another replica a fresh environment is
  reset with the transcript so far); the environment's calls never block the replica's loop
  and never raise (``engine.environments``); each environment made is closed once, when its
  trajectory ends here (finished, failed or cut), before the sample's ``SampleEnd`` or
  ``SampleAborted``;
- each call returns the events it produced, in order, stamped by this replica; a group's
  generation (:meth:`generate_stream`) hands each sample's events over as that sample ends,
  so the coordinator frees its slot then, not when the group's slowest sample ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator

import msgspec

from shunter.engine.data.rewards import InlineRewards, Rewards, ThreadRewards
from shunter.engine.io.errors import describe
from shunter.engine.replica.backend import Backend, Tokenizer
from shunter.engine.replica.envs import Environments
from shunter.engine.replica.heartbeat import Heartbeat
from shunter.engine.replica.modes import E, Running, WeightsAndModes
from shunter.engine.replica.samples import Samples
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
    PromptSpec,
    RunValidation,
    Sample,
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


class RolloutCore(Samples, WeightsAndModes, Validation, Environments):
    """One replica's sample loop; one sample's turns, events and score are
    ``engine.replica_samples``', weight loads and mode switches ``engine.replica_modes``',
    validation ``engine.replica_validation``'s, environment calls ``engine.replica_envs``'."""

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
        ``actors.rewards.PoolRewards``). ``progress_every_s > 0``: a generation stream reports
        progress at least that often while it makes any (``engine.heartbeat``)."""
        self.progress_every_s = progress_every_s
        self._beats: set[Heartbeat] = set()  # the open generation streams' heartbeats
        self._init_envs(environment, env_name, env_timeout_s, max_turns, env_thread)
        self.replica_id = replica_id
        self.backend = backend
        self.tok = tokenizer
        self.reward_name = reward_name
        self.rewards: Rewards = rewards or (
            ThreadRewards(as_scorer(reward), timeout_s=reward_timeout_s, threads=reward_threads)
            if reward_timeout_s > 0
            else InlineRewards(as_scorer(reward))
        )
        self.stamp = stamp
        self.mode = mode
        self.version = version  # of the weights the backend starts with (a checkpoint's, on resume)
        self.max_model_len = max_model_len  # 0: not checked here
        self.seed = seed
        pause = getattr(backend, "pause", None)
        if weight_update == "keep" and not (callable(pause) and getattr(backend, "keeps_kv", True)):
            raise TypeError(
                f"rollout.weight_update = 'keep' needs a backend that can pause its requests with their KV "
                f"cache; {type(backend).__name__} cannot (use 'abort')"
            )
        self.weight_update = weight_update
        self._marks: dict[str, list[tuple[int, int]]] = {}  # request id -> (tokens made before, new version)
        self._open = asyncio.Event()
        self._open.set()
        self._running: dict[str, Running] = {}  # request id -> abort reason ("" while running)
        self._group_of: dict[str, int] = {}  # request id -> prompt group
        self._request_of: dict[str, str] = {}  # sample id -> its running request
        self._drained = asyncio.Event()
        self._drained.set()
        self._req = itertools.count()
        self._evicting = False
        self._pending_weights: tuple[int, bytes] | None = None
        self._stable = asyncio.Lock()  # held by a validation: no weight swap under it
        self._weights = asyncio.Lock()  # one weight load at a time, in arrival order (a group's bytes too)

    async def handle(self, cmd: Order, payload: bytes | None = None, *, max_tokens: int = 16) -> list[Event]:
        """Carry out one order addressed to this replica; returns the events it produced."""
        match cmd:
            case Generate():
                return await self.generate(cmd)
            case InstallWeights():
                return await self.load_weights(cmd.version, payload)
            case EnterRollout():
                return await self.switch_to_rollout(cmd.version, payload)
            case EnterTrainer():
                return await self.switch_to_trainer(cmd.sleep_level)
            case RunValidation():
                return await self.validate(cmd, max_tokens)
            case ShedGroups():
                return await self.shed(cmd.count)
            case CutSamples():
                return await self.cut_samples(cmd.sample_ids)
            case JoinWeightGroup():
                join = getattr(self.backend, "join_weight_group", None)
                if join is None:
                    raise TypeError(f"{type(self.backend).__name__} cannot join weight groups")
                dt = float(await join(cmd.backend, cmd.host, cmd.port, cmd.timeout_s))
                return [self._stamp(WeightGroupJoined(replica_id=self.replica_id, backend=cmd.backend, duration_s=dt))]
        raise TypeError(f"a rollout replica does not take {type(cmd).__name__}")

    # -- generation --------------------------------------------------------------------
    async def generate(self, cmd: Generate) -> list[Event]:
        """The events of the whole group, once its last sample ends (:meth:`generate_stream`
        hands them over sample by sample)."""
        return [e for evs in [x async for x in self.generate_stream(cmd)] for e in evs]

    def prompt_ids(self, p: PromptSpec) -> list[int]:
        """A prompt's token ids: a chat prompt through the tokenizer's chat template (with the
        generation prompt), a plain one as its text."""
        if not p.messages:
            return self.tok.encode(p.text)
        render = getattr(self.tok, "render", None)
        if render is None:
            raise TypeError(f"the tokenizer {type(self.tok).__name__} renders no chat prompts")
        ids: list[int] = render(p.messages)
        return ids

    def _refuse(self, cmd: Generate, why: str) -> CommandFailed:
        return self._stamp(
            CommandFailed(command_kind=tag_of(cmd), target=self.replica_id, group_id=cmd.group_id, error=why)
        )

    async def generate_stream(self, cmd: Generate) -> AsyncIterator[list[Event]]:
        """Generate a group's samples (or resume its partials); yield each sample's events as
        that sample ends (a failure: one ``CommandFailed`` per order, the first)."""
        try:
            prompt_ids = self.prompt_ids(cmd.prompt)
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
        self._beats.add(beat)
        tasks = [asyncio.ensure_future(self._run(s, cmd.prompt, cmd.sampling, beat)) for s in samples]
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
            self._beats.discard(beat)
            beat.close()
            for t in tasks:
                t.cancel()

    def _stamp(self, e: E) -> E:
        return self.stamp(e)

    def _wall(self) -> float:
        return self.stamp.clock()

    @contextlib.contextmanager
    def _streams_wait(self) -> Iterator[None]:
        """Every open stream's samples wait on this (a weight load): they beat meanwhile."""
        beats = list(self._beats)
        for b in beats:
            b.wait_begins()
        try:
            yield
        finally:
            for b in beats:
                b.wait_ends()

    async def _cut(self, reason: Running) -> int:
        """Abort every running request with ``reason`` and wait until all have returned."""
        ids = [rid for rid, r in self._running.items() if not r]
        for rid in ids:
            self._running[rid] = reason
        if ids:
            await self.backend.abort(ids)
        await self._drained.wait()
        return len(ids)

    async def shed(self, count: int) -> list[Event]:
        """Cut whole prompt groups, most recently started first, until ``count`` running
        samples are cut; their partials come back through their own ``generate`` calls."""
        groups: dict[int, list[str]] = {}
        for rid, reason in self._running.items():
            if not reason:
                groups.setdefault(self._group_of.get(rid, -1), []).append(rid)
        cut: list[str] = []
        for gid in sorted(groups, reverse=True):
            if len(cut) >= count:
                break
            cut += groups[gid]
        for rid in cut:
            self._running[rid] = "rebalanced"
        if cut:
            await self.backend.abort(cut)
        return []

    async def cut_samples(self, sample_ids: list[str]) -> list[Event]:
        """Cut the named samples (those still running here); their partials come back through
        their own ``generate`` calls as ``SampleAborted(reason="rebalanced")``."""
        cut = [
            rid for sid in sample_ids if (rid := self._request_of.get(sid)) is not None and not self._running.get(rid)
        ]
        for rid in cut:
            self._running[rid] = "rebalanced"
        if cut:
            await self.backend.abort(cut)
        return []

    async def shutdown(self) -> list[Event]:
        self._evicting = True
        await self._cut("shutdown")
        await self._envs_done()
        self.rewards.close()
        self._close_env_loop()
        return []
