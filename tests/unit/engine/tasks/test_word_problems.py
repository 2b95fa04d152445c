"""The arithmetic word-problem task: its reward, its two warm starts, its verl reward, and the
offline generator's parquet (verl's layout, read back by the engine's own loader)."""

from __future__ import annotations

import random
from itertools import islice

import pytest

from shunter.engine.tasks import as_scorer, load_task
from shunter.engine.tasks.word_problems import (
    LOW,
    WordProblemsTask,
    WordProblemsToolTask,
    compute_score,
    problem,
    score,
)
from shunter.events import PromptSpec


@pytest.mark.parametrize(
    ("response", "reward"),
    [("19", 1.0), ("12+7=19", 1.0), ("12+7=18", 0.25), ("91", 0.0), ("", 0.0), ("abc", 0.0), ("190", 0.5 * 2 / 3)],
)
def test_the_reward_is_the_last_numbers_match(response, reward):
    assert score(response, "19") == pytest.approx(reward)


def test_the_verl_reward_is_called_by_the_engine_with_the_row():
    scorer = as_scorer(compute_score)
    assert scorer(PromptSpec(prompt_id=0, answer="19", data_source="word_problems"), "12+7=19") == 1.0


def test_only_the_tool_task_demonstrates_calls_and_its_problems_are_the_harder_ones():
    plain, tool = load_task("word_problems"), load_task("word_problems_tool")
    a, b = list(islice(plain.train_prompts(0), 300)), list(islice(tool.train_prompts(0), 300))
    assert not any(p.demo for p in a)
    calls = [p for p in b if p.demo]
    assert 0.25 < len(calls) / len(b) < 0.42
    for p in calls:  # the demonstration is the calculator call and its value
        expr, _, value = p.demo.partition("=")
        assert value == p.answer and sum(map(int, expr.split("+"))) == int(p.answer)
        assert all(n in p.text.split(",") or n + ">" in p.text for n in expr.split("+"))
    assert max(int(p.answer) for p in b) > 27  # two-digit addends: beyond the single-turn task's sums


@pytest.mark.parametrize(
    ("task", "high", "sums"),
    [
        ("word_problems", 9, (2, 27)),  # revision 2: what the tiny model can add in its head
        ("word_problems_tool", 20, (2, 60)),  # revision 1's problems: for the calculator
    ],
)
def test_each_variant_poses_its_difficulty(task, high, sums):
    t = load_task(task)
    assert t.high == high
    got = {int(p.answer) for p in islice(t.train_prompts(0), 2000)}
    assert sums[0] <= min(got) and max(got) <= sums[1] and len(got) > 20


@pytest.mark.parametrize("cls", [WordProblemsTask, WordProblemsToolTask])
def test_problems_use_only_the_tiny_vocabulary_and_fit_the_example_context(cls):
    from shunter.engine.models.tiny import SYMBOLS

    rng = random.Random(0)
    for _ in range(500):
        words, terms = problem(rng, cls.high)
        assert set(words) <= set(SYMBOLS) and 2 <= len(terms) <= 3
        assert all(LOW <= t <= cls.high for t in terms) and all(str(t) in words.split(",") for t in terms)
        assert len(words) + 1 + 16 <= 96  # examples/word_problems*.toml: max_model_len 96, max_tokens 16


def test_the_generator_writes_a_verl_parquet_the_engine_loads(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    from shunter.engine.data.files import read_rows

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[4] / "examples"))  # as when run as a script
    __import__("make_word_problems").main(str(tmp_path), train=50, val=10)
    sys.modules.pop("make_word_problems", None)
    rows = read_rows(tmp_path / "word_train.parquet")
    assert len(rows) == 50 and rows[0].data_source == "word_problems"
    tool_rows = read_rows(tmp_path / "word_tool_train.parquet")
    assert len(tool_rows) == 50 and max(int(r.ground_truth) for r in tool_rows) > 27
    assert rows[0].messages and rows[0].messages[0].role == "user" and rows[0].ground_truth.isdigit()
    held = {r.messages[0].content for r in read_rows(tmp_path / "word_val.parquet")}
    assert not held & {r.messages[0].content for r in rows}
