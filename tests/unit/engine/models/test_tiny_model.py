"""The tiny offline model: tokenizer contract, idempotent atomic builds, broken dirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from shunter.engine.models.tiny import (  # noqa: E402
    MARKER,
    SYMBOLS,
    build_tiny_model,
    main,
    read_marker,
    score,
)
from shunter.engine.tasks import load_task  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", sft_steps=2)


def test_files_and_marker(model_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER):
        assert (model_dir / name).is_file(), name
    marker = read_marker(model_dir)
    assert marker is not None
    assert marker["params"]["sft_steps"] == 2 and marker["params"]["task"] == "sort_digits"
    assert 400_000 < marker["n_parameters"] < 600_000
    assert len(marker["sft_losses"]) == 2
    assert not [p for p in model_dir.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_tokenizer_round_trip_and_no_special_tokens(model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "31942>12349"
    ids = tok.encode(text)
    assert ids == tok.encode(text, add_special_tokens=False) == tok(text)["input_ids"]
    assert len(ids) == len(text)  # one id per symbol, nothing added
    assert tok.decode(ids) == text
    assert tok.bos_token_id is None
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == (SYMBOLS[0], 0, SYMBOLS[1], 1)
    assert tok.decode(ids + [0, 1], skip_special_tokens=True) == text


def test_vocab_size_and_config(model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert len(tok) == 42 == len(SYMBOLS)
    assert sorted(tok.get_vocab().values()) == list(range(42))
    assert [tok.convert_tokens_to_ids(s) for s in SYMBOLS] == list(range(42))
    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.vocab_size == 42 and cfg.eos_token_id == 0 and cfg.pad_token_id == 1
    assert cfg.tie_word_embeddings


def test_model_generates(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    task = load_task("sort_digits")
    mean, exact = score(model, tok, task, task.validation_prompts(8, seed=0), temperature=1.0)
    assert 0.0 <= exact <= mean <= 1.0  # an exact answer scores 1, anything else less


def test_second_call_does_not_rebuild(model_dir: Path) -> None:
    before = (model_dir / MARKER).stat().st_mtime_ns, (model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(model_dir, sft_steps=2) == model_dir
    after = (model_dir / MARKER).stat().st_mtime_ns, (model_dir / "model.safetensors").stat().st_mtime_ns
    assert before == after


def test_changed_params_or_force_rebuild(tmp_path: Path) -> None:
    out = build_tiny_model(tmp_path / "m", sft_steps=1)
    first = read_marker(out)["built_at"]
    assert read_marker(build_tiny_model(out, sft_steps=1))["built_at"] == first
    assert read_marker(build_tiny_model(out, sft_steps=0))["params"]["sft_steps"] == 0
    again = read_marker(build_tiny_model(out, sft_steps=0, force=True))
    assert again["built_at"] != first and again["params"]["sft_steps"] == 0


def test_a_tasks_revision_is_in_the_marker_and_a_changed_one_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shunter.engine.tasks import word_problems

    rev = word_problems.WordProblemsTask.revision
    out = build_tiny_model(tmp_path / "m", "word_problems", sft_steps=0)
    first = read_marker(out)
    assert first["params"]["task_revision"] == rev
    assert read_marker(build_tiny_model(out, "word_problems", sft_steps=0))["built_at"] == first["built_at"]
    monkeypatch.setattr(word_problems.WordProblemsTask, "revision", rev + 1)
    again = read_marker(build_tiny_model(out, "word_problems", sft_steps=0))
    assert again["built_at"] != first["built_at"] and again["params"]["task_revision"] == rev + 1
    # a task without a revision (sort_digits) keeps the marker it always had
    assert "task_revision" not in read_marker(build_tiny_model(tmp_path / "s", sft_steps=0))["params"]


def test_broken_dirs_are_rebuilt(tmp_path: Path) -> None:
    half = tmp_path / "half"  # a crashed foreign write: files but no marker
    half.mkdir()
    (half / "config.json").write_text("{not json")
    assert read_marker(build_tiny_model(half, sft_steps=0)) is not None
    assert json.loads((half / "config.json").read_text())["vocab_size"] == 42

    corrupt = tmp_path / "corrupt"  # a marker that does not parse
    corrupt.mkdir()
    (corrupt / MARKER).write_text("{")
    assert read_marker(build_tiny_model(corrupt, sft_steps=0))["params"]["sft_steps"] == 0

    nested = tmp_path / "a" / "b" / "c"  # missing parents are created
    assert build_tiny_model(nested, sft_steps=0).is_dir()

    stale = tmp_path / ".fresh.tmp-crashed"  # a leftover temp dir from a killed build
    stale.mkdir()
    build_tiny_model(tmp_path / "fresh", sft_steps=0)
    assert not stale.exists()


def test_out_dir_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(NotADirectoryError):
        build_tiny_model(target, sft_steps=0)


def test_foreign_dir_is_never_replaced(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="notes.txt"):
        build_tiny_model(target, sft_steps=0)
    assert (target / "notes.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # nothing built or left beside it


def test_cli_reuses_and_reports(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main([str(model_dir), "--sft-steps", "2", "--samples", "8"])
    out = capsys.readouterr().out
    assert out.startswith("reused ")
    assert "sampled reward" in out
