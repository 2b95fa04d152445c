"""A generation stream reports progress (``engine.replica.heartbeat``), so ``rollout.generate_timeout_s``
bounds a replica's silence, not a trajectory's total time: a trajectory of slow tool calls runs
far past the timeout with no gap in its stream as long as that, a wedged engine makes no beat,
beats are rate-limited, and a core without a beat period streams exactly as before.
Virtual time (``looptime``): the gaps are measured on the loop's clock."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from shunter.engine.config import ConfigError, from_dict
from shunter.engine.data.environments import Calculator
from shunter.engine.replica.heartbeat import Heartbeat, every_for, slack
from tests.support.cores import core, ends, gen
from tests.support.fakes import FakeBackend, virtual_time

TIMEOUT = 10.0  # the executor's rollout.generate_timeout_s in these tests
CALLS = 4


class SlowTool(Calculator):
    """Answers each call after 8 s: four calls make a 32 s trajectory, over three timeouts."""

    async def step(self, action):
        await asyncio.sleep(8.0)
        return await super().step(action)


def calls_four_times(context: str) -> str:
    prompt, _, response = context.partition(">")
    return prompt + "=" if response.count("=") < CALLS else ""


async def stream_times(c, cmd) -> list[tuple[float, list]]:
    """Each item the stream hands over, with the loop time it came."""
    loop = asyncio.get_running_loop()
    return [(loop.time(), item) async for item in c.generate_stream(cmd)]


def slow_core(every_s: float):
    return core(
        backend=FakeBackend(token_s=0.01, respond=calls_four_times),
        environment=SlowTool,
        env_timeout_s=8.5,
        max_turns=CALLS,
        progress_every_s=every_s,
    )


@virtual_time
async def test_a_trajectory_of_slow_tool_calls_outlasts_the_timeout_without_a_silence_that_long():
    t0 = asyncio.get_running_loop().time()
    got = await stream_times(slow_core(every_for(TIMEOUT)), gen(n=2, max_tokens=40))
    times = [t0] + [t for t, _ in got]
    assert times[-1] - t0 > 3 * TIMEOUT  # the trajectory ran for over three timeouts
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < TIMEOUT  # never silent that long
    samples = ends([e for _, evs in got for e in evs])
    assert len(samples) == 2 and all(len(s.turns) == CALLS for s in samples)
    assert any(evs == [] for _, evs in got)  # beats carried it


@virtual_time
async def test_without_a_beat_period_the_stream_is_as_before_one_item_per_sample():
    got = await stream_times(slow_core(0.0), gen(n=2, max_tokens=40))
    assert len(got) == 2 and all(evs for _, evs in got)


class Wedged(FakeBackend):
    """An engine that never answers a request (vLLM's engine process stopped)."""

    async def generate(self, request_id, prompt_ids, params):
        await asyncio.Event().wait()


@virtual_time
async def test_a_wedged_engine_makes_no_beat():
    c = core(backend=Wedged(), environment=None, progress_every_s=1.0)
    stream = c.generate_stream(gen(n=4))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(100.0):
            await anext(stream)
    await stream.aclose()


@virtual_time
async def test_beats_are_rate_limited_and_progress_is_never_left_unreported_longer_than_the_period():
    loop = asyncio.get_running_loop()
    beats: list[float] = []
    hb: Heartbeat

    def beat() -> None:
        beats.append(loop.time())
        hb.sent()

    hb = Heartbeat(5.0, beat)
    start = loop.time()
    for t in [0.0, 0.1, 1.0, 4.9, 5.2, 20.0, 21.0]:  # progress at these times
        await asyncio.sleep(start + t - loop.time())
        hb.progressed()
    await asyncio.sleep(10.0)
    assert [round(b - start, 6) for b in beats] == [5.0, 10.0, 20.0, 25.0]
    # 0.0-4.9 wait for 5.0 (a period after the stream began); 5.2 for 10.0; 20.0 is due at once; 21.0 waits for 25.0


@pytest.mark.parametrize(("env_timeout_s", "ok"), [(1619.0, True), (1620.0, False), (1700.0, False)])
def test_an_environment_call_must_end_within_the_silence_a_stream_survives(env_timeout_s, ok):
    assert slack(1800.0) == 1620.0
    task = {"environment": "calculator", "env_timeout_s": env_timeout_s}
    if ok:
        assert from_dict({"task": task}).task.env_timeout_s == env_timeout_s
        return
    with pytest.raises(ConfigError, match=r"below 0.9 x rollout.generate_timeout_s \(1800 -> 1620\)"):
        from_dict({"task": task})


class SlowRewards:
    """A reward that takes 25 s to score (a sandboxed checker, a queue behind other samples'
    rewards, a reward worker restarting): bounded, not a hang of the replica."""

    async def score(self, prompt, response):
        from shunter.engine.data.rewards import Scored

        await asyncio.sleep(25.0)
        return Scored(1.0)

    def losses(self):
        return []

    def close(self) -> None:
        pass


@virtual_time
async def test_a_reward_slower_than_the_timeout_leaves_no_silence_that_long():
    c = core(environment=None, progress_every_s=every_for(TIMEOUT), rewards=SlowRewards())
    t0 = asyncio.get_running_loop().time()
    got = await stream_times(c, gen(n=2))
    times = [t0] + [t for t, _ in got]
    assert times[-1] - t0 > 2 * TIMEOUT  # the samples took over two timeouts to score
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < TIMEOUT  # beats while they score
    assert [s.reward for s in ends([e for _, evs in got for e in evs])] == [1.0, 1.0]


@virtual_time
async def test_a_group_that_ends_within_the_beat_period_streams_no_beat():
    """The executor's deadline starts with the call: a stream needs no beat before a period has
    passed since it began (a beat at the first turn of every group would add a Ray item per group)."""
    got = await stream_times(core(environment=None, progress_every_s=180.0), gen(n=1))
    assert [bool(evs) for _, evs in got] == [True]


class SlowLoad(FakeBackend):
    """Weights that take 25 s to load (a large model): bounded by run.timeout_s, not a hang."""

    async def load_weights(self, blob: bytes) -> float:
        await asyncio.sleep(25.0)
        return await super().load_weights(blob)


def slow_abort_core():
    return core(backend=SlowLoad(token_s=0.05, answer_len=100), environment=None, progress_every_s=every_for(TIMEOUT))


def slow_keep_core():
    """The simulator's backend (it can pause requests with their KV cache) with a 25 s load."""
    from shunter.bench.sim.backends import SimBackend
    from tests.support.configs import KEEP_COST
    from tests.support.cores import plain_core

    cost = msgspec.structs.replace(KEEP_COST, length_sigma=0.0, length_median=100, decode_step_s=0.05, load_s=25.0)
    return plain_core(SimBackend(cost), weight_update="keep", progress_every_s=every_for(TIMEOUT))


@pytest.mark.parametrize("make", [slow_abort_core, slow_keep_core], ids=["abort", "keep"])
@virtual_time
async def test_a_weight_load_longer_than_the_timeout_leaves_no_silence_that_long(make):
    """Was: a load is silence on every stream of the replica (its samples cut and waiting, or
    paused), so a load longer than generate_timeout_s (a large model; loads are bounded by
    run.timeout_s) got the replica killed as hung. The streams beat while it runs."""
    c = make()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    streamed = asyncio.ensure_future(stream_times(c, gen(n=1, max_tokens=120)))
    await asyncio.sleep(2.0)
    await c.load_weights(1, b"v1")
    got = await streamed
    times = [t0] + [t for t, _ in got]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < TIMEOUT
