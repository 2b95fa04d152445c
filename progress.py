"""Run an engine with a terminal progress bar and print what was learned.

Invariant: reads the run only through ``Engine.events()``; the bar shows optimizer step,
mean batch reward, rollout tokens/s and staleness, the summary the ``RunEnded`` figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from tqdm import tqdm

from shunter.api import Engine
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.engine.io.errors import secs
from shunter.events import (
    CommandFailed,
    ComponentFailed,
    EventRejected,
    IntentRejected,
    LogRepaired,
    PolicyFailed,
    PolicySlow,
    ReplicaDown,
    ReplicaGivenUp,
    ReplicaPending,
    ReplicaRestart,
    ReplicaWaited,
    RunEnded,
    RunResumed,
    SampleEnd,
    StepEnd,
    TrainerPending,
    TrainerWaited,
    ValidateEnd,
    tag_of,
)


async def run_with_progress(cfg: EngineConfig, resume: str | None = None, run_id: str | None = None) -> RunEnded:
    bar = tqdm(total=cfg.run.total_steps, unit="step", disable=not cfg.run.progress, dynamic_ncols=True)
    global TERMINATED, STOPS, STOPPED
    TERMINATED, STOPS, STOPPED = False, 0, False  # each run counts its own stop signals
    engine = Engine(cfg, resume=resume, run_id=run_id)
    _stop_on_signals(engine, bar)
    try:
        async with engine:  # the handlers outlive ray.init (actors.launch.cluster.handlers_kept)
            print(f"run {engine.run_id}: records in {engine.out_dir}", file=sys.stderr)
            if engine.reaped:
                print(
                    f"ended {len(engine.reaped)} processes the killed run left: {', '.join(engine.reaped)}",
                    file=sys.stderr,
                )
            try:
                ended = await follow_run(engine, bar)
            except asyncio.CancelledError:  # Ctrl-C / SIGTERM: stop at a consistent cut, then say so
                with contextlib.suppress(Exception):  # a dead coordinator: leaving the block closes all the same
                    await engine.stop()
                _say_stopped(engine, bar)  # before the cluster goes: its shutdown takes a while
                raise
    except asyncio.CancelledError:  # stopped before the run started, or while it was stopping
        if not STOPPED:
            _say_stopped(engine, bar)
        raise
    bar.close()
    print_summary(ended)
    global RUN_DIR
    RUN_DIR = engine.out_dir
    return ended


def _say_stopped(engine: Engine, bar: tqdm) -> None:
    global STOPPED
    STOPPED = True  # a signal from here on only hurries the exit (the run is stopped and saved)
    bar.close()
    how = f" ({engine.ended.reason} at step {engine.ended.steps})" if engine.ended else ""
    print(f"\ninterrupted: the run stopped{how}; {_then(engine)}", file=sys.stderr, flush=True)


def _then(engine: Engine) -> str:
    return then(engine.out_dir)


def then(out_dir: Path) -> str:
    """What a stopped or failed run leaves to do: the checkpoint ``--resume`` continues from, if any."""
    saved = CheckpointStore(out_dir / "checkpoints").latest()
    if saved is not None:
        return f"continue it with --resume {out_dir} (from step {saved.manifest.step})"
    return (
        "no checkpoint was saved, so there is nothing to resume: start it again "
        f"(a new run id, or move {out_dir} aside)"
    )


def _stop_on_signals(engine: Engine, bar: tqdm) -> None:
    """Ctrl-C and SIGTERM (``kill``, a scheduler's preemption) stop the run: the first cancels
    the main task — the engine stops at a consistent cut and saves a checkpoint, and the CLI
    exits 130 (143 after a SIGTERM); a second one while it does stops at once (:func:`_stop_now`)."""
    task = asyncio.current_task()
    if task is None or sys.platform == "win32":
        return

    def stop(signum: int) -> None:
        global TERMINATED, STOPS, STOPPED
        TERMINATED = TERMINATED or signum == signal.SIGTERM
        STOPS += 1
        if engine.connecting and not STOPPED:  # nothing of the run exists yet: nothing to stop or save
            STOPPED = True
            bar.leave = False  # and no bar of a run that never began
            bar.close()
            print(
                f"\ninterrupted while reaching the Ray cluster at {engine.connecting}: nothing was started",
                file=sys.stderr,
                flush=True,
            )
            task.cancel()
            return
        if STOPS > 1:
            _stop_now(engine)
        again = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        print(
            "\nstopping: the run stops at a consistent cut and saves a checkpoint "
            f"({again} again to stop at once, without saving)",
            file=sys.stderr,
            flush=True,
        )
        task.cancel()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)


def _stop_now(engine: Engine) -> None:
    """A second stop signal: say what is left, end the run's local Ray cluster (its actors, the
    vLLM engines under them) and exit — no checkpoint now, no traceback of the interrupted
    clean-up. The event log loses at most its last half second (its torn tail is repaired on
    ``--resume``), as after a ``kill -9``."""
    status = exit_on_next_signal()  # a third, should ray.shutdown() hang: out now
    if not STOPPED:  # else the run has stopped and said so: this signal only hurries the exit
        try:
            then = _then(engine)
        except Exception:  # noqa: BLE001 - a damaged folder: the exit must not wait on it
            then = f"see {engine.out_dir}"
        print(f"\nstopped at once, without saving; {then}", file=sys.stderr, flush=True)
    try:
        import ray

        if ray.is_initialized():
            if engine.coordinator is not None:  # first: its records end here, not with the deaths that follow
                with contextlib.suppress(Exception):
                    ray.kill(engine.coordinator, no_restart=True)
            ray.shutdown()
    finally:
        os._exit(status)


def exit_on_next_signal() -> int:
    """From here on a Ctrl-C or SIGTERM exits at once, quietly, with the stopped run's status
    (143 after a SIGTERM, else 130); returns that status."""
    status = 143 if TERMINATED else 130
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: os._exit(status))
    return status


TERMINATED = False
"""A SIGTERM stopped the run (the CLI's exit status is then 143, not 130)."""
STOPS = 0
"""Stop signals received (Ctrl-C, SIGTERM): the second stops at once."""
RUN_DIR: Path | None = None
"""The folder of the last run that ended (the CLI's ``--resume`` line after a failure)."""
STOPPED = False
"""The run has stopped after a stop signal (checkpoint saved, what to do next printed)."""


async def follow_run(engine: Engine, bar: tqdm) -> RunEnded:
    """Show the run's events until it ends; errors once, then at the 10th, 100th … repeat."""
    val, shown = "", ""
    tokens, t0 = 0, None
    repeats: dict[str, int] = {}
    async for ev in engine.events():
        if isinstance(ev, SampleEnd):
            tokens += len(ev.sample.token_ids)
            t0 = t0 or ev.wall_time
        elif isinstance(ev, StepEnd):
            m = ev.metrics
            rate = tokens / (ev.wall_time - t0) if t0 and ev.wall_time > t0 else 0.0
            bar.update(ev.step - bar.n)
            shown = (
                f"reward {m.get('batch/reward_mean', 0):.3f} | stale {m.get('batch/staleness_mean', 0):.2f}"
                f" | {rate:.0f} tok/s"
            )
            bar.set_postfix_str(shown + val, refresh=False)
        elif isinstance(ev, ValidateEnd):
            # the bar shows the newest validation at once, with the weights it scored: the final
            # one comes after the last step and is the one the summary prints
            val = f" | val exact {ev.metrics.get('exact', 0):.2f} (version {ev.version})"
            bar.set_postfix_str(shown + val)
            for err in ev.errors:  # the user's reward / environment failed on held-out prompts
                line = f"{tag_of(ev)}: version {ev.version}: {err[:300]}"
                key = f"{tag_of(ev)}: {err.partition(' failed on ')[0][:160]}"  # per piece of user code
                n = repeats[key] = repeats.get(key, 0) + 1
                if n in (1, 10, 100, 1000, 10_000):
                    tqdm.write(line + (f" (x{n})" if n > 1 else ""), file=sys.stderr)
        elif isinstance(ev, RunResumed):
            tqdm.write(
                f"resumed from {ev.checkpoint} at step {ev.step}"
                + (f" (attempt {ev.attempt}: {ev.reason})" if ev.reason else ""),
                file=sys.stderr,
            )
            for name, why in ev.skipped.items():
                tqdm.write(f"  passed over {name}: {why}", file=sys.stderr)
        elif isinstance(ev, PolicyFailed | CommandFailed | ComponentFailed | EventRejected | IntentRejected):
            line = f"{tag_of(ev)}: {_said(ev)}"
            n = repeats[line[:160]] = repeats.get(line[:160], 0) + 1
            if n in (1, 10, 100, 1000, 10_000):
                tqdm.write(line + (f" (x{n})" if n > 1 else ""), file=sys.stderr)
        elif isinstance(ev, ReplicaDown):
            tqdm.write(f"replica.down: {ev.replica_id}: {ev.reason[:300]}", file=sys.stderr)
        elif isinstance(ev, ReplicaRestart):
            tqdm.write(
                f"replica.restart: replacing {ev.replica_id} (rank {ev.rank}, attempt {ev.attempt}) "
                f"in {secs(ev.delay_s)}s",
                file=sys.stderr,
            )
        elif isinstance(ev, ReplicaPending):
            need = _needs(ev.missing, ev.free)
            tqdm.write(
                f"replica.pending: {'the replacement of ' + ev.replacing if ev.replacing else 'a new replica'} "
                f"waits for room in the Ray cluster: it needs {need}; it waits up to {secs(ev.deadline_s)}s "
                "(rollout.replacement_wait_s) for a node to come back or be added",
                file=sys.stderr,
            )
        elif isinstance(ev, ReplicaWaited):
            who = f"the replacement of {ev.replacing}" if ev.replacing else f"the new {ev.replica_kind} replica"
            tqdm.write(
                f"replica.waited: {who} found room after {ev.waited_s:.0f}s and starts now"
                if ev.outcome == "placed"
                else f"replica.waited: {who} found no room within {ev.waited_s:.0f}s "
                "(rollout.replacement_wait_s): its start counts as failed",
                file=sys.stderr,
            )
        elif isinstance(ev, TrainerPending):
            need = _needs(ev.missing, ev.free)
            tqdm.write(
                f"trainer.pending: the run lost its trainer and restarts from its checkpoint at step "
                f"{ev.checkpoint_step}, but the Ray cluster has no room for one: it needs {need}; it waits up to "
                f"{secs(ev.deadline_s)}s (run.restart_wait_s) for a node to come back or be added",
                file=sys.stderr,
            )
        elif isinstance(ev, TrainerWaited):
            tqdm.write(
                f"trainer.waited: room for the trainer after {ev.waited_s:.0f}s: the run restarts"
                if ev.outcome == "placed"
                else f"trainer.waited: no room for the trainer within {ev.waited_s:.0f}s (run.restart_wait_s)",
                file=sys.stderr,
            )
        elif isinstance(ev, ReplicaGivenUp):
            tqdm.write(
                f"replica.given_up: {ev.replica_id} (rank {ev.rank}) is not replaced "
                f"({ev.attempts} replacements in the last hour; rollout.replica_restarts)",
                file=sys.stderr,
            )
        elif isinstance(ev, LogRepaired):
            tqdm.write(
                f"run.log_repaired: {ev.path}: kept {ev.frames} readable frames; damaged bytes at {ev.kept_as}",
                file=sys.stderr,
            )
            for line in ev.damage[:3]:
                tqdm.write(f"  {line}", file=sys.stderr)
        elif isinstance(ev, PolicySlow):
            tqdm.write(
                f"policy.slow: {ev.policy}.decide() took {ev.decide_ms:.1f} ms on {ev.on_kind} "
                f"(budget run.policy_budget_ms = {ev.budget_ms:g}; {ev.slow_calls} of {ev.calls} calls "
                "over it): every replica waits that long",
                file=sys.stderr,
            )
    return engine.ended or await engine.wait()


def _needs(missing: dict[str, float], free: dict[str, float]) -> str:
    """What a wait for room asks for: ``1 node_t (free 0), 4 CPU (free 2)``."""
    return ", ".join(f"{v:g} {k} (free {free.get(k, 0):g})" for k, v in missing.items())


def _said(ev) -> str:
    """One line for an error event: its text, where it came from, how often."""
    text = getattr(ev, "error", "") or getattr(ev, "detail", "")
    if isinstance(ev, CommandFailed) and ev.command_kind:  # which command: a checkpoint's save, a load ...
        text = f"{ev.command_kind}: {text}"
    where = getattr(ev, "target", "") or getattr(ev, "component", "") or getattr(ev, "origin", "")
    n = getattr(ev, "repeats", 1)
    return f"{text}" + (f" [{where}]" if where else "") + (f" (x{n})" if n > 1 else "")


def print_summary(ended: RunEnded) -> None:
    s = ended.summary
    print(
        f"\nrun ended: {ended.reason} after {ended.steps} optimizer steps, {s.get('wall_s', 0):.0f} s"
        + (f" — error: {ended.error}" if ended.error else "")
    )
    if "batch/reward_first" in s:
        print(f"  sampled reward   {s['batch/reward_first']:.3f} -> {s['batch/reward_last']:.3f}")
    if "validate/exact_first" in s:
        print(
            f"  greedy held-out  exact {s['validate/exact_first']:.2f} -> {s['validate/exact_last']:.2f}, "
            f"reward {s['validate/reward_mean_first']:.3f} -> {s['validate/reward_mean_last']:.3f}"
        )
    print(
        f"  rollout          {s.get('rollout/tokens_per_s', 0):.0f} tokens/s, weight version {s.get('version', 0):.0f}"
    )
    print(
        f"  prompt groups    dispatched {s.get('buffer/dispatched_groups', 0):.0f}, trained "
        f"{s.get('buffer/trained_groups', 0):.0f}, dropped {s.get('buffer/dropped_groups', 0):.0f}"
    )
    for what in ("reward", "env"):  # user code that failed: scored 0 (or as it stood), never silent
        failed = {k: s.get(f"{what}/{k}", 0) for k in ("raised", "returned", "timeout")}
        if any(failed.values()):
            print(
                f"  {what + ' failures':<16} "
                + ", ".join(f"{k} {v:.0f}" for k, v in failed.items())
                + f" (see rollout.{what}_failed in the event log)"
            )
    lost = {k: s.get(f"reward/worker_{k}", 0) for k in ("died", "hung")}
    if any(lost.values()):
        print(
            f"  reward workers   lost: died {lost['died']:.0f}, hung {lost['hung']:.0f} "
            "(their calls were tried again; see rollout.reward_worker_lost in run.log)"
        )
    if s.get("data/source_from_file_name"):
        n = s["data/source_from_file_name"]
        print(f"  data             {n:.0f} rows without data_source were given their file's base name")
