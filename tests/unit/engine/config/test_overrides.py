"""How overrides combine with a config file (issue 46): a section merges field by field, a field's
value — a table too — replaces the file's whole, and an override naming another policy drops the
file's policy options (docs/configuration.md, "Overrides")."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from shunter.engine.config import ConfigError, load_config, merge

ROOT = Path(__file__).resolve().parents[4]


def lend_toml(tmp_path: Path) -> tuple[Path, dict]:
    """``examples/sort_separate.toml`` lending a hybrid replica with the options of
    ``bench/scenarios/long_tail.toml``'s "lend first batch" variant: a real config file whose
    ``run.policy_options`` only ``lend_when_idle`` takes."""
    variants = tomllib.loads((ROOT / "bench" / "scenarios" / "long_tail.toml").read_text())["variant"]
    options = next(v["policy_options"] for v in variants if v["name"].startswith("lend first batch"))
    inline = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in options.items()) + " }"
    text = (ROOT / "examples" / "sort_separate.toml").read_text()
    text, n = re.subn(r'(?m)^policy = "separate"$', f'policy = "lend_when_idle"\npolicy_options = {inline}', text)
    text, m = re.subn(r"(?m)^standalone_replicas = 1$", "standalone_replicas = 1\nhybrid_replicas = 1", text)
    assert n == m == 1, "examples/sort_separate.toml changed: this test edits its policy and replicas"
    path = tmp_path / "lend.toml"
    path.write_text(text)
    assert load_config(path).run.policy_options == options  # as the file says
    return path, options


def test_the_issue_example_runs_the_policy_named_with_the_options_given(tmp_path):
    """``load_config(f, {"run": {"policy": "separate", "policy_options": {}}})`` kept the file's
    ``policy_options`` (the tables were merged) and ``separate`` refused them."""
    path, _ = lend_toml(tmp_path)
    cfg = load_config(path, {"run": {"policy": "separate", "policy_options": {}}})
    assert (cfg.run.policy, cfg.run.policy_options) == ("separate", {})


def test_another_policy_named_without_options_drops_the_files_options(tmp_path):
    path, options = lend_toml(tmp_path)
    cfg = load_config(path, {"run": {"policy": "separate"}})
    assert (cfg.run.policy, cfg.run.policy_options) == ("separate", {})
    cfg = load_config(path, {"run": {"policy": "lend_when_idle", "total_steps": 5}})  # the same policy: its options
    assert cfg.run.policy_options == options and cfg.run.total_steps == 5
    cfg = load_config(path, {"run": {"policy": "separate", "policy_options": {"tail_replicas": 1}}})
    assert cfg.run.policy_options == {"tail_replicas": 1}  # given beside it: the new policy's own
    # a file naming no policy has the default's: naming that keeps them, naming another drops them
    plain = tmp_path / "plain.toml"
    plain.write_text("[run]\npolicy_options = { tail_replicas = 1 }\n[rollout]\nhybrid_replicas = 1\n")
    assert load_config(plain, {"run": {"policy": "separate"}}).run.policy_options == {"tail_replicas": 1}
    assert load_config(plain, {"run": {"policy": "lend_when_idle"}}).run.policy_options == {}


def test_shunter_run_policy_runs_the_named_policy_without_the_files_options(tmp_path, monkeypatch):
    """``shunter run lend.toml --policy separate``: the CLI's override is the same rule (the run
    itself is not started here: the config it would run is taken)."""
    from shunter import cli, progress

    path, _ = lend_toml(tmp_path)
    taken = []

    async def run(cfg, **kw):
        taken.append(cfg)
        raise KeyboardInterrupt

    monkeypatch.setattr(progress, "run_with_progress", run)
    monkeypatch.setattr(progress, "exit_on_next_signal", lambda: 130)
    assert cli.main(["run", str(path), "--policy", "separate", "--no-progress"]) == 130
    assert (taken[0].run.policy, taken[0].run.policy_options) == ("separate", {})


def test_a_table_valued_field_is_replaced_whole_and_a_section_merges_field_by_field(tmp_path):
    path, _ = lend_toml(tmp_path)
    cfg = load_config(path, {"run": {"policy_options": {"switch_cost_prior_s": 0.5}}})
    assert cfg.run.policy == "lend_when_idle" and cfg.run.policy_options == {"switch_cost_prior_s": 0.5}
    assert cfg.run.name == "sort-separate" and cfg.run.checkpoint_every == 50  # the file's other fields stay
    p = tmp_path / "nodes.toml"
    p.write_text("[trainer]\nresources = { node_a = 1 }\nlr = 1e-3\n[rollout]\nengine_args = { seed = 3 }\n")
    cfg = load_config(p, {"trainer": {"resources": {"node_b": 1}}, "rollout": {"engine_args": {}}})
    assert cfg.trainer.resources == {"node_b": 1} and cfg.trainer.lr == 1e-3 and cfg.rollout.engine_args == {}


def test_merge_layers_overrides_by_the_same_rule_and_changes_neither(tmp_path):
    base = {"run": {"policy": "lend_when_idle", "policy_options": {"first_batch": True}}, "trainer": {"lr": 1.0}}
    over = {"run": {"policy": "separate"}, "trainer": {"resources": {"node_b": 1.0}}}
    before = json.dumps([base, over])
    out = merge(base, over)
    assert out == {"run": {"policy": "separate"}, "trainer": {"lr": 1.0, "resources": {"node_b": 1.0}}}
    assert json.dumps([base, over]) == before
    # the options given in a later layer are the new policy's
    assert merge(out, {"run": {"policy_options": {"tail_replicas": 1}}})["run"]["policy_options"] == {
        "tail_replicas": 1
    }


def test_options_the_named_policy_refuses_still_name_the_override(tmp_path):
    path, _ = lend_toml(tmp_path)
    with pytest.raises(
        ConfigError, match=r"run.policy = 'separate'.*unexpected keyword argument 'first_batch'.*overrides given"
    ):
        load_config(path, {"run": {"policy": "separate", "policy_options": {"first_batch": True}}})
