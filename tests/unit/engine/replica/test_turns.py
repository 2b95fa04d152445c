"""Multi-turn rollouts: the rollout core's turn loop over the fake engine, an environment's
failures contained, partial rollout across turns (a weight load mid-trajectory, a move to
another replica), the loss mask in the trainer's batch, and a whole run with the calculator.
Virtual time (``looptime``) throughout: no test waits on the wall clock."""

from __future__ import annotations

import asyncio

import pytest

from shunter.engine.config import ConfigError, from_dict
from shunter.engine.data.environments import Calculator, EnvCalls, StepResult, evaluate, load_environment
from shunter.engine.data.turns import batch_metrics
from shunter.events import (
    EnvFailed,
    Generate,
    SampleAborted,
    SampleEnd,
    SampleResumed,
    SamplingSpec,
)
from tests.support.cores import PROMPT, Hangs, Raises, WrongType, core, ends, gen, run_cfg, tool_user
from tests.support.fakes import CharTokenizer, FakeBackend, local_run, run_to_end, virtual_time


@virtual_time
async def test_a_tool_call_is_answered_and_the_observation_is_context_not_loss():
    events = await core().generate(gen())
    [s] = ends(events)
    tok = CharTokenizer()
    assert tok.decode(s.token_ids) == "12+34=46"
    assert s.loss_mask == [1] * 6 + [0, 0] + [1]  # the call, the tool's "46", the model's eos
    assert s.logprobs[6:8] == [0.0, 0.0]
    assert len(s.turns) == 1 and (s.turns[0].generated, s.turns[0].observed) == (6, 2)
    assert s.metrics == {"tool_calls": 1.0, "tool_ok": 1.0}
    assert s.reward == 1.0 and s.trained_tokens == 7
    s.check()


@virtual_time
async def test_the_budget_covers_observations_and_max_turns_ends_the_tool_calls():
    again = FakeBackend(token_s=0.01, respond=lambda ctx: ctx.partition(">")[0] + "=")  # calls forever
    [s] = ends(await core(again, max_turns=2).generate(gen(max_tokens=60)))
    assert len(s.turns) == 2  # then one last turn without tool calls
    assert len(s.token_ids) <= 60 and s.loss_mask.count(0) == 4
    [short] = ends(
        await core(FakeBackend(token_s=0.01, respond=tool_user("9999")), max_turns=4).generate(gen(max_tokens=7))
    )
    assert len(short.token_ids) == 7 and short.finish_reason == "length"  # the call (6) and 1 of "46"
    assert short.loss_mask == [1] * 6 + [0]


@virtual_time
async def test_environment_latency_does_not_hold_up_the_other_samples():
    class Slow(Calculator):
        async def step(self, action: str) -> StepResult:
            await asyncio.sleep(10.0)
            return await super().step(action)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    samples = ends(await core(environment=Slow).generate(gen(n=8)))
    assert len(samples) == 8 and all(len(s.turns) == 1 for s in samples)
    assert loop.time() - t0 < 12.0  # the eight waits overlap: one 10 s step, not 80 s
    assert all(s.turns[0].env_s == pytest.approx(10.0, abs=0.1) for s in samples)


@virtual_time
async def test_a_weight_load_mid_trajectory_resumes_the_turn_with_its_history():
    in_second_turn = asyncio.Event()

    def respond(context: str) -> str:
        prompt, _, response = context.partition(">")
        if "=" not in response:
            return prompt + "="
        in_second_turn.set()
        made = response.split("=", 1)[1][2:]  # after the tool's "46": what this turn has made
        return ("46" * 5)[len(made) :]

    c = core(FakeBackend(token_s=0.01, respond=respond))
    task = asyncio.ensure_future(c.generate(gen(max_tokens=40)))
    await in_second_turn.wait()
    await asyncio.sleep(0.035)  # virtual: a few tokens into the second turn
    loaded = await c.load_weights(1, b"v1")
    events = await task
    assert loaded[0].interrupted == 1
    [resumed] = [e for e in events if isinstance(e, SampleResumed)]
    assert resumed.turn == 1 and resumed.version == 1
    [s] = ends(events)
    assert CharTokenizer().decode(s.token_ids) == "12+34=46" + "46" * 5
    assert s.loss_mask[6:8] == [0, 0] and sum(s.loss_mask) == len(s.token_ids) - 2
    assert s.versions[:8] == [0] * 8 and s.versions[-1] == 1  # the observation keeps the call's version
    assert len(s.turns) == 1 and s.turns[0].version == 0


@virtual_time
async def test_a_trajectory_moved_to_another_replica_keeps_its_turns_and_resets_with_its_transcript():
    seen: list[str] = []

    class Recording(Calculator):
        async def reset(self, prompt, transcript):
            seen.append(transcript)
            await super().reset(prompt, transcript)

    in_second_turn = asyncio.Event()

    def respond(context: str) -> str:
        prompt, _, response = context.partition(">")
        if "=" not in response:
            return prompt + "="
        if response.count("=") > 1:
            return ""
        in_second_turn.set()
        made = response.split("=", 1)[1][2:]
        return "1+1="[len(made) :]  # a second call

    first = core(FakeBackend(token_s=0.01, respond=respond), environment=Recording)
    task = asyncio.ensure_future(first.generate(gen(max_tokens=40)))
    await in_second_turn.wait()
    await asyncio.sleep(0.015)
    await first.switch_to_trainer(1)
    [cut] = [e for e in await task if isinstance(e, SampleAborted)]
    assert cut.partial is not None and len(cut.partial.turns) == 1
    second = core(FakeBackend(token_s=0.01, respond=respond), environment=Recording)
    resume = Generate(group_id=0, prompt=PROMPT, n=1, sampling=SamplingSpec(max_tokens=40), resume=[cut.partial])
    [s] = ends(await second.generate(resume))
    assert seen[0] == "" and seen[1].startswith("12+34=46")  # reset on the new replica with the transcript
    assert CharTokenizer().decode(s.token_ids).startswith("12+34=46") and len(s.turns) == 2
    assert s.metrics["tool_calls"] == 2.0  # the calculator counted the call made before the move
    s.check()


class BadInit(Calculator):
    def __init__(self):
        raise RuntimeError("no licence")


class SyncStep(Calculator):
    def step(self, action):  # a plain function: run in a worker thread
        return StepResult(observation="46")


@pytest.mark.parametrize(
    ("env", "failure", "cause"),
    [
        (Raises, "raised", "ZeroDivisionError: the user's bug"),
        (WrongType, "returned", "WrongType.step returned str"),
        (Hangs, "timeout", "took longer than task.env_timeout_s = 5 s"),
        (BadInit, "raised", "BadInit() raised RuntimeError: no licence"),
    ],
)
@virtual_time
async def test_a_broken_environment_ends_its_trajectory_scored_as_it_stands(env, failure, cause):
    events = await core(environment=env, env_timeout_s=5.0).generate(gen(n=2))
    failed = [e for e in events if isinstance(e, EnvFailed)]
    assert len(failed) == 2 and all(e.failure == failure and cause in e.error for e in failed)
    assert failed[0].user_code == env.__name__
    assert len(ends(events)) == 2  # nothing is lost, nothing raised


def test_a_synchronous_step_runs_off_the_loop():
    async def main():
        return ends(await core(environment=SyncStep).generate(gen()))

    [s] = asyncio.run(main())
    assert CharTokenizer().decode(s.token_ids) == "12+34=46"


def test_the_calculator_evaluates_arithmetic_and_nothing_else():
    assert evaluate("2+3*4") == 14 and evaluate(" 10-7 ") == 3
    for bad in ("__import__('os')", "2**99999", "1/0", "", "9" * 20 + "*2"):
        with pytest.raises(ValueError):
            evaluate(bad)

    async def call(action: str) -> StepResult:
        c = Calculator()
        await c.reset(PROMPT, "")
        return await c.step(action)

    assert asyncio.run(call("12+34=")).observation == "46"
    assert asyncio.run(call("what=")).observation == "err"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("calculater", "unknown environment 'calculater': not a built-in (calculator)"),
        ("no_such_module:Env", "cannot import module 'no_such_module'"),
        ("shunter.engine.data.environments:evaluate", "is not a class"),
        ("shunter.engine.data.environments:StepResult", "lacks reset, step"),
        (f"{__name__}:NoStop", "stop must be a non-empty list"),
        (f"{__name__}:StringStop", "stop must be a non-empty list"),
    ],
)
def test_environment_specs_a_user_gets_wrong_are_named_with_the_cause(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_environment(spec)
    with pytest.raises(ConfigError, match="task.environment"):
        from_dict({"task": {"environment": spec}})


class NoStop:
    async def reset(self, prompt, transcript): ...
    async def step(self, action): ...


class StringStop(NoStop):
    stop = "="


def test_env_calls_never_raise_even_on_an_object_without_the_methods():
    calls = EnvCalls(lambda: object(), "junk", 1.0)

    async def main():
        assert await calls.make() == (None, "")
        return await calls.reset(PROMPT, "")

    failure, error = asyncio.run(main())
    assert failure == "raised" and "AttributeError" in error


def test_batch_metrics_average_the_environment_figures_over_the_batch():
    from shunter.events import Sample, Turn

    a = Sample(
        sample_id="0.0",
        group_id=0,
        prompt_id=0,
        prompt_token_ids=[1],
        token_ids=[1, 2, 3],
        logprobs=[0.0] * 3,
        versions=[0] * 3,
        loss_mask=[1, 0, 1],
        turns=[Turn(generated=1, observed=1)],
        metrics={"tool_ok": 1.0},
    )
    b = Sample(
        sample_id="0.1", group_id=0, prompt_id=0, prompt_token_ids=[1], token_ids=[1], logprobs=[0.0], versions=[0]
    )
    failures = {"env/raised": 0.0, "env/returned": 0.0, "env/timeout": 0.0}  # counted per step, none here
    assert batch_metrics([a, b]) == {
        "batch/turns_mean": 0.5,
        "batch/observation_tokens": 1.0,
        "env/tool_ok": 0.5,
        **failures,
    }
    assert batch_metrics([b]) == {}


def sort_caller(context: str) -> str:
    """Calls the calculator on the first two digits of a sort prompt, then answers."""
    prompt, _, response = context.partition(">")
    return f"{prompt[0]}+{prompt[1]}=" if "=" not in response else "1"


@virtual_time
async def test_a_multi_turn_run_trains_on_turns_and_reports_the_environment():
    coord, _, trainer = local_run(run_cfg(), respond=sort_caller)
    ended, seen = await run_to_end(coord, 3600)
    assert ended.reason == "completed", ended
    trained = [s for batch in trainer.seen for s in batch]
    assert trained and all(len(s.turns) == 1 and s.loss_mask.count(0) >= 1 for s in trained)
    assert ended.summary["env/steps"] >= len(trained)


@virtual_time
async def test_an_environment_that_always_fails_ends_the_run_naming_it():
    coord, _, _ = local_run(run_cfg(environment=f"{__name__}:Raises"), respond=sort_caller)
    ended, _ = await run_to_end(coord, 3600)
    assert ended.reason == "error" and ended.failed_component == f"{__name__}:Raises"
    assert "the environment failed on each of the run's first 8 trajectories (8 raised)" in ended.error


class CloseRaises(Calculator):
    async def close(self):
        raise OSError("the sandbox was already gone")


def never_calls(context: str) -> str:
    """Answers at once: the model never calls the tool (no step ever succeeds)."""
    return "1"


@virtual_time
async def test_an_environment_whose_close_always_fails_is_counted_and_the_run_trains():
    """A failed ``close`` leaves its trajectory scored: it never counts toward "failed on a
    mini-batch's worth before answering", even when no step ever ran (outsider report: the run
    ended with "… and never answered")."""
    coord, _, trainer = local_run(run_cfg(environment=f"{__name__}:CloseRaises"), respond=never_calls)
    ended, seen = await run_to_end(coord, 3600)
    assert ended.reason == "completed", ended
    closes = [e for e in seen if isinstance(e, EnvFailed)]
    assert closes and all(e.call == "close" and "the sandbox was already gone" in e.error for e in closes)
    assert ended.summary["env/raised"] >= len(trainer.seen[0])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from shunter.engine.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", sft_steps=0))


def test_the_trainer_masks_observation_tokens_out_of_the_loss(model_dir):
    """The loss mask reaches the trainer's batch: an observation token's position is 0 (so
    it is in no loss term, no denominator and no statistic), and a step trains on the rest."""
    import torch

    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer
    from shunter.events import Sample

    tr = Trainer(TrainerConfig(device="cpu", ppo_mini_batch_size=2, train_batch_size=2), model_dir)
    tr.setup()
    s = Sample(
        sample_id="0.0",
        group_id=0,
        prompt_id=0,
        prompt_token_ids=[5, 6, 7],
        token_ids=[8, 9, 10, 11, 0],
        logprobs=[-1.0, -1.0, 0.0, 0.0, -1.0],
        versions=[0] * 5,
        loss_mask=[1, 1, 0, 0, 1],
        reward=1.0,
    )
    b = tr.collate(
        [
            s,
            Sample(
                sample_id="0.1",
                group_id=0,
                prompt_id=0,
                prompt_token_ids=[5, 6, 7],
                token_ids=[8, 0],
                logprobs=[-1.0, -1.0],
                versions=[0, 0],
            ),
        ]
    )
    assert b["mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 1]  # logits at t predict token t+1
    assert b["mask"][1].tolist() == [0, 0, 1, 1, 0, 0, 0]
    assert b["old"][0, 4:6].tolist() == [0.0, 0.0]
    metrics = tr.train_step([s, msgspec_replace(s, sample_id="0.1", reward=0.0)])
    assert metrics["trainer/tokens"] == 10.0 and torch.isfinite(torch.tensor(metrics["trainer/loss"]))


def msgspec_replace(s, **kw):
    import msgspec

    return msgspec.structs.replace(s, **kw)


class BadFields(Calculator):
    async def step(self, action):
        return StepResult(observation=46, reward=float("nan"), metrics={"ok": True})  # msgspec does not check


@virtual_time
async def test_a_step_result_with_bad_fields_is_the_environments_error():
    events = await core(environment=BadFields).generate(gen())
    [failed] = [e for e in events if isinstance(e, EnvFailed)]
    assert failed.failure == "returned"
    assert (
        "metrics['ok'] True (not a finite number), observation int 46 (not a str), reward nan (not a finite number)"
        in failed.error
    )


class BlocksTheLoop(Calculator):
    async def step(self, action):
        import time

        time.sleep(1.0)  # the user's mistake: blocking code in an async step
        return StepResult(observation="46")


def generate_with_a_ticker(environment) -> tuple[list, int]:
    """Two tool-calling samples on a real environment loop (``env_thread``, 0.2 s env timeout),
    with a ticker on the replica's loop: the events, and how often the replica's loop turned."""

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.ensure_future(ticker())
        c = core(
            FakeBackend(token_s=0.0, respond=tool_user()), environment=environment, env_timeout_s=0.2, env_thread=True
        )
        events = await c.generate(gen(n=2))
        stop.set()
        await t
        await c.shutdown()
        return events, ticks

    return asyncio.run(main())


def test_an_async_step_that_blocks_holds_its_own_loop_and_times_out():
    """On a real replica (``env_thread``) the blocking call holds the environment loop, never the
    replica's: the replica's loop keeps turning and the call's timeout fires (real time, short)."""
    events, ticks = generate_with_a_ticker(BlocksTheLoop)
    failed = [e for e in events if isinstance(e, EnvFailed)]
    assert len(failed) == 2 and all(e.failure == "timeout" for e in failed)
    assert ticks >= 5  # the replica's loop went on while the environment blocked


class SlowToMake(Calculator):
    def __init__(self):
        import time

        time.sleep(1.0)  # the user's constructor opens a sandbox that does not answer


def test_a_constructor_that_blocks_holds_the_environment_loop_and_times_out():
    """The environment object is made on the environment loop, bounded by ``env_timeout_s``:
    a constructor that hangs is a ``timeout`` naming the class, and the replica's loop turns."""
    events, ticks = generate_with_a_ticker(SlowToMake)
    failed = [e for e in events if isinstance(e, EnvFailed)]
    assert len(failed) == 2 and all(e.failure == "timeout" for e in failed)
    assert all("SlowToMake() took longer than task.env_timeout_s = 0.2 s" in e.error for e in failed)
    assert [e for e in events if isinstance(e, SampleEnd)]  # scored as single turns all the same
    assert ticks >= 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("def __init__(self, url): ...", r"InitArgs\(\) cannot be called with no arguments"),
        ("async def reset(self): ...", r"InitArgs.reset cannot be called with \(self, prompt, transcript\)"),
        ("async def step(self, action, extra): ...", r"InitArgs.step cannot be called with \(self, action\)"),
        ("def close(self, force): ...", r"InitArgs.close cannot be called with \(self\)"),
        ("async def close(self, force): ...", r"InitArgs.close cannot be called with \(self\)"),
    ],
)
def test_an_environment_that_cannot_be_called_as_the_engine_calls_it_is_refused_at_load(body, message):
    ns: dict = {}
    exec(
        f"class InitArgs:\n    stop = ['=']\n    async def reset(self, prompt, transcript): ...\n"
        f"    async def step(self, action): ...\n    {body}\n",
        ns,
    )
    with pytest.raises(ValueError, match=message):
        load_environment(ns["InitArgs"])


def test_the_calculator_answers_err_to_expressions_that_would_crash_a_parser():
    async def call(action: str) -> str:
        c = Calculator()
        await c.reset(PROMPT, "")
        return (await c.step(action)).observation

    assert asyncio.run(call("1" + "+1" * 1000 + "=")) == "err"
    assert asyncio.run(call("-" * 10000 + "1=")) == "err"
