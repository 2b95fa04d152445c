"""Prompt files in verl's layout (``engine/data/datasets.py`` describes it): naming them
(:func:`expand`: paths and globs), checking each cheaply before a run starts (:func:`check_files`:
its schema and first rows) and reading each into checked :class:`Row` s (:func:`read_rows`:
parquet through pyarrow, JSONL through Python's ``json``).

Invariant: a file that cannot be used — unreadable, damaged, not UTF-8, not JSON objects, a
column missing, a value of the wrong type — raises :class:`DataError` naming the file, the row
(``row N``) or line (``line N``) and the field, never a crash further on; a file named twice
(two spellings of one path) is read once. :func:`check_file` makes the checks :func:`read_rows`
makes, on the file's first :data:`FIRST_ROWS` rows only (a parquet file's schema and first
batch, a JSONL file's first lines), so a file that is not one, is empty or lacks a column is
refused before the model, the tokenizer or Ray is touched, without reading the whole file.
Nothing here imports torch, Ray or vLLM; pyarrow is imported when a parquet file is read.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shunter.events import ChatMessage, PromptSpec

SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}
FIRST_ROWS = 8
"""Rows of each file :func:`check_file` reads and checks (the full read checks every row)."""


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
    return unique_files(out)


def unique_files(files: Sequence[Path]) -> list[Path]:
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


USED = ("prompt", "reward_model", "data_source", "extra_info")
"""The columns a row is made of; the others are never converted."""


def _parquet(path: Path, limit: int | None = None) -> tuple[list[str], list[Record]]:
    """The file's columns and its rows — the first ``limit`` only, when given: its schema and
    first batch are all that is read (only the columns a row uses are converted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if limit is None:
            table = pq.read_table(path)
            columns = list(table.column_names)
            values = table.select([c for c in USED if c in columns]).to_pylist()
        else:
            with pq.ParquetFile(path) as pf:
                columns = list(pf.schema_arrow.names)
                batch = next(pf.iter_batches(batch_size=limit, columns=[c for c in USED if c in columns]), None)
                values = batch.to_pylist()[:limit] if batch is not None else []
    except (pa.ArrowException, OSError, ValueError, ArithmeticError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: cannot be read as parquet: {first}") from None
    return columns, [(f"{path}:row {i + 1}", v) for i, v in enumerate(values)]


class _JsonFloat(float):
    """A JSON number with a fraction or exponent, and the literal it was written as."""

    __slots__ = ("literal",)
    literal: str


def _json_float(literal: str) -> float:
    f = _JsonFloat(literal)
    f.literal = literal
    return f


def _jsonl(path: Path, limit: int | None = None) -> tuple[list[str], list[Record]]:
    """The keys the file's objects have (first seen first) and its rows, one JSON object a line
    (the first ``limit`` rows only, when given)."""
    columns: dict[str, None] = {}
    out: list[Record] = []
    try:
        with path.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                if limit is not None and len(out) >= limit:
                    break
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
        cause = "" if isinstance(value, dict) else f"a {kind_of(value)}, not an object"
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
    raise DataError(f"{where}: field {name!r} is {kind_of(value)}; expected a string")


def kind_of(value: Any) -> str:
    if value is None:
        return "missing (null)"
    return "float" if isinstance(value, float) else type(value).__name__


def _messages(value: Any, where: str) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field 'prompt' is {kind_of(value)}; expected a list of chat messages or a string")
    out = []
    for k, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: field 'prompt[{k}]' is {m!r:.80}; expected {{'role': str, 'content': str}}")
        out.append(ChatMessage(role=m["role"], content=m["content"]))
    return tuple(out)


def read_rows(path: Path) -> list[Row]:
    """Every row of one file, checked; ``DataError`` names the file, row and field at fault."""
    return _rows(path, None)


def check_file(path: Path, rows: int = FIRST_ROWS) -> None:
    """The checks :func:`read_rows` makes, on ``path``'s first ``rows`` rows only: the file opens
    as its format, holds a row, has the columns a row needs, and its first rows are rows."""
    _rows(path, rows)


def check_files(paths: Sequence[str], base: Path | None = None, what: str = "data.train_files") -> list[Path]:
    """:func:`expand` ``paths``, then :func:`check_file` every file they name: what a run does with
    its ``data.train_files`` and ``data.val_files`` before it starts anything (``Engine.start``)."""
    files = expand(paths, base, what)
    for f in files:
        check_file(f)
    return files


def _rows(path: Path, limit: int | None) -> list[Row]:
    read = _parquet if SUFFIXES[path.suffix.lower()] == "parquet" else _jsonl
    columns, records = read(path, limit)
    if not records:
        raise DataError(f"{path}: holds no rows")
    missing = [c for c in ("prompt", "reward_model") if c not in columns]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (it has {', '.join(columns) or 'none'})")
    return [parse_row(path, where, value) for where, value in records]


def parse_row(path: Path, where: str, value: dict[str, Any]) -> Row:
    prompt = value.get("prompt")
    messages, text = ((), prompt) if isinstance(prompt, str) else (_messages(prompt, where), "")
    rm = value.get("reward_model")
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise DataError(f"{where}: field 'reward_model' is {rm!r:.80}; expected a struct with 'ground_truth'")
    source, extra = value.get("data_source"), value.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' is {kind_of(extra)}; expected a struct (a dict)")
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
