"""The built-in math reward (``shunter.engine.tasks.math_reward:compute_score``, on math-verify) scores
equal answers in any form 1.0 and wrong or unreadable ones 0.0 without raising; a ground truth it
cannot read raises (the engine reports it); it runs in the replica's reward threads (math-verify's
own timeouts are signal-based, main thread only, and are off); and what no thread timeout could
stop — a number too large to compute, brackets nested too deep for the parser — is screened out
before math-verify sees it. The screening is checked in a subprocess with a deadline, so a
regression that holds the interpreter fails the test instead of hanging the suite."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import threading
import time

import pytest

from shunter.engine.config import ConfigError, from_dict
from shunter.engine.data.rewards import Scored, ThreadRewards, score_one
from shunter.engine.tasks import as_scorer, load_reward
from shunter.engine.tasks.math_reward import MAX_DEPTH, compute_score
from shunter.events import PromptSpec

NAME = "shunter.engine.tasks.math_reward:compute_score"


def score(response: object, truth: str) -> float:
    return compute_score("math", response, truth, {})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "response, truth",
    [
        (r"so the answer is \boxed{0.5}", "1/2"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),
        (r"We get \boxed{\frac{1}{2}}.", "0.5"),
        (r"\boxed{\dfrac12}", r"$\frac{1}{2}$"),
        ("1/2", r"\frac{1}{2}"),
        (r"\boxed{19}", "19"),
        ("The answer is 19.", "19"),
        ("3 apples and 16 pears make 19", "19"),  # no box: the last number
        (r"At first I got \boxed{3}. That was a slip. Adding the terms once more gives \boxed{19}", "19"),
        (r"\boxed{19}", r"\boxed{19}"),
        (r"\boxed{1000}", "1,000"),
        (r"\boxed{1+x^2}", "x^2+1"),
        (r"\boxed{\sqrt{18}}", r"3\sqrt{2}"),
        (r"\boxed{(1,2)}", "(1, 2)"),
        (r"\boxed{2^{100}}", "1267650600228229401496703205376"),
        (r"\boxed{\binom{10}{3}}", "120"),
        (r"\boxed{5!}", "120"),
        (r"\boxed{\left(\frac{1+\sqrt{5}}{2}\right)^{2}}", r"\frac{3+\sqrt{5}}{2}"),
    ],
)
def test_an_equal_answer_in_any_form_scores_1(response, truth):
    assert score(response, truth) == 1.0


@pytest.mark.parametrize(
    "response, truth",
    [
        (r"\boxed{20}", "19"),
        ("The answer is 18.", "19"),
        (r"\boxed{0.51}", r"\frac{1}{2}"),
        (r"\boxed{x^2-1}", "x^2+1"),
        (r"\boxed{19} and \boxed{20}", "19"),  # boxes side by side: a list of answers, not 19
        (r"first \boxed{3}; adding once more gives \boxed{19}", "19"),  # the same, as math-verify reads it
    ],
)
def test_a_wrong_answer_scores_0(response, truth):
    assert score(response, truth) == 0.0


@pytest.mark.parametrize(
    "response",
    ["", "   ", "I do not know.", r"\boxed{", r"\boxed{}", "}{", "$$$$", "\x00\ufffd\U0001f600", "\\" * 1000, None, 19],
)
def test_an_unreadable_response_scores_0_and_never_raises(response):
    assert score(response, "19") == 0.0


def test_a_ground_truth_it_cannot_read_raises_and_the_engine_scores_0_naming_it():
    with pytest.raises(ValueError, match="reads no answer in the ground truth ''"):
        score(r"\boxed{19}", "")
    with pytest.raises(ValueError, match="not parsed"):
        score(r"\boxed{19}", "9^{9^{9^{9}}}")
    with pytest.raises(ValueError, match="not compared"):
        score(r"\boxed{19}", "(10^{10})!")
    scored = score_one(as_scorer(load_reward(NAME)), PromptSpec(prompt_id=0, answer=""), r"\boxed{19}")
    assert scored.reward == 0.0 and scored.failure == "raised" and "ground truth ''" in scored.error


def test_it_is_named_in_the_config_and_called_with_verls_arguments():
    assert load_reward(NAME) is compute_score is load_reward("math")  # its built-in short name
    assert from_dict({"task": {"reward": "math"}}).task.reward == "math"
    with pytest.raises(ConfigError, match=r"unknown reward 'maths': not a built-in \(math\) nor 'module:function'"):
        from_dict({"task": {"reward": "maths"}})
    cfg = from_dict({"task": {"reward": NAME}})  # checked at load: it imports, its signature is verl's
    assert cfg.task.reward == NAME
    scorer = as_scorer(load_reward(cfg.task.reward))
    prompt = PromptSpec(prompt_id=0, text="What is 12 + 7?", answer="19", data_source="gsm8k", extra_info={"i": 1})
    assert score_one(scorer, prompt, r"12 + 7 = \boxed{19}") == Scored(1.0)
    assert score_one(scorer, prompt, r"\boxed{18}") == Scored(0.0)


def test_it_never_sets_an_alarm_and_says_nothing_of_its_timeouts(monkeypatch, caplog):
    def no_alarm(*_):
        raise AssertionError("math-verify's signal-based timeout was used")

    monkeypatch.setattr(signal, "alarm", no_alarm)
    with caplog.at_level(logging.DEBUG):
        assert score(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert not [r for r in caplog.records if "Timeout" in r.getMessage()]


def test_it_works_off_the_main_thread():
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.extend([score(r"\boxed{0.5}", "1/2"), score("20", "19")]))
    worker.start()
    worker.join(60)
    assert results == [1.0, 0.0]


async def test_in_the_replicas_reward_threads_concurrent_calls_score_as_one_at_a_time():
    cases = [
        (r"\boxed{0.5}", "1/2"),
        (r"\boxed{x^2+1}", "1+x^2"),
        ("19", "19"),
        (r"\boxed{3}", r"\sqrt{10}"),
        ("", "7"),
    ]
    expected = [score(r, t) for r, t in cases]
    rewards = ThreadRewards(as_scorer(load_reward(NAME)), timeout_s=60, threads=4)
    try:
        async with asyncio.timeout(120):
            got = await asyncio.gather(
                *(
                    rewards.score(PromptSpec(prompt_id=i, answer=t), r)
                    for _ in range(4)
                    for i, (r, t) in enumerate(cases)
                )
            )
    finally:
        rewards.close()
    assert [s.reward for s in got] == expected * 4 and not any(s.failure for s in got)
    assert expected == [1.0, 1.0, 1.0, 0.0, 0.0]


PATHOLOGICAL = [
    r"\boxed{9^{9^{9^{9}}}}",  # evaluated in C at comparison
    "The answer is 9**9**9**9",
    r"\boxed{[0, 9^{9^{9^9}}]}",  # evaluated in C as it is parsed
    r"\boxed{\gcd(9^{9^{9^9}}, 6)}",
    r"\boxed{2^{10000000000}}",
    r"\boxed{(10^{10})!}",  # parsed, not compared
    r"\boxed{e^{e^{e^{100}}}}",
    r"\boxed{\prod_{k=1}^{10^{10}} k}",
    r"\boxed{\binom{1000000}{500000}}",  # computed by the parser, slowly
    r"\boxed{\Gamma(10000000000)}",
    r"\boxed{\operatorname{zeros}(100000, 100000)}",
    r"\boxed{" + "{" * 40 + "19" + "}" * 40 + "}",  # exponential in the parser
    r"\boxed{" + "(" * 3000 + "19" + ")" * 3000 + "}",
    r"\boxed{" + "9" * 200_000 + "}",
    "so we get 18. " * 20_000 + r"\boxed{" + "9" * 5000,  # long
]

_CHILD = """
import asyncio, json, sys, time
from shunter.engine.data.rewards import ThreadRewards
from shunter.engine.tasks import as_scorer, load_reward
from shunter.events import PromptSpec

async def main():
    rewards = ThreadRewards(as_scorer(load_reward(sys.argv[1])), timeout_s=30, threads=2)
    out = []
    for response in json.loads(sys.stdin.read()):
        t0 = time.monotonic()
        scored = await rewards.score(PromptSpec(prompt_id=0, answer="19"), response)
        out.append([scored.reward, scored.failure, time.monotonic() - t0])
    rewards.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_numbers_too_large_to_compute_and_brackets_too_deep_score_0_at_once_in_the_reward_threads():
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, NAME],
            input=json.dumps(PATHOLOGICAL),
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scoring the pathological responses held the interpreter for {time.monotonic() - t0:.0f} s")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.splitlines()[-1])
    for response, (reward, failure, seconds) in zip(PATHOLOGICAL, results, strict=True):
        assert (reward, failure) == (0.0, ""), response[:60]  # screened: scored, not timed out
        assert seconds < 20, (response[:60], seconds)


def test_the_depth_screen_leaves_ordinary_nesting_alone():
    assert score(r"\boxed{\frac{1}{1+\frac{1}{1+\frac{1}{2}}}}", "3/5") == 1.0
    assert score(r"\boxed{" + "{" * (MAX_DEPTH - 1) + "19" + "}" * (MAX_DEPTH - 1) + "}", "19") == 1.0
    assert score(r"\boxed{" + "{" * MAX_DEPTH + "19" + "}" * MAX_DEPTH + "}", "19") == 0.0
