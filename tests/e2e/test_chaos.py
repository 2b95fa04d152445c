"""The operator chaos soak, short (issue 14): one real ``shunter run`` gets ``kill -9`` on its
vLLM engine process and on its coordinator, then SIGTERM (a scheduler's preemption: exit status
143 at a sync boundary, saying how to resume, no traceback), and is resumed; from its event log,
every prompt up to the last trained one was trained exactly once, the run completed, nothing
hung and nothing was left running. Ctrl-C's stop and resume: ``test_operator.py``. The long
soak: ``tests/support/chaos_soak.py`` (README, Reliability)."""

from __future__ import annotations

import json
import random

import pytest

pytestmark = pytest.mark.e2e


def test_a_run_under_kills_and_a_stop_trains_every_prompt_once(tiny_model):
    from tests.support import chaos_soak

    schedule = [(8, "engine_core", 0.3), (14, "coordinator", 0.2), (20, "sigterm", 0.0)]
    r = chaos_soak.one_run(0, random.Random(0), tiny_model, 30, 0, 600, schedule=schedule)
    said = json.dumps(r, default=str)  # whole: pytest cuts a dict's repr short
    assert r["signals"] == ["engine_core", "coordinator", "sigterm"], said
    stops = [(s["exit_status"], s["says_resume"], s["traceback"], s["ray_dump"]) for s in r["stops"]]
    assert stops == [(143, True, False, False)], said
    assert r["stops_unclean"] == 0, said  # ...and at a sync boundary
    assert r["completed"] == 1 and r.get("hangs", 0) == 0, r.get("stderr_tail", said)
    assert r["groups_trained_twice"] == 0 and r["prompts_skipped"] == 0 and r["steps_missing"] == 0, said
    assert r["replicas_replaced"] >= 1 and r["restarts_from_checkpoint"] >= 2 and r["resumes"] == 1, said
    # the coordinator's restart kept the replica that replaced the killed engine's (was: it took
    # the dead one, listed first, killed the live one and started a third engine)
    assert r["replicas_adopted"] == 1, said
    assert not r.get("processes_left_after_exit"), said
