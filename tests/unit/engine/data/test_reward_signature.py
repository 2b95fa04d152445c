"""A reward of verl's names must take verl's whole call: verl passes ``data_source``,
``solution_str`` and ``ground_truth`` by name, so one that cannot take all three is refused
when it is loaded, naming the function and what it lacks (was: accepted, and trained with
``ground_truth`` never passed)."""

from __future__ import annotations

import pytest

from shunter.engine.config import ConfigError, from_dict
from shunter.engine.tasks import as_scorer, load_reward
from shunter.events.data import PromptSpec

P = PromptSpec(prompt_id=0, text="31>", answer="13", data_source="sort_digits", extra_info={"index": 4})


def test_a_verl_reward_without_ground_truth_is_refused_at_load(tmp_path, monkeypatch):
    (tmp_path / "two_verl.py").write_text("def compute_score(data_source, solution_str):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    says = r"reward function compute_score takes verl's data_source, solution_str but not ground_truth"
    with pytest.raises(ValueError, match=says):
        load_reward("two_verl:compute_score")
    with pytest.raises(ConfigError, match=r"task.reward = 'two_verl:compute_score': .*but not ground_truth"):
        from_dict({"task": {"reward": "two_verl:compute_score"}})  # the config is refused when it loads


@pytest.mark.parametrize(
    ("fn", "missing"),
    [
        (lambda data_source, solution_str: 0.0, "ground_truth"),
        (lambda solution_str, ground_truth: 0.0, "data_source"),
        (lambda ground_truth, extra_info=None: 0.0, "data_source, solution_str"),
        (lambda data_source, solution_str, *rest: 0.0, "ground_truth"),  # by name, *rest gets nothing
        (lambda data_source, solution_str, answer=None: 0.0, "ground_truth"),
    ],
)
def test_a_verl_reward_that_cannot_take_verls_call_is_refused_naming_what_is_missing(fn, missing):
    with pytest.raises(ValueError, match=rf"but not {missing}: .*must take {missing} \(or \*\*kwargs\)"):
        as_scorer(fn)


@pytest.mark.parametrize(
    "fn",
    [
        lambda data_source, solution_str, ground_truth, extra_info=None: (data_source, solution_str, ground_truth),
        lambda data_source, solution_str, ground_truth: (data_source, solution_str, ground_truth),
        lambda solution_str, ground_truth, data_source=None, extra_info=None: (data_source, solution_str, ground_truth),
        lambda data_source, solution_str, ground_truth=None, **kw: (data_source, solution_str, ground_truth),
        lambda solution_str, **kw: (kw["data_source"], solution_str, kw["ground_truth"]),
        lambda data_source, solution_str, ground_truth, extra_info=None, scale=1.0: (
            data_source,
            solution_str,
            ground_truth,
        ),
    ],
)
def test_verl_rewards_that_take_verls_call_are_still_accepted(fn):
    assert as_scorer(fn)(P, "13") == ("sort_digits", "13", "13")
