"""Environment edges an outsider found: the optional ``close()`` hook (once per environment
made, whichever way its trajectory ends on the replica, contained like every call), the bounds
of ``task.max_turns`` / ``task.env_timeout_s``, a bad reward quoted, ``env/steps`` in the
summary of a run whose model never called the tool, and failed calls counted per step.
Virtual time (``looptime``) wherever the clock matters: no test waits on the wall clock."""

from __future__ import annotations

import asyncio

import pytest

from shunter.engine.config import ConfigError, from_dict
from shunter.engine.data.environments import Calculator, StepResult
from shunter.engine.data.turns import batch_metrics
from shunter.events import EnvFailed, Generate, SampleAborted, SampleEnd, SamplingSpec
from tests.support.cores import PROMPT, Hangs, Raises, WrongType, core, ends, gen, run_cfg, tool_user
from tests.support.fakes import CharTokenizer, FakeBackend, local_run, run_to_end, virtual_time


def closing(base: type = Calculator, *, close_s: float = 0.0, close_raises: bool = False):
    """A subclass of ``base`` whose instances count themselves and record their ``close()``;
    returns (the class, its record)."""
    log: dict = {"made": 0, "closed": [], "done": asyncio.Event()}

    class Closing(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            log["made"] += 1
            self.n = log["made"]

        async def close(self) -> None:
            log["closed"].append(self.n)
            if close_s:
                await asyncio.sleep(close_s)
            if close_raises:
                raise OSError("sandbox already gone")
            log["done"].set()

    return Closing, log


# -- close() -----------------------------------------------------------------------------------
@pytest.mark.parametrize("base", [Calculator, Raises, WrongType, Hangs])
@virtual_time
async def test_each_environment_made_is_closed_once_when_its_trajectory_ends(base):
    env, log = closing(base)
    events = await core(environment=env, env_timeout_s=5.0).generate(gen(n=3))
    assert len(ends(events)) == 3
    assert log["made"] == 3 and sorted(log["closed"]) == [1, 2, 3]  # finished or failed: closed once each


class ResetRaises(Calculator):
    async def reset(self, prompt, transcript):
        raise KeyError("no such task")


class InitRaises(Calculator):
    def __init__(self):
        raise RuntimeError("no licence")


@virtual_time
async def test_an_environment_whose_reset_failed_is_closed_and_one_never_made_is_not():
    env, log = closing(ResetRaises)
    events = await core(environment=env).generate(gen(n=2))
    assert [e.failure for e in events if isinstance(e, EnvFailed)] == ["raised", "raised"]
    assert log["made"] == 2 and sorted(log["closed"]) == [1, 2]
    env, log = closing(InitRaises)
    await core(environment=env).generate(gen(n=2))
    assert log["made"] == 0 and log["closed"] == []


@virtual_time
async def test_a_trajectory_cut_to_move_closes_its_environment_here_and_the_next_replica_closes_its_own():
    in_second_turn = asyncio.Event()

    def respond(context: str) -> str:
        prompt, _, response = context.partition(">")
        if "=" not in response:
            return prompt + "="
        in_second_turn.set()
        made = response.split("=", 1)[1][2:]
        return "9999"[len(made) :]

    env, log = closing()
    first = core(FakeBackend(token_s=0.01, respond=respond), environment=env)
    task = asyncio.ensure_future(first.generate(gen(max_tokens=40)))
    await in_second_turn.wait()
    await first.switch_to_trainer(1)
    [cut] = [e for e in await task if isinstance(e, SampleAborted)]
    assert cut.partial is not None and log["closed"] == [1]  # closed before the partial was handed over
    second = core(FakeBackend(token_s=0.01, respond=respond), environment=env)
    resume = Generate(group_id=0, prompt=PROMPT, n=1, sampling=SamplingSpec(max_tokens=40), resume=[cut.partial])
    [s] = ends(await second.generate(resume))
    assert CharTokenizer().decode(s.token_ids) == "12+34=469999"
    assert log["made"] == 2 and log["closed"] == [1, 2]


@virtual_time
async def test_a_close_that_raises_or_hangs_is_an_env_failed_and_the_sample_is_scored_all_the_same():
    env, _ = closing(close_raises=True)
    events = await core(environment=env).generate(gen())
    [failed] = [e for e in events if isinstance(e, EnvFailed)]
    assert failed.failure == "raised" and "Closing.close raised OSError: sandbox already gone" in failed.error
    assert failed.turn == 1 and failed.call == "close"
    assert isinstance(events[-1], SampleEnd) and events.index(failed) < len(events) - 1  # just before SampleEnd
    [s] = ends(events)
    assert s.reward == 1.0 and CharTokenizer().decode(s.token_ids) == "12+34=46"

    env, log = closing(close_s=3600.0)  # hangs
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    events = await core(environment=env, env_timeout_s=5.0).generate(gen())
    [failed] = [e for e in events if isinstance(e, EnvFailed)]
    assert failed.failure == "timeout" and "Closing.close took longer than task.env_timeout_s = 5 s" in failed.error
    assert loop.time() - t0 < 6.0 and len(ends(events)) == 1


@virtual_time
async def test_a_trajectory_whose_caller_went_away_still_closes_its_environment():
    stepping = asyncio.Event()

    class SlowStep(Calculator):
        async def step(self, action):
            stepping.set()
            await asyncio.sleep(10.0)
            return await super().step(action)

    env, log = closing(SlowStep)
    task = asyncio.ensure_future(core(environment=env).generate(gen()))
    await stepping.wait()
    task.cancel()
    await log["done"].wait()  # the virtual_time bound fails the test if it never comes
    assert log["closed"] == [1]


@virtual_time
async def test_shutdown_waits_for_the_cut_trajectories_to_close_their_environments():
    generating = asyncio.Event()

    def respond(context: str) -> str:
        generating.set()
        return "1" * 30  # a long answer, no tool call

    env, log = closing(close_s=2.0)
    c = core(FakeBackend(token_s=0.01, respond=respond), environment=env)
    task = asyncio.ensure_future(c.generate(gen(n=2, max_tokens=40)))
    await generating.wait()
    await c.shutdown()
    assert log["done"].is_set() and sorted(log["closed"]) == [1, 2]
    events = await task
    assert len([e for e in events if isinstance(e, SampleAborted) and e.partial]) == 2 and not ends(events)


def test_a_synchronous_close_runs_too():
    closed: list[int] = []

    class SyncClose(Calculator):
        def close(self):  # a plain function: run in a worker thread
            closed.append(1)

    async def main():
        return ends(await core(environment=SyncClose).generate(gen(n=2)))

    assert len(asyncio.run(main())) == 2 and closed == [1, 1]


def test_an_async_close_on_a_real_replica_runs_on_the_environment_loop():
    import threading

    closed_on: list[str] = []

    class Loopy(Calculator):
        async def close(self):
            closed_on.append(threading.current_thread().name)

    async def main():
        c = core(FakeBackend(token_s=0.0, respond=tool_user()), environment=Loopy, env_thread=True)
        samples = ends(await c.generate(gen(n=2)))
        await c.shutdown()
        return samples

    assert len(asyncio.run(main())) == 2 and closed_on == ["shunter-env-loop"] * 2


# -- config bounds -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"max_turns": 1000000}, "<= 256 - at `$.task.max_turns` (got 1000000)"),
        ({"max_turns": 257}, "<= 256 - at `$.task.max_turns` (got 257)"),
        ({"env_timeout_s": float("inf")}, "<= 86400.0 - at `$.task.env_timeout_s` (got inf)"),
        ({"env_timeout_s": float("nan")}, "> 0.0 - at `$.task.env_timeout_s` (got nan)"),
        ({"env_timeout_s": 86401.0}, "<= 86400.0 - at `$.task.env_timeout_s` (got 86401.0)"),
        ({"reward_timeout_s": float("inf")}, "<= 86400.0 - at `$.task.reward_timeout_s` (got inf)"),
        ({"reward_timeout_s": 0}, "> 0.0 - at `$.task.reward_timeout_s` (got 0)"),
        (
            {"environment": "calculator", "env_timeout_s": 1800.0},
            "task.env_timeout_s (1800) must be below 0.9 x rollout.generate_timeout_s (1800 -> 1620)",
        ),
    ],
)
def test_absurd_turn_and_timeout_limits_are_refused_naming_the_field_and_value(task, message):
    with pytest.raises(ConfigError) as e:
        from_dict({"task": task})
    assert message in str(e.value)


def test_the_largest_sane_limits_load():
    cfg = from_dict({"task": {"max_turns": 256, "env_timeout_s": 86400.0}})
    assert (cfg.task.max_turns, cfg.task.env_timeout_s) == (256, 86400.0)


# -- a bad reward quoted -------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@virtual_time
async def test_a_non_finite_step_reward_is_quoted(value):
    class BadReward(Calculator):
        async def step(self, action):
            return StepResult(observation="46", reward=value)

    events = await core(environment=BadReward).generate(gen())
    [failed] = [e for e in events if isinstance(e, EnvFailed)]
    assert failed.failure == "returned" and f"reward {value!r} (not a finite number)" in failed.error


# -- the run summary -----------------------------------------------------------------------------
@virtual_time
async def test_the_summary_counts_zero_environment_steps_when_the_model_never_called_the_tool():
    coord, _, _ = local_run(run_cfg(), respond=lambda context: "1")
    ended, _ = await run_to_end(coord, 3600)
    assert ended.reason == "completed", ended
    assert ended.summary["env/steps"] == 0.0


# -- failures per step ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "failure"), [(Raises, "raised"), (WrongType, "returned"), (Hangs, "timeout"), (ResetRaises, "raised")]
)
@virtual_time
async def test_failed_environment_calls_are_counted_per_step_by_failure(env, failure):
    events = await core(environment=env, env_timeout_s=5.0).generate(gen(n=2))
    samples = ends(events)
    assert all(s.metrics.get(failure) == 1.0 for s in samples)
    ok = ends(await core().generate(gen(n=1)))
    metrics = batch_metrics(samples + ok)  # the trainer's StepEnd metrics carry these
    assert metrics[f"env/{failure}"] == 2.0
    assert all(metrics[f"env/{k}"] == 0.0 for k in ("raised", "returned", "timeout") if k != failure)
    assert metrics["env/tool_calls"] == pytest.approx(1 / 3)  # the environment's own metric: a mean


@virtual_time
async def test_a_close_failure_is_counted_per_step_too():
    env, _ = closing(close_raises=True)
    samples = ends(await core(environment=env).generate(gen(n=2)))
    assert batch_metrics(samples)["env/raised"] == 2.0


@virtual_time
async def test_an_environment_metric_named_like_a_failure_is_refused():
    class Shadows(Calculator):
        async def step(self, action):
            return StepResult(observation="46", metrics={"timeout": 1.0})

    events = await core(environment=Shadows).generate(gen())
    [failed] = [e for e in events if isinstance(e, EnvFailed)]
    assert failed.failure == "returned" and "metrics['timeout'] (a name the engine reports itself)" in failed.error
