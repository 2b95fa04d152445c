"""Model folders as operators get them wrong (issue 14): each is named before Ray or vLLM
starts, by ``shunter run`` too, with a status of 1 and no traceback."""

from __future__ import annotations

import json

import pytest

from shunter.cli import main
from shunter.engine.io.errors import EngineSetupError
from shunter.engine.models.folder import check_model_dir


def _model(tmp_path, **skip):
    d = tmp_path / "model"
    d.mkdir()
    if "config" not in skip:
        (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    if "weights" not in skip:
        (d / "model.safetensors").write_bytes(b"x")
    if "tokenizer" not in skip:
        (d / "tokenizer.json").write_text("{}")
    return d


@pytest.mark.parametrize(
    "break_it, why",
    [
        (lambda d: d / "missing", "does not exist"),
        (lambda d: d / "model.safetensors", "is a file, not a model folder"),
        (lambda d: (d / "config.json").unlink() or d, "no config.json"),
        (lambda d: (d / "config.json").write_bytes(b"\xff{oops") and d, "config.json is unreadable"),
        (lambda d: (d / "config.json").write_text("[1, 2]") and d, "names no model_type"),
        (lambda d: (d / "model.safetensors").unlink() or d, "no weights"),
        (lambda d: (d / "tokenizer.json").unlink() or d, "no tokenizer"),
    ],
    ids=["missing", "a-file", "no-config", "garbage-config", "not-a-model-config", "no-weights", "no-tokenizer"],
)
def test_a_folder_that_is_not_a_model_is_named_with_the_cause(tmp_path, break_it, why):
    bad = break_it(_model(tmp_path))
    with pytest.raises(EngineSetupError, match=why) as err:
        check_model_dir(bad)
    assert str(bad) in str(err.value)


def test_a_model_folder_passes(tmp_path):
    d = _model(tmp_path)
    assert check_model_dir(d) == d.resolve()


def test_shunter_run_says_so_before_ray_starts(tmp_path, capsys, monkeypatch):
    from shunter.actors.launch.run_site import RunSite

    def no_ray(self):
        raise AssertionError("Ray was started for a run that cannot start")

    monkeypatch.setattr(RunSite, "_init_ray", no_ray)
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[model]\npath = "{tmp_path / "nowhere"}"\nbuild_tiny = ""\n[run]\noutput_dir = "{tmp_path}"\n')
    assert main(["run", str(cfg), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "the run did not start: model.path" in err and "does not exist" in err and "Traceback" not in err


@pytest.mark.parametrize("steps", ["0", "-3", "ten"])
def test_steps_must_be_a_count_of_one_or_more(tmp_path, capsys, steps):
    """Was: ``--steps 0`` silently meant "the config's steps"."""
    with pytest.raises(SystemExit) as ex:
        main(["run", str(tmp_path / "job.toml"), "--steps", steps])
    assert ex.value.code == 2 and "--steps" in capsys.readouterr().err
