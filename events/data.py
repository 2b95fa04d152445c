"""Value types that ride inside events and commands.

Invariant: these are plain data (ints, floats, strings, lists) — never tensors, never
Ray object refs. Token ids, per-token log-probs and per-token policy versions of a sample
are the facts an RL step needs, so they travel inline; model weights travel by handle
(see ``WeightsReady.handle``).

For every sample: ``len(token_ids) == len(logprobs) == len(versions)``; ``versions[i]``
is the weight version that produced token ``i``, so a sample cut by a weight update and
resumed on new weights carries two versions. A multi-turn sample (an environment answered
between turns) also has ``len(loss_mask) == len(token_ids)``: 0 marks an observation token
(the environment's, kept for context, never trained on; its log-prob is 0.0 and its version is
that of the generated token before it, so ``min_version`` is the oldest *generated* token's).
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from shunter.events.vocab import FinishReason, RewardFailure


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of a chat prompt (a dataset row's ``prompt`` in verl's layout)."""

    role: str
    content: str


class PromptSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One prompt of the task or dataset. The rollout replica tokenizes it with its own
    tokenizer: ``messages`` through the tokenizer's chat template (with the generation
    prompt), else ``text`` as is."""

    prompt_id: int
    text: str = ""
    answer: str = ""
    """What the reward function compares against (a dataset row's ``reward_model.ground_truth``)."""
    messages: list[ChatMessage] = []
    """A chat prompt; when given, ``text`` is unused."""
    data_source: str = ""
    """Which reward rule applies (verl's ``data_source``; a task's prompts leave it empty)."""
    extra_info: dict[str, Any] = {}
    """A dataset row's ``extra_info``, handed to the reward function."""


class SamplingSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    ignore_eos: bool = False
    length_dist: str = ""
    """Benchmark knob: each new sample's token budget drawn from ``lognormal:<median>:<sigma>``
    (at most ``max_tokens``); empty: every sample may use ``max_tokens``."""


@functools.lru_cache(maxsize=16)  # read once per sample on the rollout's hot path
def parse_length_dist(spec: str) -> tuple[float, float] | None:
    """``"lognormal:<median>:<sigma>"`` -> (median, sigma); ``""`` -> None; else ValueError."""
    if not spec:
        return None
    parts = spec.split(":")
    try:
        if len(parts) != 3 or parts[0] != "lognormal":
            raise ValueError
        median, sigma = float(parts[1]), float(parts[2])
        if median <= 0 or sigma < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"length distribution {spec!r} is not 'lognormal:<median > 0>:<sigma >= 0>'") from None
    return median, sigma


def sample_id(group_id: int, k: int) -> str:
    """The id of the ``k``-th sample of prompt group ``group_id`` (``"12.3"``)."""
    return f"{group_id}.{k}"


def group_of(sample_id: str) -> int:
    """The prompt group a sample id belongs to (inverse of :func:`sample_id`)."""
    return int(sample_id.split(".", 1)[0])


class Turn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One environment step of a multi-turn sample: the model generated ``generated`` tokens
    ending in a tool call, the environment answered with ``observed`` tokens after ``env_s``
    seconds; ``version`` is the weight version of the call's last token."""

    generated: int
    observed: int
    env_s: float = 0.0
    version: int = 0
    reward: float = 0.0
    """The environment's own reward for this step (added to the sample's reward)."""


class Sample(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A finished (or partial) completion with everything the trainer needs."""

    sample_id: str
    group_id: int
    prompt_id: int
    prompt_token_ids: list[int]
    token_ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    finish_reason: FinishReason = ""
    max_tokens: int = 0
    """The sample's whole token budget; a resumed sample may only use what is left."""
    reward: float = 0.0
    reward_failure: RewardFailure = ""
    """Set when the reward call failed and the sample was scored 0.0 for it (a ``RewardFailed``
    event says why); counted per step as ``reward/<failure>``."""
    response_text: str = ""
    loss_mask: list[int] = []
    """Per token, 1: generated (trained on), 0: an environment's observation; empty: all 1."""
    turns: list[Turn] = []
    """The environment steps so far, in order (empty: a single-turn sample)."""
    metrics: dict[str, float] = {}
    """What the environment reported about this trajectory (``env/<name>`` in step metrics), and
    the engine's marks of its failed environment calls (``raised`` / ``returned`` / ``timeout``:
    1.0, counted per step as ``env/<failure>``)."""

    @property
    def min_version(self) -> int:
        return min(self.versions) if self.versions else -1

    @property
    def trained_tokens(self) -> int:
        """How many of the tokens the loss sees (all but observation tokens)."""
        return sum(self.loss_mask) if self.loss_mask else len(self.token_ids)

    @property
    def remaining_tokens(self) -> int:
        return max(0, self.max_tokens - len(self.token_ids))

    def check(self) -> None:
        """Raise ValueError if the per-token lists disagree or the budget is overrun."""
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"sample {self.sample_id}: {n} tokens but {len(self.logprobs)} logprobs "
                f"and {len(self.versions)} versions"
            )
        if self.loss_mask and len(self.loss_mask) != n:
            raise ValueError(f"sample {self.sample_id}: {n} tokens but {len(self.loss_mask)} loss-mask entries")
        if self.max_tokens and n > self.max_tokens:
            raise ValueError(f"sample {self.sample_id}: {n} tokens overrun its budget {self.max_tokens}")


class Batch(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One mini-batch: whole prompt groups taken out of the buffer for one optimizer step.

    ``Engine.next_batch()`` hands one to a user's loop; ``Engine.train(batch)`` trains it
    (once: a batch already trained is refused). ``samples`` may be replaced by the user
    (``msgspec.structs.replace(batch, samples=...)``) to train a filtered or re-scored set."""

    batch_id: int
    samples: list[Sample]
    group_ids: list[int] = []
    min_version: int = 0
    """Oldest weight version of any token in the batch."""
    max_staleness: int = 0
    """Trainer version when taken minus ``min_version``."""
