"""A run across Ray nodes started the way operators start them (issue 28): ``ray start --head``
with a custom resource ``node_a``, ``ray start --address=…`` with ``node_b`` — two raylets, two
node ids, two object stores on this one machine — and ``shunter run --address`` whose trainer
asks for ``node_a`` and whose replica asks for ``node_b`` (``examples/sort_cluster.toml``).

Mid-run the replica's node is lost as an operator loses one: ``kill -9`` of its raylet (its
workers, the vLLM engine among them, die with it). The replica is reported down, its replacement
waits for room (``replica.pending``: no node offers ``node_b`` any more) until an operator adds a
node that does, and the run completes there: every prompt group trained once, none skipped, the
replacement named and placed on the new node, weights loaded across nodes (the replica's relay
took them from the trainer's object store) — the same bytes: the replica's final held-out scores
are the final checkpoint's, computed here by HF transformers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from shunter.engine.io.records import trained_groups
from shunter.events import (
    ComponentPlaced,
    LogReader,
    RelayReport,
    ReplicaDown,
    ReplicaPending,
    ReplicaRestart,
    ReplicaUp,
    StepEnd,
    ValidateEnd,
    WeightsLoaded,
    read_log,
)
from tests.support.ray_nodes import RayNodes

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20  # the replica node is lost at step LOSE_AT; the rest runs on its replacement
LOSE_AT = 8


def _shunter_run(nodes: RayNodes, tmp_path: Path, config: Path, address: str, steps: int, run_id: str):
    """``shunter run`` as an operator starts it against the cluster, its own process group, stderr
    to ``tmp_path/stderr.txt`` (read by ``_wait``) and its run folder ``tmp_path/runs/<run_id>``."""
    with open(tmp_path / "stderr.txt", "w") as e, open(tmp_path / "stdout.txt", "w") as o:
        return subprocess.Popen(
            [sys.executable, "-m", "shunter.cli", "run", str(config), "--address", address, "--steps", str(steps),
             "--no-progress", "--run-id", run_id, "--output-dir", str(tmp_path / "runs")],
            cwd=tmp_path,
            env={**nodes.env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
            stdout=o,
            stderr=e,
            start_new_session=True,
        )  # fmt: skip


def _wait(check, what: str, timeout: float, proc: subprocess.Popen, err: Path):
    """Poll ``check()`` (reading the run's own records) until it holds; fail naming ``what``
    if the run exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}: {err.read_text()[-3000:]}")
        time.sleep(0.5)  # polling the run's event log, which another process writes
    raise AssertionError(f"no {what} within {timeout:g}s: {err.read_text()[-3000:]}")


def _greedy_scores(folder: Path, run: Path) -> dict:
    """The run's held-out prompts scored greedily by HF transformers on its final checkpoint's
    model (the weights of the last version published), as the replicas' validation scores them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shunter.engine.config import load_config
    from shunter.engine.coordinator.assemble import run_prompts
    from shunter.engine.io.checkpoint import CheckpointStore
    from shunter.engine.tasks import load_task

    cfg = load_config(ROOT / "examples" / "sort_cluster.toml")
    found = CheckpointStore(run / "checkpoints").latest()
    assert found is not None
    model_dir = found[0] / "model"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    task = load_task(cfg.task.name)
    rewards = []
    with torch.no_grad():
        for p in run_prompts(cfg)[1]:
            ids = torch.tensor([tok.encode(p.text, add_special_tokens=False)])
            out = model.generate(
                ids,
                do_sample=False,
                max_new_tokens=cfg.rollout.max_tokens,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.eos_token_id,
            )[0, ids.shape[1] :].tolist()
            text = tok.decode([t for t in out if t != tok.eos_token_id], skip_special_tokens=True)
            rewards.append(task.reward(p.text, text, p.answer))
    n = len(rewards)
    return {"version": found[1].version, "reward_mean": sum(rewards) / n, "exact": sum(r >= 1.0 for r in rewards) / n}


def _trainer_on_node_t(tmp_path: Path, trainer: str, *swaps: tuple[str, str]) -> Path:
    """``examples/sort_cluster.toml`` with the trainer on a node offering ``node_t`` (and the
    ``trainer`` lines after it), no validation, and ``swaps`` (old, new) made; its path."""
    text = (ROOT / "examples" / "sort_cluster.toml").read_text()
    text = text.replace("resources = { node_a = 1 }", "resources = { node_t = 1 }" + trainer)
    for old, new in (("every = 50", "every = 0"), *swaps):
        text = text.replace(old, new)
    config = tmp_path / "cluster.toml"
    config.write_text(text)
    return config


def _messages(log: Path) -> list:
    return list(read_log(log)) if log.exists() else []


def test_a_run_across_two_raylets_survives_losing_its_replica_node(tmp_path):
    nodes = RayNodes()
    try:
        address = nodes.head({"node_a": 1})
        nodes.add({"node_b": 1})
        err = tmp_path / "stderr.txt"
        run = tmp_path / "runs" / "cl"
        log = run / "events.bin"
        proc = _shunter_run(nodes, tmp_path, ROOT / "examples" / "sort_cluster.toml", address, STEPS, "cl")
        try:
            _wait(lambda: sum(isinstance(m, StepEnd) for m in _messages(log)) >= LOSE_AT, "steps", 300, proc, err)
            nodes.kill_node("node_b")
            _wait(lambda: any(isinstance(m, ReplicaPending) for m in _messages(log)), "replica.pending", 120, proc, err)
            nodes.add({"node_b": 1})  # an operator adds a node: the replacement lands there
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        said = err.read_text()
        assert proc.returncode == 0, said[-3000:]
    finally:
        nodes.stop()

    msgs = list(LogReader(log))  # the frames as written: relays' reports among them
    facts = list(read_log(log))
    placed = {m.component: m.node_id for m in facts if isinstance(m, ComponentPlaced)}
    up = [m.replica_id for m in facts if isinstance(m, ReplicaUp)]
    assert len(up) == 2, up  # the first replica and its replacement
    first, second = up
    assert len({placed["trainer"], placed[first], placed[second]}) == 3  # three raylets, three nodes
    down = [m for m in facts if isinstance(m, ReplicaDown)]
    assert [m.replica_id for m in down] == [first]
    assert [m.replica_id for m in facts if isinstance(m, ReplicaRestart)] == [first]
    pending = next(m for m in facts if isinstance(m, ReplicaPending))
    assert pending.replacing == first and pending.missing == {"node_b": 1.0}
    assert f"replica.pending: the replacement of {first} waits for room" in said
    assert f"replica.waited: the replacement of {first} found room after" in said  # the wait's end, said too
    # the replicas' facts came folded by their node's relay actor, one per node
    relays = {m.relay for m in msgs if isinstance(m, RelayReport)}
    assert len(relays) == 2 and all(".relay." in r for r in relays), relays
    # weights crossed nodes: the replacement loaded versions the trainer (on node_a) published
    assert any(isinstance(m, WeightsLoaded) and m.replica_id == second and m.version > 0 for m in facts)
    # the replica on another node served the bytes the trainer published: its final held-out
    # validation (greedy, on the last version, which the run's final checkpoint holds) scores
    # what the checkpoint's weights score when run here by HF transformers
    final = [m for m in facts if isinstance(m, ValidateEnd)][-1]
    mine = _greedy_scores(tmp_path, run)
    assert final.version == mine["version"]
    assert abs(final.metrics["exact"] - mine["exact"]) <= 1 / 128 + 1e-9, (final.metrics, mine)  # a greedy tie at most
    assert abs(final.metrics["reward_mean"] - mine["reward_mean"]) <= 0.01, (final.metrics, mine)
    # nothing trained twice, no prompt skipped
    steps = trained_groups(log)
    groups = Counter(g for _, gs in steps for g in gs)
    assert len(steps) == STEPS
    assert set(groups.values()) == {1}, "a group trained twice"
    assert sorted(groups) == list(range(len(groups))), "prompts skipped"


def test_losing_the_trainers_node_waits_for_room_resumes_when_one_joins_and_names_the_step_when_none_does(tmp_path):
    """Issue 46, item 3: the trainer on a node of its own (``trainer.resources = { node_t = 1 }``).
    Its node lost (``kill -9`` of the raylet) the run restarts from its checkpoint and, with no node
    offering ``node_t``, says what the trainer waits for and how long (``trainer.pending``); an
    operator adds such a node and the run goes on there (``trainer.waited``, ``RunResumed``). Lost a
    second time with none added, the wait ends past ``run.restart_wait_s`` and the run exits 1
    naming the step it lost its trainer at and the ``--resume`` line — not "did not start"."""
    from shunter.events import CheckpointSaved, RunResumed

    config = _trainer_on_node_t(
        tmp_path, "", ("checkpoint_every = 20", "checkpoint_every = 4\nmax_restarts = 3\nrestart_wait_s = 30")
    )
    nodes = RayNodes()
    try:
        address = nodes.head({"node_b": 1})  # the driver's node: coordinator, registry, the replica
        nodes.add({"node_t": 1})
        err = tmp_path / "stderr.txt"
        run = tmp_path / "runs" / "tr"
        log = run / "events.bin"
        proc = _shunter_run(nodes, tmp_path, config, address, 200, "tr")
        try:

            def saved_at_least(n):
                return lambda: any(isinstance(m, CheckpointSaved) and m.step >= n for m in _messages(log))

            _wait(saved_at_least(4), "a checkpoint", 300, proc, err)
            nodes.kill_node("node_t")
            _wait(lambda: "trainer.pending:" in err.read_text(), "trainer.pending", 120, proc, err)
            nodes.add({"node_t": 1})  # an operator adds a node offering node_t: the run goes on there
            _wait(lambda: any(isinstance(m, RunResumed) for m in _messages(log)), "run.resumed", 180, proc, err)
            resumed = next(m for m in _messages(log) if isinstance(m, RunResumed))
            _wait(saved_at_least(resumed.step + 4), "a checkpoint after the resume", 300, proc, err)
            lost_after = max(m.step for m in _messages(log) if isinstance(m, StepEnd))
            nodes.kill_node("node_t")  # lost again, and no node is added
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        said = err.read_text()
        # the operator adds a node and runs the --resume line against the same, live cluster: the run
        # goes on to its end, and the cluster lives on (a resume once ended a cluster it had joined:
        # it took the joined cluster's daemons for a killed run's orphans)
        nodes.add({"node_t": 1})
        gcs = [p for p in nodes.processes() if p.name() == "gcs_server"]
        again = subprocess.run(
            [sys.executable, "-m", "shunter.cli", "run", str(config), "--address", address, "--resume", str(run),
             "--steps", "16", "--no-progress"],
            cwd=tmp_path,
            env={**nodes.env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
        assert gcs and all(p.is_running() for p in gcs), "the resume ended the operator's cluster"
    finally:
        nodes.stop()

    assert again.returncode == 0, again.stderr[-3000:]
    assert proc.returncode == 1, said[-3000:]
    lines = [x for x in said.splitlines() if x.startswith(("trainer.", "shunter:"))]
    pending = [x for x in lines if x.startswith("trainer.pending:")]
    assert len(pending) == 2, lines
    assert "it needs 1 node_t (free 0); it waits up to 30s (run.restart_wait_s)" in pending[0], pending
    waited = [x for x in lines if x.startswith("trainer.waited:")]
    assert len(waited) == 2 and "room for the trainer after" in waited[0], waited
    assert "no room for the trainer within" in waited[1], waited
    [last] = [x for x in lines if x.startswith("shunter:")]
    assert last.startswith("shunter: the run failed: the run lost a component at step "), last
    step = int(last.split("at step ")[1].split(" ")[0])
    assert step >= lost_after, (step, lost_after)
    assert "node_t" in last and f"--resume {run}" in last, last
    assert "did not start" not in said
    # the wait that found room is in the event log, as the new attempt's coordinator recorded it
    from shunter.events import TrainerPending, TrainerWaited

    facts = list(read_log(log))
    assert [type(m) for m in facts if isinstance(m, TrainerPending | TrainerWaited)] == [TrainerPending, TrainerWaited]
    # over the three attempts and the resume: every group trained once, none skipped
    steps = trained_groups(log)
    groups = Counter(g for _, gs in steps for g in gs)
    assert len(steps) == 16
    assert set(groups.values()) == {1}, "a group trained twice"
    assert sorted(groups) == list(range(len(groups))), "prompts skipped"


def test_a_trainer_of_two_ranks_spans_two_raylets(tmp_path):
    """Issue 47: ``trainer.world_size = 2`` with each rank asking for a host offering ``node_t``,
    and two raylets offering one each: the ranks land on different nodes, join one gloo group
    across them (rank 0's address found through Ray) and train the run to its end, every step
    and group once."""
    from shunter.events import ComponentPlaced

    config = _trainer_on_node_t(tmp_path, "\nworld_size = 2\nnum_cpus = 0.5")
    nodes = RayNodes()
    try:
        address = nodes.head({"node_b": 1, "node_t": 1})
        nodes.add({"node_t": 1})
        run = subprocess.run(
            [sys.executable, "-m", "shunter.cli", "run", str(config), "--address", address, "--steps", "8",
             "--no-progress", "--run-id", "two", "--output-dir", str(tmp_path / "runs")],
            cwd=tmp_path,
            env={**nodes.env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
    finally:
        nodes.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    log = tmp_path / "runs" / "two" / "events.bin"
    placed = {m.component: m.node_id for m in read_log(log) if isinstance(m, ComponentPlaced)}
    assert placed["trainer"] and placed["trainer.rank1"] and placed["trainer"] != placed["trainer.rank1"], placed
    steps = trained_groups(log)
    assert [s for s, _ in steps] == list(range(1, 9))
    assert set(Counter(g for _, gs in steps for g in gs).values()) == {1}
