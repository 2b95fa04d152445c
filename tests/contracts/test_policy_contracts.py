"""Every policy — the built-ins and the example out-of-tree one — against the contract:
handles every event type, returns only commands, is deterministic for the same trace,
and resumes identically after snapshot()/restore()."""

from __future__ import annotations

import asyncio
import copy

import pytest
from fakes import local_run
from golden_cases import CASES

from shunter.engine.config import from_dict
from shunter.events import (
    BufferView,
    Command,
    EngineView,
    Event,
    ReplicaView,
    TrainerView,
)
from shunter.policies import BUILTIN, make_policy

EXAMPLE = "examples.custom_policy:EagerLendPolicy"
POLICIES = sorted(BUILTIN) + [EXAMPLE]
EVENTS = [m for m in CASES if isinstance(m, Event)]


def config_for(policy: str):
    colo = policy == "colocated"
    hybrid = 2 if colo else 1
    return from_dict({
        "run": {"total_steps": 6, "policy": policy},
        "rollout": {"standalone_replicas": 0 if colo else 1, "hybrid_replicas": hybrid, "n_samples_per_prompt": 4,
                    "max_tokens": 10, "max_staleness": 0 if colo else 1, "max_in_flight_per_replica": 16},
        "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 2, "train_batch_size": 16},
        "validation": {"every": 1, "prompts": 4},
    })


VIEWS = [
    EngineView(),
    EngineView(
        replicas=(ReplicaView(replica_id="standalone-0", kind="standalone", rank=0, mode="rollout", samples_per_s=50),
                  ReplicaView(replica_id="hybrid-1", kind="hybrid", rank=1, mode="trainer")),
        trainer=TrainerView(state="idle", step=3, version=1),
        buffer=BufferView(ready_samples=4, gate_open=True),
        ppo_mini_batch_size=8, parameter_sync_step=2, validate_every=1,
    ),
    EngineView(
        replicas=(ReplicaView(replica_id="hybrid-1", kind="hybrid", rank=1, mode="rollout"),),
        trainer=TrainerView(state="idle", steps_since_publish=2), buffer=BufferView(ready_batches=3), done=True,
    ),
]


@pytest.fixture(scope="module")
def traces():
    """(event, view) pairs recorded from a real coordinator run per policy."""
    out = {}
    for name in POLICIES:
        cfg = config_for(name)
        coord, _, _ = local_run(cfg, token_s=0.001)
        rec: list[tuple[Event, EngineView]] = []
        inner = coord.decide

        def decide(ev, inner=inner, rec=rec, coord=coord):
            rec.append((ev, coord.view()))
            return inner(ev)

        coord.decide = decide

        async def go(coord=coord):
            async with asyncio.timeout(30):
                return await coord.run()

        ended = asyncio.run(go())
        assert ended.reason == "completed", (name, ended)
        out[name] = rec
    return out


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.kind if hasattr(e, "kind") else type(e).__name__)
def test_handles_every_event_type_and_returns_only_commands(name, event):
    for view in VIEWS:
        cmds = make_policy(name).decide(event, view)
        assert isinstance(cmds, list)
        assert all(isinstance(c, Command) for c in cmds), cmds


@pytest.mark.parametrize("name", POLICIES)
def test_deterministic_for_the_same_trace(name, traces):
    a, b = make_policy(name), make_policy(name)
    for ev, view in traces[name]:
        assert a.decide(ev, view) == b.decide(ev, view)


@pytest.mark.parametrize("name", POLICIES)
def test_snapshot_restore_resumes_identically(name, traces):
    trace = traces[name]
    for cut in (len(trace) // 3, len(trace) // 2, 2 * len(trace) // 3):
        ref = make_policy(name)
        for ev, view in trace[:cut]:
            ref.decide(ev, view)
        restored = make_policy(name)
        restored.restore(copy.deepcopy(ref.snapshot()))
        for ev, view in trace[cut:]:
            assert restored.decide(ev, view) == ref.decide(ev, view)


@pytest.mark.parametrize("name", POLICIES)
def test_a_real_run_issues_commands(name, traces):
    issued = [c for ev, view in traces[name] for c in make_policy(name).decide(ev, view)]
    assert issued
