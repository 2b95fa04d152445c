"""The command line: schema, event log printing, and bad configs that exit with a message."""

from __future__ import annotations

import json

from shunter.cli import main
from shunter.events import Codec
from tests.support.golden_cases import CASES


def test_config_schema_prints_documented_json(capsys):
    assert main(["config-schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "RunConfig" in schema["$defs"]


def test_events_prints_a_log_as_json_lines_and_filters_by_tag(tmp_path, capsys):
    codec = Codec()
    log = tmp_path / "events.bin"
    log.write_bytes(b"".join(codec.frame(m) for m in CASES))
    assert main(["events", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(CASES)
    assert main(["events", str(log), "--kind", "trainer.step_end"]) == 0
    only = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["kind"] for x in only] == ["trainer.step_end"]


def test_run_with_a_bad_config_exits_2_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\ntrain_batch_size = 100\n")
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad config" in err and "trainer.train_batch_size (100)" in err


def test_run_resume_from_a_folder_without_checkpoints_exits_2_naming_it(tmp_path, capsys):
    cfg = tmp_path / "ok.toml"
    cfg.write_text("[run]\nprogress = false\n")
    assert main(["run", str(cfg), "--resume", str(tmp_path / "runs" / "gone")]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "gone" in err


def test_exit_statuses_are_one_table_in_the_help_and_the_readme(capsys):
    """``shunter --help`` and the README list the same exit statuses, and the codes the CLI
    returns are among them."""
    import re
    from pathlib import Path

    import pytest

    from shunter import cli

    with pytest.raises(SystemExit):
        main(["--help"])
    helped = capsys.readouterr().out
    readme = (Path(cli.__file__).parent / "README.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", readme, flags=re.M))
    assert {int(k): v for k, v in rows.items()} == cli.EXIT_STATUSES
    for code, meaning in cli.EXIT_STATUSES.items():
        assert f"{code:<4} {meaning}" in helped
    assert {cli.OK, cli.FAILED, cli.USAGE, 130, 143} == set(cli.EXIT_STATUSES)
