"""``SampleRunner``: one sample on a replica — its turns of generation (and environment
steps) to its end or its cut, its events (``SampleBegin`` / ``SampleResumed`` /
``SampleAborted`` / ``SampleEnd``), and its score; and a prompt's token ids. ``RolloutCore``
holds it and runs each sample of a group's generation on it; its validation runs held-out
multi-turn prompts on it. It is given the replica's id, backend, tokenizer, rewards (and the
reward's name) and stamper, the serving state it reads (``serving.Serving``), the table it adds
each request to (``running.RunningRequests``), the environments (``envs.Environments``) and
``max_turns``.

Invariants:

- every token carries the weight version that produced it (``_versions``: a request whose
  weights were swapped in place is split at the swap's marks);
- a sample cut here leaves whole: ``SampleAborted.partial`` holds every token it made (a cut
  for a weight load resumes here, as ``SampleResumed``, within the one budget);
- the environment a trajectory made here is closed before the sample's ``SampleEnd`` or
  ``SampleAborted``, even when its task is cancelled;
- a sample is scored off the replica's loop; the stream beats while it waits for the reward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

import msgspec

from shunter.engine.data import turns
from shunter.engine.data.environments import EnvCalls
from shunter.engine.data.rewards import Rewards
from shunter.engine.replica.backend import Backend, GenParams, Tokenizer
from shunter.engine.replica.envs import Environments
from shunter.engine.replica.heartbeat import Heartbeat
from shunter.engine.replica.running import RunningRequests
from shunter.engine.replica.serving import Serving
from shunter.events import (
    Event,
    PromptSpec,
    RewardFailed,
    RewardWorkerLost,
    Sample,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    SamplingSpec,
    Stamper,
)
from shunter.events.vocab import ROLLOUT, AbortReason


class SampleRunner:
    def __init__(
        self,
        replica_id: str,
        backend: Backend,
        tokenizer: Tokenizer,
        rewards: Rewards,
        reward_name: str,
        stamp: Stamper,
        serving: Serving,
        requests: RunningRequests,
        envs: Environments,
        max_turns: int,
    ) -> None:
        self.replica_id = replica_id
        self.backend = backend
        self.tok = tokenizer
        self.rewards = rewards
        self.reward_name = reward_name
        self.stamp = stamp
        self.serving = serving
        self.requests = requests
        self.envs = envs
        self.max_turns = max_turns

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

    async def run(self, s: Sample, prompt: PromptSpec, sp: SamplingSpec, beat: Heartbeat | None = None) -> list[Event]:
        """One sample on this replica, to its end or its cut; ``beat`` (its stream's) hears of
        each environment call, each turn generated and the wait for the reward (``engine.replica.heartbeat``)."""
        beat = beat or Heartbeat(0.0, _still)
        progressed = beat.progressed
        ev: list[Event] = []
        env: EnvCalls | None = None
        if self.envs.environment is not None:
            s, env = await self.envs.env_for(s, prompt, ev, progressed)
            progressed()
        try:
            s, cut = await self._turns(s, sp, env, ev, progressed)
        except (Exception, asyncio.CancelledError):  # cancelled (the caller went away) or failed
            if env is not None:
                await self.envs.close_env(env, s, [])  # closed all the same; nobody reads these events
            raise
        if env is not None:
            s = await self.envs.close_env(env, s, ev)
            progressed()
        if cut is not None:
            ev.append(self._aborted(s, cut, partial=True))
            return ev
        if s.finish_reason == "abort":
            s = msgspec.structs.replace(s, finish_reason="length")
        return ev + await self._finish(s, prompt, beat)

    async def _turns(
        self,
        s: Sample,
        sp: SamplingSpec,
        env: EnvCalls | None,
        ev: list[Event],
        progressed: Callable[[], None],
    ) -> tuple[Sample, AbortReason | None]:
        """Generate (and step the environment) until the sample ends here; returns it and, when it
        must leave this replica unfinished, why."""
        announce: Literal["begin", "resumed", ""] = "resumed" if s.token_ids else "begin"
        while True:
            await self.serving.open.wait()
            if self.serving.evicting or self.serving.mode != ROLLOUT:
                return s, "reclaimed"
            rid = f"{self.replica_id}-{next(self.requests.ids)}"
            self.requests.add(rid, s.group_id, s.sample_id)
            if announce:
                ev.append(self._announce(s, announce))
            announce = ""
            version = self.serving.version
            stop = env.stop if env is not None and len(s.turns) < self.max_turns else ()
            try:
                res = await self.backend.generate(rid, s.prompt_token_ids + s.token_ids, self._params(sp, s, stop))
            finally:
                reason, marks = self.requests.remove(rid, s.sample_id)
            progressed()
            if res.marks is not None:
                marks = res.marks
            s = turns.add_generated(
                s,
                res.token_ids,
                res.logprobs,
                _versions(version, marks, len(res.token_ids)),
                res.finish_reason,
                masked=env is not None or bool(s.loss_mask),
            )
            if res.finish_reason == "abort" and s.remaining_tokens > 0:
                if reason == "weights_update":
                    ev.append(self._aborted(s, reason, partial=False))
                    announce = "resumed"
                    continue
                return s, reason or "reclaimed"
            ended = s.token_ids[-1:] == [self.tok.eos_token_id]  # the model's own end: no tool call
            if (
                env is None
                or not stop
                or ended
                or not s.remaining_tokens
                or not turns.ends_with_call(s, self.tok.decode, stop)
            ):
                break
            s, more = await self.envs.step(env, s, ev)
            progressed()
            if not more:
                break
        return s, None

    def _announce(self, s: Sample, how: Literal["begin", "resumed"]) -> Event:
        if how == "begin":
            return self.stamp(
                SampleBegin(
                    sample_id=s.sample_id, group_id=s.group_id, replica_id=self.replica_id, version=self.serving.version
                )
            )
        return self.stamp(
            SampleResumed(
                sample_id=s.sample_id,
                group_id=s.group_id,
                replica_id=self.replica_id,
                prefix_len=len(s.token_ids),
                remaining_tokens=s.remaining_tokens,
                version=self.serving.version,
                turn=len(s.turns),
            )
        )

    def _params(self, sp: SamplingSpec, s: Sample, stop: tuple[str, ...] = ()) -> GenParams:
        return GenParams(
            stop=stop,
            max_tokens=s.remaining_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k,
            ignore_eos=sp.ignore_eos,
            stop_token_ids=(self.tok.eos_token_id,),
        )

    async def _finish(self, s: Sample, prompt: PromptSpec, beat: Heartbeat) -> list[Event]:
        ids = s.token_ids[:-1] if s.token_ids and s.token_ids[-1] == self.tok.eos_token_id else s.token_ids
        text = self.tok.decode(ids)  # eos can only end a sample (it is the stop token)
        # off this loop, bounded (engine.data.rewards), but it may outlast rollout.generate_timeout_s: beat meanwhile
        beat.wait_begins()  # off this loop, bounded (engine.data.rewards): the stream beats meanwhile
        try:
            scored = await self.rewards.score(prompt, text)
        finally:
            beat.wait_ends()
        s = msgspec.structs.replace(
            s, reward=scored.reward + turns.env_reward(s), response_text=text, reward_failure=scored.failure
        )
        out: list[Event] = [
            self.stamp(
                RewardWorkerLost(
                    replica_id=self.replica_id, worker=w, loss=loss, error=error, user_code=self.reward_name
                )
            )
            for w, loss, error in self.rewards.losses()
        ]
        if scored.failure:
            out.append(
                self.stamp(
                    RewardFailed(
                        replica_id=self.replica_id,
                        sample_id=s.sample_id,
                        group_id=s.group_id,
                        failure=scored.failure,
                        error=f"reward function {self.reward_name} {scored.error}",
                        user_code=self.reward_name,
                    )
                )
            )
        out.append(self.stamp(SampleEnd(replica_id=self.replica_id, sample=s)))
        return out

    def _aborted(self, s: Sample, reason: AbortReason, *, partial: bool) -> SampleAborted:
        return self.stamp(
            SampleAborted(
                sample_id=s.sample_id,
                group_id=s.group_id,
                replica_id=self.replica_id,
                reason=reason,
                tokens=len(s.token_ids),
                partial=s if partial else None,
            )
        )


def _still() -> None:
    """No stream to tell (a validation's samples)."""


def _versions(start: int, marks: list[tuple[int, int]], n: int) -> list[int]:
    """The version of each of ``n`` tokens of one request that began on ``start`` and had its
    weights swapped in place after ``made`` tokens for every ``(made, version)`` mark."""
    out: list[int] = []
    v = start
    for made, new in marks:
        out += [v] * (min(made, n) - len(out))
        v = new
    return out + [v] * (n - len(out))
