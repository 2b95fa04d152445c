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
"""

from __future__ import annotations

import glob
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shunter.events import ChatMessage, PromptSpec

if TYPE_CHECKING:
    from shunter.engine.config import EngineConfig

SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}


class DataError(ValueError):
    """A dataset file cannot be used: the message names the file, and the row and field where known."""


@dataclass(frozen=True, slots=True)
class Row:
    """One prompt as a file holds it (before the stream numbers it)."""

    messages: tuple[ChatMessage, ...]
    """The chat prompt; empty when the row gives a plain string (``text``)."""
    text: str
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any]
    where: str
    """``file:row N`` (parquet) or ``file:line N`` (JSONL), 1-based, for messages that name it."""
    named: bool = True
    """False: the row had no ``data_source``; ``data_source`` is its file's base name (counted)."""

    def spec(self, prompt_id: int) -> PromptSpec:
        return PromptSpec(
            prompt_id=prompt_id,
            text=self.text,
            answer=self.ground_truth,
            messages=list(self.messages),
            data_source=self.data_source,
            extra_info=self.extra_info,
        )


def expand(paths: Sequence[str], base: Path | None = None, what: str = "data.train_files") -> list[Path]:
    """Paths and globs (relative ones from ``base``) -> the files, in the order given, each once
    (two spellings of one file, ``./a.parquet`` and ``a.parquet``, are one)."""
    out: list[Path] = []
    for p in paths:
        raw = Path(p).expanduser()
        full = raw if raw.is_absolute() or base is None else base / raw
        hits = sorted(glob.glob(str(full), recursive=True)) if glob.has_magic(str(full)) else [str(full)]
        if not hits:
            raise DataError(f"{what}: {p!r} matches no file")
        for h in hits:
            f = Path(h)
            if not f.exists():
                raise DataError(f"{what}: {p!r} matches no file ({f} does not exist)")
            if not f.is_file():
                raise DataError(f"{what}: {f} is not a file" + (" (a directory)" if f.is_dir() else ""))
            if f.suffix.lower() not in SUFFIXES:
                raise DataError(f"{f}: unknown format {f.suffix!r}; give .parquet or .jsonl")
            out.append(f)
    return _once(out)


def _once(files: Sequence[Path]) -> list[Path]:
    """``files`` in order, each once: two spellings of one file (``./a.parquet``, ``a.parquet``) are one."""
    seen: set[Path] = set()
    out = []
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            out.append(f)
    return out


Record = tuple[str, dict[str, Any]]
"""One row as the file holds it: where it is (``file:row N`` / ``file:line N``) and its fields."""


def _parquet(path: Path) -> tuple[list[str], list[Record]]:
    """The file's columns and its rows (only the columns a row uses are converted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        used = [c for c in ("prompt", "reward_model", "data_source", "extra_info") if c in table.column_names]
        values = table.select(used).to_pylist()
    except (pa.ArrowException, OSError, ValueError, ArithmeticError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: cannot be read as parquet: {first}") from None
    return list(table.column_names), [(f"{path}:row {i + 1}", v) for i, v in enumerate(values)]


class _JsonFloat(float):
    """A JSON number with a fraction or exponent, and the literal it was written as."""

    __slots__ = ("literal",)
    literal: str


def _json_float(literal: str) -> float:
    f = _JsonFloat(literal)
    f.literal = literal
    return f


def _jsonl(path: Path) -> tuple[list[str], list[Record]]:
    """The keys the file's objects have (first seen first) and its rows, one JSON object a line."""
    columns: dict[str, None] = {}
    out: list[Record] = []
    try:
        with path.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                where = f"{path}:line {n}"
                line = _decoded(raw, where, first=n == 1).rstrip("\r\n")
                if line.strip():
                    value = _object(line, where, first=not out)
                    columns.update(dict.fromkeys(value))
                    out.append((where, value))
    except OSError as e:
        raise DataError(f"{path}: cannot be read: {e.strerror or e}") from None
    return list(columns), out


def _decoded(raw: bytes, where: str, *, first: bool) -> str:
    """A line as text (the first may start with a byte-order mark)."""
    try:
        return raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at byte {e.start + 1} of the line)") from None


def _object(line: str, where: str, *, first: bool) -> dict[str, Any]:
    """One line's JSON object; a JSON array (a ``.json`` file of a list) is said to be one."""
    try:
        value = json.loads(line, parse_float=_json_float)
    except json.JSONDecodeError as e:
        # json's messages may end in "at" ("Unterminated string starting at"): one "at" here
        value, cause = None, f"not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
    except ValueError as e:  # an int longer than Python parses
        value, cause = None, f"not valid JSON ({e})"
    else:
        cause = "" if isinstance(value, dict) else f"a {_kind(value)}, not an object"
    if cause:
        if first and line.lstrip().startswith("["):
            cause = "the file holds a JSON array"
        raise DataError(f"{where}: {cause}; expected JSONL (one JSON object per line)")
    out: dict[str, Any] = value
    return out


def _text(value: Any, where: str, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, _JsonFloat):
        return value.literal  # a JSON number as its file wrote it
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # a numeric answer: the reward compares text
    raise DataError(f"{where}: field {name!r} is {_kind(value)}; expected a string")


def _kind(value: Any) -> str:
    if value is None:
        return "missing (null)"
    return "float" if isinstance(value, float) else type(value).__name__


def _messages(value: Any, where: str) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field 'prompt' is {_kind(value)}; expected a list of chat messages or a string")
    out = []
    for k, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: field 'prompt[{k}]' is {m!r:.80}; expected {{'role': str, 'content': str}}")
        out.append(ChatMessage(role=m["role"], content=m["content"]))
    return tuple(out)


def read_rows(path: Path) -> list[Row]:
    """Every row of one file, checked; ``DataError`` names the file, row and field at fault."""
    columns, records = _parquet(path) if SUFFIXES[path.suffix.lower()] == "parquet" else _jsonl(path)
    if not records:
        raise DataError(f"{path}: holds no rows")
    missing = [c for c in ("prompt", "reward_model") if c not in columns]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (it has {', '.join(columns)})")
    return [_row(path, where, value) for where, value in records]


def _row(path: Path, where: str, value: dict[str, Any]) -> Row:
    prompt = value.get("prompt")
    messages, text = ((), prompt) if isinstance(prompt, str) else (_messages(prompt, where), "")
    rm = value.get("reward_model")
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise DataError(f"{where}: field 'reward_model' is {rm!r:.80}; expected a struct with 'ground_truth'")
    source, extra = value.get("data_source"), value.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' is {_kind(extra)}; expected a struct (a dict)")
    return Row(
        messages=messages,
        text=text,
        data_source=path.stem if source is None else _text(source, where, "data_source"),
        ground_truth=_text(rm["ground_truth"], where, "reward_model.ground_truth"),
        extra_info=_plain(extra or {}),
        where=where,
        named=source is not None,
    )


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """``extra_info`` as plain JSON values (pyarrow gives dates, decimals, bytes for some types)."""
    out: dict[str, Any] = json.loads(json.dumps(d, default=str))
    return out


def prompt_room(cfg: EngineConfig) -> tuple[int, str]:
    """The prompt length in force, and the setting that sets it: ``data.max_prompt_tokens``,
    or (when 0) the context the response leaves, ``rollout.max_model_len - rollout.max_tokens``."""
    if cfg.data.max_prompt_tokens:
        return cfg.data.max_prompt_tokens, "data.max_prompt_tokens"
    return cfg.rollout.max_model_len - cfg.rollout.max_tokens, "rollout.max_model_len - rollout.max_tokens"


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
        out; ``limit`` names the setting that limit comes from (:func:`prompt_room`)."""
        if not files:
            raise DataError("no data file given: name at least one parquet or JSONL file")
        unique = _once(files)
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
            raise DataError(f"{name}: expected a list of rows (dicts in verl's layout), got {_kind(records)}")
        if not records:
            raise DataError(f"{name}: holds no rows")
        rows = []
        for i, r in enumerate(records):
            if not isinstance(r, Mapping):
                raise DataError(f"{name}[{i}]: is {_kind(r)}; expected a dict with 'prompt' and 'reward_model'")
            rows.append(_row(Path(name), f"{name}[{i}]", dict(r)))
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


def run_prompts(
    cfg: EngineConfig, data: tuple[Dataset, list[PromptSpec]] | None = None
) -> tuple[Iterator[PromptSpec], list[PromptSpec]]:
    """A run's training stream and validation prompts: a dataset's (``data``: its rows and
    validation prompts, when ``data.train_files`` is set), else the task's own."""
    if data is not None:
        train, val = data
        return PromptStream(train, cfg.run.seed, shuffle=cfg.data.shuffle, epochs=cfg.data.epochs), val
    from shunter.engine.tasks import load_task

    task = load_task(cfg.task.name)
    prompts = (
        PromptSpec(prompt_id=i, text=p.text, answer=p.answer) for i, p in enumerate(task.train_prompts(cfg.run.seed))
    )
    val = [
        PromptSpec(prompt_id=-1 - i, text=p.text, answer=p.answer)
        for i, p in enumerate(task.validation_prompts(cfg.validation.prompts, cfg.run.seed))
    ]
    return prompts, val
