"""Issue 4, items 2 and 4 at the unit tier: atomic checkpoints, and a run that resumes from
one — after its trainer died, or after its coordinator was lost — with exactly-once
accounting over the timeline that counts (steps up to the checkpoint from the first
attempt, the rest from the second), the staleness bound intact and the policy's state
restored."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shunter.engine.io.checkpoint import CheckpointError, CheckpointStore, resolve
from shunter.events import (
    CheckpointSaved,
    ComponentFailed,
    RunResumed,
    SaveCheckpoint,
    StepEnd,
    TrainStep,
)
from tests.support.configs import cfg
from tests.support.fakes import CoordinatorCrash, local_run, run_until, virtual_time


def _write(store: CheckpointStore, step: int, payload: bytes = b"x") -> Path:
    staging = store.staging(step)
    (staging / "model").mkdir()
    (staging / "model" / "weights.bin").write_bytes(payload * 1000)
    (staging / "trainer.pt").write_bytes(payload)
    return store.commit(staging, run_id="r", step=step, version=step // 2)[0]


def test_commit_is_verified_and_latest_points_at_it(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in (2, 4, 6):
        _write(store, step)
    assert [p.name for p in store.complete()] == ["step-00000004", "step-00000006"]  # pruned to keep=2
    path, manifest, _ = store.latest()
    assert path.name == "step-00000006" and manifest.step == 6 and manifest.version == 3
    assert set(manifest.files) == {"model/weights.bin", "trainer.pt"}
    assert (tmp_path / "latest").read_text() == "step-00000006"


def test_a_crash_while_writing_leaves_the_previous_checkpoint_usable(tmp_path):
    store = CheckpointStore(tmp_path)
    _write(store, 2)
    staging = store.staging(4)  # the writer died here: parts written, never committed
    (staging / "trainer.pt").write_bytes(b"half")
    path, manifest, _ = store.latest()
    assert manifest.step == 2
    _write(store, 4)  # the next commit clears the leftovers
    assert not list(tmp_path.glob(".step-*.tmp"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=st.sampled_from(["truncate", "delete", "flip", "manifest", "pointer"]), which=st.integers(0, 10))
def test_a_damaged_newest_checkpoint_is_skipped_with_its_reason(tmp_path, damage, which):
    root = tmp_path / f"c{os.urandom(4).hex()}"
    store = CheckpointStore(root, keep=3)
    _write(store, 2, b"a")
    newest = _write(store, 4, b"b")
    files = sorted(p for p in newest.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    victim = files[which % len(files)]
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-1])
    elif damage == "delete":
        victim.unlink()
    elif damage == "flip":
        data = bytearray(victim.read_bytes())
        data[0] ^= 0xFF
        victim.write_bytes(bytes(data))
    elif damage == "manifest":
        (newest / "MANIFEST.json").write_bytes(b"{not json")
    else:  # the pointer names a folder that is gone: the newest valid one is used
        (root / "latest").write_text("step-00000099")
    path, manifest, skipped = store.latest()
    if damage == "pointer":
        assert manifest.step == 4 and "step-00000099" in skipped["latest"]
    else:
        assert manifest.step == 2 and "step-00000004" in skipped
        assert resolve(root).skipped == skipped  # the resume is told what was passed over
        with pytest.raises(CheckpointError, match="step-00000004"):
            resolve(newest)


def test_a_pointer_of_garbage_bytes_is_named_and_the_newest_valid_checkpoint_used(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    _write(store, 2)
    _write(store, 4)
    (tmp_path / "latest").write_bytes(b"\xff\xfe\x00step")
    found = resolve(tmp_path)
    assert found.manifest.step == 4
    assert "unreadable" in found.skipped["latest"]


def test_a_pointer_to_an_older_checkpoint_does_not_win_over_a_newer_valid_one(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    _write(store, 2)
    _write(store, 4)
    (tmp_path / "latest").write_text("step-00000002")
    found = resolve(tmp_path)
    assert found.manifest.step == 4
    assert "names 'step-00000002'" in found.skipped["latest"]


def test_stray_folders_that_look_like_checkpoints_are_named_and_left_alone(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    _write(store, 2)
    (tmp_path / "step-final").mkdir()
    (tmp_path / "step-00000009").mkdir()  # no manifest: a half-copied folder
    (tmp_path / ".step-x.tmp").mkdir()
    found = resolve(tmp_path)
    assert found.manifest.step == 2
    assert set(found.skipped) == {"step-final", "step-00000009"}
    _write(store, 4)  # writing and pruning step over them too
    assert (tmp_path / "step-final").is_dir() and (tmp_path / ".step-x.tmp").is_dir()
    assert resolve(tmp_path).manifest.step == 4


def test_resolve_names_what_it_looked_at(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        resolve(tmp_path / "empty")


def test_a_mistyped_resume_path_is_said_not_to_exist_with_its_neighbours(tmp_path):
    (tmp_path / "run-1").mkdir()
    with pytest.raises(CheckpointError, match=r"run-l does not exist \(.*holds: run-1\)"):
        resolve(tmp_path / "run-l")


def _config(**run):
    return cfg(
        run={"total_steps": 12, "checkpoint_every": 2, **run},
        validation={"every": 0},
        rollout={"standalone_replicas": 2, "max_staleness": 1},
    )


def _effective(first_seen: list, second_trainer) -> list[list[int]]:
    """Prompt ids per trained batch over the timeline that counts: the batches the resumed
    trainer restored from its checkpoint, then those it trained after."""
    return second_trainer.restored_batches + [[s.prompt_id for s in b] for b in second_trainer.seen]


def _check_exactly_once(c, batches: list[list[int]]):
    n, g = c.run.total_steps, c.groups_per_mini_batch
    assert len(batches) == n
    prompts = Counter(p for b in batches for p in b)
    assert set(prompts.values()) == {c.rollout.n_samples_per_prompt}, "a prompt trained twice or partly"
    # wait mode trains groups oldest-first and drops none: exactly the first n * g prompts
    assert sorted(prompts) == list(range(n * g))


@virtual_time
async def test_trainer_death_resumes_from_the_last_checkpoint_exactly_once(tmp_path):
    c = _config()
    coord, _, trainer = local_run(c, token_s=0.002, checkpoints=tmp_path)
    seen, task = await run_until(coord, lambda m: isinstance(m, StepEnd) and m.step == 7)
    coord.post(coord.stamp(ComponentFailed(component="trainer", error="killed by the test")))
    async with asyncio.timeout(20):
        ended = await task
    assert ended.reason == "error" and ended.failed_component == "trainer"
    saved = [e.step for e in seen if isinstance(e, CheckpointSaved)]
    assert saved and saved[-1] == 6, saved
    assert all(isinstance(m, SaveCheckpoint) for m in seen if type(m).__name__ == "SaveCheckpoint")

    ckpt, manifest, _ = CheckpointStore(tmp_path).latest()
    coord2, _, trainer2 = local_run(c, token_s=0.002, checkpoints=tmp_path, resume=ckpt)
    seen2 = []
    coord2.sinks.append(seen2.append)
    async with asyncio.timeout(30):
        ended2 = await coord2.run()
    assert ended2.reason == "completed", ended2
    resumed = next(e for e in seen2 if isinstance(e, RunResumed))
    assert (resumed.step, resumed.version) == (6, manifest.version)
    assert [e.step for e in seen2 if isinstance(e, StepEnd)][0] == 7
    _check_exactly_once(c, _effective(seen, trainer2))
    # the staleness bound holds for resumed samples too
    for e in seen + seen2:
        if isinstance(e, StepEnd):
            assert e.metrics["batch/staleness_max"] <= c.rollout.max_staleness
    k = coord2.buffer.counters()
    assert k["trained"] == c.run.total_steps * c.groups_per_mini_batch and k.get("dropped_failed", 0) == 0
    # a final checkpoint holds the end state: resuming from it only runs the finale
    assert [e.step for e in seen2 if isinstance(e, CheckpointSaved)][-1] == 12


@virtual_time
async def test_a_lost_coordinator_resumes_with_its_policy_state(tmp_path):
    c = cfg(
        run={
            "total_steps": 12,
            "checkpoint_every": 2,
            "policy": "lend_when_idle",
            "policy_options": {"switch_cost_prior_s": 0.0},
        },
        validation={"every": 0},
        rollout={"standalone_replicas": 1, "hybrid_replicas": 1, "max_staleness": 1},
    )
    coord, _, trainer = local_run(c, token_s=0.002, checkpoints=tmp_path)
    seen, task = await run_until(coord, lambda m: isinstance(m, StepEnd) and m.step == 9, crash=True)
    with pytest.raises(CoordinatorCrash):
        await task
    ckpt, manifest, _ = CheckpointStore(tmp_path).latest()
    from shunter.engine.coordinator import snapshot

    snap = snapshot.decode((ckpt / snapshot.SNAPSHOT_FILE).read_bytes())
    assert snap.policy["lends"] >= 1, "lending must have happened before the checkpoint"
    coord2, _, trainer2 = local_run(c, token_s=0.002, checkpoints=tmp_path, resume=ckpt)
    assert coord2.policy.state.lends == snap.policy["lends"]
    seen2 = []
    coord2.sinks.append(seen2.append)
    async with asyncio.timeout(30):
        ended = await coord2.run()
    assert ended.reason == "completed", ended
    _check_exactly_once(c, _effective(seen, trainer2))
    assert coord2.policy.state.lends > snap.policy["lends"], "the resumed policy goes on lending"


@virtual_time
async def test_resuming_a_finished_run_only_runs_its_finale(tmp_path):
    c = _config(total_steps=4)
    coord, _, _ = local_run(c, checkpoints=tmp_path)
    async with asyncio.timeout(20):
        assert (await coord.run()).reason == "completed"
    ckpt, manifest, _ = CheckpointStore(tmp_path).latest()
    assert manifest.step == 4
    coord2, _, trainer2 = local_run(c, checkpoints=tmp_path, resume=ckpt)
    seen = []
    coord2.sinks.append(seen.append)
    async with asyncio.timeout(20):
        ended = await coord2.run()
    assert ended.reason == "completed" and ended.steps == 4
    assert not [m for m in seen if isinstance(m, TrainStep)] and trainer2.seen == []
    assert isinstance(next(m for m in seen if type(m).__name__.startswith("Run")), RunResumed)


@pytest.mark.parametrize(
    "policy,replicas",
    [
        ("separate", {"standalone_replicas": 2}),
        ("lend_when_idle", {"standalone_replicas": 1, "hybrid_replicas": 1}),
        ("colocated", {"standalone_replicas": 0, "hybrid_replicas": 2}),
    ],
)
@virtual_time
async def test_every_builtin_policy_resumes_after_a_trainer_death(tmp_path, policy, replicas):
    c = cfg(
        run={"total_steps": 10, "checkpoint_every": 2, "policy": policy},
        validation={"every": 4},
        rollout={**replicas, "max_staleness": 1},
    )
    coord, _, _ = local_run(c, token_s=0.002, checkpoints=tmp_path)
    seen, task = await run_until(coord, lambda m: isinstance(m, StepEnd) and m.step == 5)
    coord.post(coord.stamp(ComponentFailed(component="trainer", error="killed by the test")))
    async with asyncio.timeout(20):
        assert (await task).failed_component == "trainer"
    ckpt, _, _ = CheckpointStore(tmp_path).latest()
    coord2, _, trainer2 = local_run(c, token_s=0.002, checkpoints=tmp_path, resume=ckpt)
    async with asyncio.timeout(30):
        ended = await coord2.run()
    assert ended.reason == "completed", ended
    _check_exactly_once(c, _effective(seen, trainer2))
    assert ended.steps == c.run.total_steps and ended.summary["version"] == 5


@virtual_time
async def test_the_final_checkpoint_follows_the_final_validation(tmp_path):
    c = cfg(run={"total_steps": 6, "checkpoint_every": 4}, validation={"every": 2})
    coord, _, _ = local_run(c, checkpoints=tmp_path)
    seen = []
    coord.sinks.append(seen.append)
    async with asyncio.timeout(20):
        ended = await coord.run()
    assert ended.reason == "completed", ended
    assert [e.step for e in seen if isinstance(e, CheckpointSaved)] == [4, 6]
    kinds = [type(m).__name__ for m in seen]
    assert kinds.index("ValidateEnd", len(kinds) - kinds[::-1].index("Validate") - 1) < len(kinds) - 1 - kinds[
        ::-1
    ].index("CheckpointSaved")


@virtual_time
async def test_a_resumed_run_says_what_the_resolver_passed_over():
    """The skipped checkpoints reach the event log and the terminal (``RunResumed.skipped``)."""
    from shunter.events import RunResumed
    from tests.support.fakes import run_to_end

    c = _config(total_steps=2, checkpoint_every=0)
    first, _, _ = local_run(c)
    snap = first.snapshot()
    coord, _, _ = local_run(c)
    skipped = {"step-00000012": "runs/r/checkpoints/step-00000012: trainer.pt is missing"}
    coord.restore(snap, checkpoint="runs/r/checkpoints/step-00000010", skipped=skipped)
    ended, seen = await run_to_end(coord)
    (resumed,) = [m for m in seen if isinstance(m, RunResumed)]
    assert resumed.skipped == skipped and ended.reason == "completed"
