"""The examples a newcomer reads are executed here."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def over(tiny_model, tmp_path):
    return {
        "run": {"output_dir": str(tmp_path), "progress": False},
        "model": {"path": tiny_model, "build_tiny": ""},
        "validation": {"every": 0},
    }


async def test_custom_loop_with_its_own_loss(ray_cluster, tiny_model, tmp_path, pooled):
    from examples import custom_loop

    o = over(tiny_model, tmp_path)
    o["run"]["trainer_driver"] = "user"
    rewards = await custom_loop.main(steps=4, overrides=o)
    assert len(rewards) == 4 and all(0.0 <= r <= 1.0 for r in rewards)


async def test_custom_policy_from_outside_the_package(ray_cluster, tiny_model, tmp_path, pooled):
    from examples import custom_policy_run

    ended, switches = await custom_policy_run.main(steps=6, overrides=over(tiny_model, tmp_path))
    assert ended.reason == "completed"
    assert {(s.replica_id, s.mode) for s in switches} >= {("hybrid-1", "rollout"), ("hybrid-1", "trainer")}
