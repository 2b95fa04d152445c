"""Prompt datasets from files in verl's layout (parquet or JSONL), and the stream a run draws.

A row holds ``prompt`` (a list of chat messages ``{"role", "content"}``, or a plain string
for a base model), ``data_source`` (a string: which reward rule applies; a row without one
gets its file's base name, counted in ``data/source_from_file_name``), ``reward_model``
(a struct whose ``ground_truth`` the reward compares against; ``style`` is ignored) and,
optionally, ``extra_info`` (a struct passed to the reward function as a dict). Other columns
are ignored. A file that cannot be read (damaged, not UTF-8, not JSON), lacks a column or
holds a value of the wrong type raises :class:`DataError` naming the file, and the row
(parquet: ``row N``) or line (JSONL: ``line N``, blank lines counted) and the field.

How a file's values become a row's:

- parquet is read with ``pyarrow.parquet``: a numeric ``ground_truth`` is the column's type
  written by Python's ``str`` (an int exactly, a float by its shortest repr: ``3.0`` stays
  ``"3.0"``); ``extra_info`` is a struct column, so a key some other row has and this row
  lacks is ``None`` in its dict (as verl's own datasets give it);
- JSONL (``.jsonl``, ``.json``) is read line by line with Python's ``json``, one object a
  line: a number keeps its literal (``3`` -> ``"3"``, ``12345678901234567890`` stays exact,
  ``1.50`` -> ``"1.50"``) and ``extra_info`` is the row's own object, no key added. (pyarrow's
  JSON reader infers one type per column, so ``3`` beside a big int reads as ``"3.0"`` and an
  explicit string type refuses numbers; it also numbers failing rows per block.)

Invariants:

- the training stream is a pure function of the rows and the seed: epoch ``e`` visits every
  kept row once, in the order ``random.Random(f"{seed}:{e}")`` shuffles them to (file order
  with ``shuffle = False``), so a run resumed after ``k`` prompts continues the same epoch
  at the same place (:meth:`PromptStream.skip`);
- a prompt longer than the room the context leaves (``max_prompt_tokens``) never reaches a
  replica: it is filtered out once at load, counted per file and reported, never a crash;
- a file is read once however often it is named (paths compare resolved);
- prompt ids are the row's position in the stream (``epoch * rows + i``) for training and
  ``-1 - i`` for validation, so the two never collide.

Nothing here imports torch, Ray or vLLM; pyarrow is imported when a parquet file is read.

Reading the files (:func:`expand`, :func:`read_rows`, :class:`Row`, :class:`DataError`) is
``engine/data/files.py``'s job; which stream a run draws (a dataset's or its task's) is decided
where the run is assembled (``engine/coordinator/assemble.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shunter.engine.data.files import (
    DataError,
    Row,
    kind_of,
    parse_row,
    read_rows,
    unique_files,
)
from shunter.events import PromptSpec


@dataclass
class Dataset:
    """The rows kept from some files, and what was left out."""

    rows: list[Row]
    files: list[Path]
    too_long: dict[str, int] = field(default_factory=dict)
    """file -> prompts filtered out as longer than ``max_prompt_tokens``."""
    unnamed: dict[str, int] = field(default_factory=dict)
    """file -> rows kept without a ``data_source``, given the file's base name as theirs."""

    @classmethod
    def load(
        cls,
        files: Sequence[Path],
        *,
        count_tokens: Callable[[Row], int] | None = None,
        max_prompt_tokens: int = 0,
        limit: str = "",
    ) -> Dataset:
        """The rows of ``files`` (each read once), those longer than ``max_prompt_tokens`` left
        out; ``limit`` names the setting that limit comes from (``EngineConfig.prompt_room``)."""
        if not files:
            raise DataError("no data file given: name at least one parquet or JSONL file")
        unique = unique_files(files)
        return cls._kept([(str(f), read_rows(f)) for f in unique], unique, count_tokens, max_prompt_tokens, limit)

    @classmethod
    def from_records(
        cls,
        records: Sequence[Mapping[str, Any]],
        name: str,
        *,
        count_tokens: Callable[[Row], int] | None = None,
        max_prompt_tokens: int = 0,
        limit: str = "",
    ) -> Dataset:
        """Rows given as objects (``Engine(train_data=...)``): dicts in verl's layout, checked as a
        file's rows are (``DataError`` names ``name[i]`` and the field)."""
        if isinstance(records, str | bytes) or not isinstance(records, Sequence):
            raise DataError(f"{name}: expected a list of rows (dicts in verl's layout), got {kind_of(records)}")
        if not records:
            raise DataError(f"{name}: holds no rows")
        rows = []
        for i, r in enumerate(records):
            if not isinstance(r, Mapping):
                raise DataError(f"{name}[{i}]: is {kind_of(r)}; expected a dict with 'prompt' and 'reward_model'")
            rows.append(parse_row(Path(name), f"{name}[{i}]", dict(r)))
        return cls._kept([(name, rows)], [], count_tokens, max_prompt_tokens, limit)

    @classmethod
    def _kept(
        cls,
        sources: list[tuple[str, list[Row]]],
        files: list[Path],
        count_tokens: Callable[[Row], int] | None,
        max_prompt_tokens: int,
        limit: str,
    ) -> Dataset:
        rows: list[Row] = []
        too_long: dict[str, int] = {}
        unnamed: dict[str, int] = {}
        for source, source_rows in sources:
            for r in source_rows:
                if not r.named:
                    unnamed[source] = unnamed.get(source, 0) + 1
                if max_prompt_tokens and count_tokens is not None and count_tokens(r) > max_prompt_tokens:
                    too_long[source] = too_long.get(source, 0) + 1
                else:
                    rows.append(r)
        if not rows:
            limit = limit or "data.max_prompt_tokens, or when 0 rollout.max_model_len - rollout.max_tokens"
            raise DataError(
                f"no prompt left in {', '.join(s for s, _ in sources)}: all {sum(too_long.values())} are longer "
                f"than {max_prompt_tokens} tokens ({limit})"
            )
        return cls(rows=rows, files=files, too_long=too_long, unnamed=unnamed)


class PromptStream(Iterator[PromptSpec]):
    """Epoch after epoch over a dataset's rows (``epochs = 0``: without end); see the module's invariants."""

    def __init__(self, data: Dataset, seed: int, *, shuffle: bool = True, epochs: int = 0) -> None:
        self.data, self.seed, self.shuffle, self.epochs = data, seed, shuffle, epochs
        self.taken = 0
        self._order: list[int] = []
        self._epoch = -1

    @property
    def epoch(self) -> int:
        """The epoch the next prompt comes from."""
        return self.taken // len(self.data.rows)

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            order = list(range(len(self.data.rows)))
            if self.shuffle:
                random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._order, self._epoch = order, epoch
        return self._order

    def metrics(self) -> dict[str, float]:
        """For the run summary: rows kept, prompts left out as too long, rows without a
        ``data_source`` (they carry their file's base name), epochs begun."""
        return {
            "data/rows": float(len(self.data.rows)),
            "data/filtered_too_long": float(sum(self.data.too_long.values())),
            "data/source_from_file_name": float(sum(self.data.unnamed.values())),
            "data/epoch": float(self.taken / len(self.data.rows)),
        }

    def skip(self, n: int) -> None:
        """Move on ``n`` prompts without drawing them (a resumed run's position)."""
        if n < 0:
            raise ValueError(f"PromptStream.skip({n}): the stream only moves forward")
        self.taken += n

    def __next__(self) -> PromptSpec:
        n = len(self.data.rows)
        epoch, i = divmod(self.taken, n)
        if self.epochs and epoch >= self.epochs:
            raise StopIteration
        row = self.data.rows[self._order_of(epoch)[i]]
        self.taken += 1
        return row.spec(self.taken - 1)


def validation_specs(data: Dataset, n: int) -> list[PromptSpec]:
    """The first ``n`` rows (file order) as validation prompts (ids ``-1, -2, ...``)."""
    return [r.spec(-1 - i) for i, r in enumerate(data.rows[:n])]
