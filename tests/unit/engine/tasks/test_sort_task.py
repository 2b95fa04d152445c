"""The sort_digits task: hand-computed rewards, deterministic streams, held-out split, loaders."""

from __future__ import annotations

import itertools

import pytest

from shunter.engine.tasks import (
    SortDigitsTask,
    TaskPrompt,
    is_held_out,
    load_reward,
    load_task,
)
from shunter.engine.tasks.sort_digits import reward

REWARD_SPEC = "shunter.engine.tasks.sort_digits:reward"


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("12349", "12349", 1.0),  # exact: 0.8 + 0.1 + 0.1
        ("", "12349", 0.0),  # 0.8 * 0/5
        ("00000", "12349", 0.1),  # right length, no position right
        ("13249", "12349", 0.58),  # positions 0, 3, 4 right: 0.8 * 3/5 + 0.1
        ("123490", "12349", 0.8 * 5 / 6),  # too long by one: 5/6 positions, wrong length
        ("1234", "12349", 0.8 * 4 / 5),  # too short: 4/5, wrong length
        ("1234x", "12349", 0.8 * 4 / 5 + 0.1),  # non-digits are compared literally
        (" 12349\n", "12349", 1.0),  # whitespace is stripped
        ("9", "12349", 0.0),
    ],
)
def test_reward_hand_computed(response: str, answer: str, expected: float) -> None:
    assert reward("31942>", response, answer) == pytest.approx(expected)
    assert SortDigitsTask().reward("31942>", response, answer) == pytest.approx(expected)


def test_reward_stays_in_unit_interval() -> None:
    for response in ["", "1", "99999999999", "abc", "0" * 50, "12349" * 3]:
        assert 0.0 <= reward("31942>", response, "12349") <= 1.0


def test_prompt_format() -> None:
    for p in itertools.islice(SortDigitsTask().train_prompts(0), 500):
        digits, sep, rest = p.text.partition(">")
        assert sep == ">" and rest == ""
        assert digits.isdigit() and 4 <= len(digits) <= 8
        assert p.answer == "".join(sorted(digits))
        assert reward(p.text, p.answer, p.answer) == 1.0


def test_train_stream_deterministic_per_seed() -> None:
    task = SortDigitsTask()
    a = list(itertools.islice(task.train_prompts(7), 200))
    b = list(itertools.islice(SortDigitsTask().train_prompts(7), 200))
    c = list(itertools.islice(task.train_prompts(8), 200))
    assert a == b
    assert a != c
    assert all(isinstance(p, TaskPrompt) for p in a)


def test_validation_held_out_by_hash_rule() -> None:
    task = SortDigitsTask()
    train = list(itertools.islice(task.train_prompts(0), 1000))
    val = task.validation_prompts(100, seed=0)
    assert len(val) == 100 and len({p.text for p in val}) == 100
    assert val == task.validation_prompts(100, seed=0)
    assert all(is_held_out(p.text) for p in val)
    assert not any(is_held_out(p.text) for p in train)
    assert not {p.text for p in val} & {p.text for p in train}
    # the rule holds for any pair of seeds, not just these two
    assert not {p.text for p in task.validation_prompts(50, seed=3)} & {
        p.text for p in itertools.islice(task.train_prompts(3), 1000)
    }


def test_load_task_builtin_and_import() -> None:
    assert isinstance(load_task("sort_digits"), SortDigitsTask)
    assert isinstance(load_task("shunter.engine.tasks.sort_digits:SortDigitsTask"), SortDigitsTask)
    with pytest.raises(ValueError, match="no_such_task"):
        load_task("no_such_task")
    with pytest.raises(ValueError, match="not a class"):
        load_task("shunter.engine.tasks.sort_digits:reward")


def test_load_reward_ok() -> None:
    fn = load_reward(REWARD_SPEC)
    assert fn is reward
    assert fn("31942>", "12349", "12349") == 1.0


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        ("shunter.engine.tasks.no_such_module:reward", "cannot import module 'shunter.engine.tasks.no_such_module'"),
        ("shunter.engine.tasks.sort_digits:no_such_fn", "has no attribute 'no_such_fn'"),
        ("shunter.engine.tasks.sort_digits:SEPARATOR", "not a callable"),
        ("shunter.engine.tasks.sort_digits", "not a built-in (math) nor 'module:function'"),
        ("shunter.engine.tasks.sort_digits:", "must look like"),
    ],
)
def test_load_reward_errors_name_spec_and_cause(spec: str, cause: str) -> None:
    with pytest.raises(ValueError) as info:
        load_reward(spec)
    assert repr(spec) in str(info.value)
    assert cause in str(info.value)
