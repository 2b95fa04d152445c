"""Per-sample token budgets from a file of lengths (``rollout.length_dist = "file:..."``,
``engine.replica.lengths``): drawn from the file's lengths, reproducibly, capped; a bad file is a
config error naming the file and the line; a relative path is the config's (or the
scenario's) folder's."""

from __future__ import annotations

import pytest

from shunter.engine.config import ConfigError, load_config
from shunter.engine.replica import lengths


def test_budgets_come_from_the_file_reproducibly_and_capped(tmp_path):
    f = tmp_path / "lens.txt"
    f.write_text("# response lengths of a real run\n3 5\n7   40  # a long one\n\n9\n")
    spec = f"file:{f}"
    got = [lengths.budget(spec, 1, f"{g}.{k}", 20) for g in range(50) for k in range(4)]
    assert set(got) == {3, 5, 7, 9, 20}  # every length drawn, 40 capped at max_tokens
    assert got == [lengths.budget(spec, 1, f"{g}.{k}", 20) for g in range(50) for k in range(4)]
    assert got != [lengths.budget(spec, 2, f"{g}.{k}", 20) for g in range(50) for k in range(4)]  # another seed
    assert lengths.budget("", 1, "0.0", 20) == 20


@pytest.mark.parametrize(
    ("text", "why"),
    [("", "holds no lengths"), ("# nothing\n", "holds no lengths"), ("4 5\n6 x7\n", "line 2: 'x7'"), ("3 0", "'0'")],
)
def test_a_bad_length_file_is_a_config_error_naming_file_and_line(tmp_path, text, why):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    cfgfile = tmp_path / "job.toml"
    cfgfile.write_text('[rollout]\nlength_dist = "file:bad.txt"\n')
    with pytest.raises(ConfigError, match="rollout.length_dist") as e:
        load_config(cfgfile)
    assert str(f) in str(e.value) and why in str(e.value)


def test_a_missing_length_file_is_named(tmp_path):
    cfgfile = tmp_path / "job.toml"
    cfgfile.write_text('[rollout]\nlength_dist = "file:nope.txt"\n')
    with pytest.raises(ConfigError, match=r"rollout.length_dist: length file .*nope.txt: cannot be read"):
        load_config(cfgfile)


def test_a_relative_length_file_is_the_config_folders_whatever_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "lens.txt").write_text("4 8\n")
    (tmp_path / "conf" / "job.toml").write_text('[rollout]\nlength_dist = "file:lens.txt"\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config("conf/job.toml")
    assert cfg.rollout.length_dist == f"file:{(tmp_path / 'conf' / 'lens.txt').resolve()}"


def test_a_scenarios_length_files_are_its_folders(tmp_path, monkeypatch):
    from shunter.bench.runner.scenario_file import load

    d = tmp_path / "sc"
    d.mkdir()
    (d / "lens.txt").write_text("4 8\n")
    (d / "s.toml").write_text(
        '[scenario]\nname = "s"\ndescription = "x"\nkind = "sim"\n[cluster]\ngpus = 2\n'
        '[cost]\nlengths_file = "lens.txt"\n[engine]\nrollout = { length_dist = "file:lens.txt" }\n'
        '[[variant]]\nname = "v"\npolicy = "separate"\ntrainer_gpus = 1\n'
        'engine = { rollout = { length_dist = "file:lens.txt" } }\n'
    )
    monkeypatch.chdir(tmp_path)
    sc = load("sc/s.toml")
    want = (d / "lens.txt").resolve()
    assert sc.cost.lengths_file == str(want)
    assert sc.engine["rollout"]["length_dist"] == f"file:{want}"
    assert sc.variant[0].engine["rollout"]["length_dist"] == f"file:{want}"
