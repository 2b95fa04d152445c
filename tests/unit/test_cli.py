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


def test_a_failed_run_ends_with_the_resume_line_of_its_last_checkpoint(tmp_path, capsys, monkeypatch):
    """Exit 1 for a run that failed says how to go on: ``--resume <run folder>`` and the step of
    its newest checkpoint that verifies (or that none was saved) — once, not where the error
    says it already (a checkpoint that cannot be saved, a restart with no room)."""
    from shunter import progress
    from shunter.engine.io.checkpoint import CheckpointStore
    from shunter.events import RunEnded

    run = tmp_path / "runs" / "r1"
    store = CheckpointStore(run / "checkpoints")
    staging = store.staging(4)
    (staging / "trainer.pt").write_bytes(b"x")
    store.commit(staging, run_id="r1", step=4, version=2)
    config = tmp_path / "c.toml"
    config.write_text('[run]\nname = "c"\n')
    errors = iter(["stalled: nothing in flight", "checkpoint ...; continue with --resume X", "crash"])

    async def failed(cfg, **kw):
        progress.RUN_DIR = run if "crash" not in (e := next(errors)) else tmp_path / "runs" / "r2"
        return RunEnded(reason="error", steps=7, error=e, run_id="r1", source="coordinator", wall_time=1.0)

    monkeypatch.setattr(progress, "run_with_progress", failed)
    monkeypatch.setattr(progress, "RUN_DIR", None)  # put back after the test
    said = []
    for _ in range(3):
        assert main(["run", str(config), "--no-progress"]) == 1
        said.append(capsys.readouterr().err.strip())
    assert (
        said[0] == f"shunter: the run failed: stalled: nothing in flight; continue it with --resume {run} (from step 4)"
    )
    assert said[1] == "shunter: the run failed: checkpoint ...; continue with --resume X"
    assert said[2].startswith("shunter: the run failed: crash; no checkpoint was saved, so there is nothing to resume")
