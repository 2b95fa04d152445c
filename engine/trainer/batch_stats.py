"""The step metrics a trained batch gives, whatever trains it: ``batch/*`` (reward, length,
staleness and its histogram), the multi-turn ``env/*`` figures (``engine.data.turns``) and the
per-step reward failure counts ``reward/<failure>`` (the run summary's names).

Invariant: a pure function of the samples and the trainer's version — no torch — so the real
``Trainer`` and the test tier's fake trainer report the same keys computed the same way.
"""

from __future__ import annotations

import statistics
from typing import get_args

from shunter.engine.data import turns
from shunter.events import Sample
from shunter.events.vocab import RewardFailure

REWARD_FAILURES = [f for f in get_args(RewardFailure) if f]


def batch_metrics(samples: list[Sample], version: int) -> dict[str, float]:
    """The batch's figures; ``version``: the trainer's weights the batch trains (staleness is
    ``version - sample.min_version``)."""
    rewards = [s.reward for s in samples]
    stale = [version - s.min_version for s in samples]
    lens = [len(s.token_ids) for s in samples]
    out = {
        "batch/reward_mean": statistics.fmean(rewards),
        "batch/reward_std": statistics.stdev(rewards) if len(samples) > 1 else 0.0,
        "batch/response_len_mean": sum(lens) / len(lens),
        "batch/staleness_mean": sum(stale) / len(stale),
        "batch/staleness_max": float(max(stale)),
        "batch/multi_version_samples": float(sum(len(set(s.versions)) > 1 for s in samples)),
    }
    out.update(turns.batch_metrics(samples))
    for failure in REWARD_FAILURES:
        out[f"reward/{failure}"] = float(sum(s.reward_failure == failure for s in samples))
    for k in range(int(max(stale)) + 1):  # staleness histogram: samples per staleness
        out[f"batch/staleness_{k}"] = float(sum(x == k for x in stale))
    return out
