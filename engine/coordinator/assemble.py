"""The one place a run's coordinator is assembled: its prompts, its policy, its checkpoint store,
the ``Coordinator`` over them, and — for an attempt from a checkpoint — its state put back.

Three callers build a run and all build it here: the coordinator actor (``actors/coordinator_actor.py``,
over a ``RayExecutor``), the tests' in-process runs (``tests/support/fakes.py:local_run``, over a
``LocalExecutor`` and fakes of vLLM and torch) and the simulator (``bench/sim/cluster.py``, over a
``LocalExecutor`` and simulated backends). What differs between them is given: the executor, the
sinks, the clock, the inbox; what a run is made of is decided here.

Invariant: a run from a checkpoint folder starts exactly where that folder's cut left it — the
coordinator's snapshot restored before the loop runs (``Coordinator.restore``), its replicas on the
checkpoint's weight version (:func:`resume_version`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.coordinator import snapshot
from shunter.engine.coordinator.coordinator import Coordinator
from shunter.engine.coordinator.executor import Executor
from shunter.engine.data.datasets import Dataset, PromptStream
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.engine.io.records import Sink
from shunter.engine.tasks.base import load_task
from shunter.events import PromptSpec
from shunter.events.vocab import HYBRID, STANDALONE, ReplicaKind
from shunter.policies import Policy, make_policy

Prompts = tuple[Iterator[PromptSpec], list[PromptSpec]]
"""A run's training stream and its validation prompts."""


def build_coordinator(
    cfg: EngineConfig,
    executor: Executor,
    *,
    run_id: str,
    prompts: Prompts | None = None,
    data: tuple[Dataset, list[PromptSpec]] | None = None,
    policy: Policy | None = None,
    sinks: Sequence[Sink] = (),
    clock: Callable[[], float] = time.time,
    checkpoints: Path | None = None,
    resume: str | Path | None = None,
    attempt: int = 1,
    reason: str = "",
    skipped: dict[str, str] | None = None,
    inbox: Any = None,
) -> Coordinator:
    """A run's coordinator, ready to ``run()`` once its opening facts are posted.

    ``prompts``: the training stream and validation prompts to draw (else the run's own:
    :func:`run_prompts` over ``data``); ``policy``: an instance (else ``run.policy`` with its
    options); ``checkpoints``: the folder its checkpoints go to (None: none are taken);
    ``resume``: a checkpoint folder, already verified, this attempt continues from (``attempt``,
    ``reason`` and ``skipped`` go into its ``RunResumed``); ``inbox``: the queue messages wait in
    (the simulator's charges the loop's CPU time to its virtual clock)."""
    stream, val = prompts if prompts is not None else run_prompts(cfg, data)
    coord = Coordinator(
        cfg,
        policy or make_policy(cfg.run.policy, cfg.run.policy_options),
        executor,
        stream,
        run_id=run_id,
        validation_prompts=val,
        sinks=list(sinks),
        clock=clock,
        checkpoints=CheckpointStore(checkpoints, keep=cfg.run.checkpoint_keep) if checkpoints is not None else None,
        inbox=inbox,
    )
    if resume is not None:
        snap = snapshot.decode((Path(resume) / snapshot.SNAPSHOT_FILE).read_bytes())
        coord.restore(snap, checkpoint=str(resume), attempt=attempt, reason=reason, skipped=skipped)
    return coord


def run_prompts(cfg: EngineConfig, data: tuple[Dataset, list[PromptSpec]] | None = None) -> Prompts:
    """A run's training stream and validation prompts: a dataset's (``data``: its rows and
    validation prompts, when ``data.train_files`` is set), else the task's own."""
    if data is not None:
        train, val = data
        return PromptStream(train, cfg.run.seed, shuffle=cfg.data.shuffle, epochs=cfg.data.epochs), val
    task = load_task(cfg.task.name)
    prompts = (
        PromptSpec(prompt_id=i, text=p.text, answer=p.answer) for i, p in enumerate(task.train_prompts(cfg.run.seed))
    )
    val = [
        PromptSpec(prompt_id=-1 - i, text=p.text, answer=p.answer)
        for i, p in enumerate(task.validation_prompts(cfg.validation.prompts, cfg.run.seed))
    ]
    return prompts, val


def replica_kinds(cfg: EngineConfig) -> list[ReplicaKind]:
    """The kind of each of a run's replicas at its start, in rank order: the standalone ones, then
    the hybrid ones."""
    standalone: ReplicaKind = STANDALONE
    hybrid: ReplicaKind = HYBRID
    return [standalone] * cfg.rollout.standalone_replicas + [hybrid] * cfg.rollout.hybrid_replicas


def resume_version(folder: str | Path | None) -> int:
    """The weight version a run resumed from checkpoint ``folder`` starts its replicas on (0 for a
    new run); the folder is verified whole first."""
    if folder is None:
        return 0
    return CheckpointStore(Path(folder).parent).verify(folder).version
