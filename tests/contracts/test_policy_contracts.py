"""Every policy — the built-ins and the example out-of-tree one — against the policy contract
(``shunter.contract``, also ``shunter check-policy``), one test per (policy, check); and the
contract itself against broken policies: it fails them, naming the policy and the cause, in
bounded time, and a broken policy never fails another policy's checks."""

from __future__ import annotations

import pytest

from shunter import contract
from shunter.policies import BUILTIN

EXAMPLE = "examples.custom_policy:EagerLendPolicy"
POLICIES = sorted(BUILTIN) + [EXAMPLE]
_SUBJECTS: dict[str, contract.Subject] = {}


def subject(name: str) -> contract.Subject:
    if name not in _SUBJECTS:  # one per policy: its recorded trace serves every check
        _SUBJECTS[name] = contract.subject_for(name)
    return _SUBJECTS[name]


@pytest.mark.parametrize("check", list(contract.CHECKS))
@pytest.mark.parametrize("name", POLICIES)
def test_policy_meets_the_contract(name, check):
    (result,) = contract.run_checks(subject(name), only=[check])
    assert result.ok, f"{name} {check}: {result.detail}"


@pytest.mark.parametrize(
    ("broken", "check", "says"),
    [
        ("Raises", "run", "AttributeError: 'EngineView' object has no attribute 'bufer'"),
        ("Raises", "every_event", "raised AttributeError"),
        ("ReturnsNone", "run", "returned None"),
        ("ReturnsBare", "every_event", "returned a bare TrainStep, not a list"),
        ("ReturnsJunk", "every_event", "holding str 'publish' at index 1"),
        ("ReturnsOrder", "every_event", "an order only the coordinator gives"),
        ("Hangs", "every_event", "did not return within run.policy_timeout_s = 0.667s (an endless loop? It was"),
        ("BlockedInC", "every_event", "did not return within run.policy_timeout_s = 0.667s (blocked outside Python"),
        ("Slow", "run", "decide() took more than run.policy_budget_ms = 10 ms in 4 calls"),
        ("Slow", "run", "the coordinator waits for every call to return, so every replica waits that long"),
    ],
)
def test_the_contract_fails_a_broken_policy_with_its_cause_in_bounded_time(broken, check, says):
    s = contract.subject_for(f"tests.support.broken_policies:{broken}")
    s.time_limit_s = 2.0
    (result,) = contract.run_checks(s, only=[check])
    assert not result.ok
    assert says in result.detail, result.detail
    assert result.seconds < 10
    if broken in ("BlockedInC", "Slow"):  # was: "an endless loop?" for a lock; "runs on the coordinator's loop"
        assert "endless loop" not in result.detail and "coordinator's loop" not in result.detail, result.detail


def test_a_broken_policy_does_not_touch_the_checks_of_another():
    bad = contract.run_checks(contract.subject_for("tests.support.broken_policies:Raises"))
    good = contract.run_checks(contract.subject_for("separate"))
    assert not any(r.ok for r in bad if r.check in ("run", "every_event"))
    assert all(r.ok for r in good), [r for r in good if not r.ok]


def test_a_policy_that_re_derives_state_on_resume_resumes():
    """The issue-13 case: setup events reached the policy before RunResumed."""
    results = contract.run_checks(
        contract.subject_for("tests.support.broken_policies:ForgetsOnResume", standalone=1, hybrid=0), only=["resume"]
    )
    assert results[0].ok, results[0].detail


def test_calling_super_init_is_optional():
    results = contract.run_checks(
        contract.subject_for("tests.support.broken_policies:NoSuper", {"patience": 5}), only=["run", "snapshot_restore"]
    )
    assert all(r.ok for r in results), results


def test_a_stuck_policy_in_a_run_is_interrupted_by_the_engine_and_named():
    s = contract.subject_for("tests.support.broken_policies:Hangs")
    s.time_limit_s = 6.0
    (result,) = contract.run_checks(s, only=["run"])
    assert not result.ok and "did not return within run.policy_timeout_s = 2s" in result.detail
    assert result.seconds < 6


def test_a_setup_the_policy_refuses_says_what_the_policy_said():
    import pytest

    with pytest.raises(ValueError, match="it said: needs at least one standalone replica"):
        contract.subject_for("separate", standalone=0, hybrid=1)


def test_the_cli_refuses_bad_usage_once_with_status_2(capsys):
    import pytest

    from shunter.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["check-policy", "separate", "--only", "nosuch"])
    assert exit_.value.code == 2
    assert main(["check-policy", "separate", "--options", '{"kk": 2}']) == 2
    err = capsys.readouterr().err
    assert err.count("unexpected keyword argument 'kk'") == 1


def test_check_policy_says_what_the_policy_did(capsys):
    """A passing check also says what the policy decided in the simulated run: its intents by
    kind, the switches done, its refused intents, the steps — whether it ever lent a replica."""
    import re

    from shunter.cli import main

    assert main(["check-policy", EXAMPLE, "--only", "run"]) == 0
    lends = capsys.readouterr().out
    assert re.search(r"intents: 6 trainer\.train_step, [1-9]\d* replica\.switch_to_rollout", lends), lends
    assert re.search(r"switches: [1-9]\d* to rollout \(hybrid-1 [1-9]\d*x\), [1-9]\d* back to the trainer", lends)
    assert "refused: none" in lends and "steps: 6 of 6" in lends
    assert main(["check-policy", "separate", "--only", "run"]) == 0
    keeps = capsys.readouterr().out
    assert "switches: none — it never lent a hybrid replica to rollout (1 stayed with the trainer)" in keeps, keeps
    assert "replica.switch_to_rollout" not in keeps
