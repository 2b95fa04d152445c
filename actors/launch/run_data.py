"""A run's data, loaded once by the launcher before any component starts (DESIGN: data enters
at the launcher, checked once; the coordinator never needs a tokenizer).

Invariant: every prompt a run will draw has been read, checked and counted with the model's own
tokenizer and chat template — as the replicas will tokenize it — before Ray starts an actor; a row
that cannot be used raises ``DataError`` naming its file (or ``train_data[i]``), row and field.
(``Engine.start`` has already opened every file and checked its first rows — ``check_files`` —
before the model was built: this is the one read of every row.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.data.datasets import Dataset, validation_specs
from shunter.engine.data.files import DataError, Row, expand
from shunter.engine.io.errors import describe
from shunter.engine.models.tokenizer import HFTokenizer
from shunter.events import PromptSpec


def load_run_data(
    cfg: EngineConfig,
    model_dir: str,
    train_data: Sequence[Mapping[str, Any]] | None = None,
    val_data: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[Dataset, list[PromptSpec]]:
    """A run's dataset (see ``shunter.engine.coordinator.assemble.run_prompts``), loaded once by the launcher
    before any component starts: the training rows (``data.train_files``, or ``train_data``
    given as objects), their prompts too long for the context left out (counted with the model's
    own tokenizer and chat template, as the replicas will tokenize them), and the validation
    prompts. ``DataError`` names the file (or ``train_data[i]``), row and field of a row that
    cannot be used."""
    from transformers import AutoTokenizer

    d = cfg.data
    tok = HFTokenizer(AutoTokenizer.from_pretrained(model_dir))
    room, limit = cfg.prompt_room()

    def count(row: Row) -> int:
        try:
            return len(tok.render(list(row.messages)) if row.messages else tok.encode(row.text))
        except Exception as e:  # noqa: BLE001 - a chat prompt without a template: said at load, with the row
            raise DataError(f"{row.where}: {describe(e, limit=300)}") from None

    def load(records: Sequence[Mapping[str, Any]] | None, files: list[str], what: str) -> Dataset:
        if records is not None:
            return Dataset.from_records(records, what, count_tokens=count, max_prompt_tokens=room, limit=limit)
        return Dataset.load(expand(files, what=f"data.{what}"), count_tokens=count, max_prompt_tokens=room, limit=limit)

    train = load(train_data, d.train_files, "train_data" if train_data is not None else "train_files")
    val: list[PromptSpec] = []
    if val_data is not None or d.val_files:
        held = load(val_data, d.val_files, "val_data" if val_data is not None else "val_files")
        val = validation_specs(held, cfg.validation.prompts)
    return train, val
