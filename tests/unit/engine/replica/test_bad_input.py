"""Issue 4, item 5 (the parts not covered by the codec and config suites): a prompt longer
than the context is refused before the engine sees it — the error names the prompt and
the sizes, its group is accounted as dropped (``failed``), the run goes on; if every
prompt is too long the run ends with that error instead of hanging."""

from __future__ import annotations

import asyncio

from shunter.events import CommandFailed, GroupDropped
from tests.support.configs import cfg
from tests.support.fakes import local_run, virtual_time


def _limit(coord, max_model_len: int) -> None:
    for core in coord.executor.replicas.values():
        core.max_model_len = max_model_len


@virtual_time
async def test_prompts_longer_than_the_context_are_refused_by_name_and_accounted():
    c = cfg(run={"total_steps": 4}, validation={"every": 0})
    coord, _, trainer = local_run(c)
    # sort_digits prompts are "<digits>>": with 12 response tokens, a context of 20 refuses the
    # 9-token ones (about a quarter)
    _limit(coord, 20)
    seen = []
    coord.sinks.append(seen.append)
    async with asyncio.timeout(20):
        ended = await coord.run()
    assert ended.reason == "completed", ended
    refused = [e for e in seen if isinstance(e, CommandFailed) and "rollout.max_model_len = 20" in e.error]
    assert refused and all(e.group_id >= 0 and "prompt " in e.error for e in refused)
    dropped = {e.group_id for e in seen if isinstance(e, GroupDropped) and e.reason == "failed"}
    assert dropped == {e.group_id for e in refused}
    assert all(len(s.prompt_token_ids) + 12 <= 20 for batch in trainer.seen for s in batch)
    k = coord.buffer.counters()
    assert k["dispatched"] == k["trained"] + k["dropped"] + k["in_flight"] + k["ready"]


@virtual_time
async def test_when_every_prompt_is_too_long_the_run_ends_with_the_cause():
    c = cfg(run={"total_steps": 4}, validation={"every": 0})
    coord, _, _ = local_run(c)
    _limit(coord, 8)
    async with asyncio.timeout(20):
        ended = await coord.run()
    assert ended.reason == "error" and "every generation fails" in ended.error
    assert "rollout.max_model_len = 8" in ended.error


def test_a_malformed_length_distribution_is_a_config_error_naming_the_field():
    import pytest

    from shunter.engine.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.length_dist.*lognormal:<median"):
        cfg(rollout={"length_dist": "pareto:3"})
