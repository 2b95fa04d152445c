"""Token budgets drawn per sample (``rollout.length_dist``): long-tail response lengths for
benchmarks with models that never stop (``ignore_eos``).

Two forms: ``"lognormal:<median>:<sigma>"``, or ``"file:<path>"`` — a text file of positive
integer lengths (whitespace-separated, ``#`` starts a comment), e.g. the response lengths of
a real run, each sample drawing one of them. Invariant: a sample's budget depends only on the
spec, the replica's seed and the sample id (reproducible in a seeded run; a resumed sample
keeps the budget it was first given), and is capped at ``max_tokens``. A file is read once per
process; a missing, empty or malformed file is a ``ValueError`` naming the file and the line.
"""

from __future__ import annotations

import math
import random
from functools import cache
from pathlib import Path

from shunter.events.data import parse_length_dist

FILE = "file:"


def is_file_spec(spec: str) -> bool:
    return spec.startswith(FILE)


def file_of(spec: str) -> Path:
    return Path(spec[len(FILE) :])


@cache
def read_lengths(path: str) -> tuple[int, ...]:
    """The lengths in ``path``; ValueError naming the file (and the line) if it has none or a
    token that is not a positive integer."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"length file {p}: cannot be read ({e.strerror or e})") from None
    out: list[int] = []
    for n, line in enumerate(text.splitlines(), 1):
        for tok in line.split("#", 1)[0].split():
            try:
                x = int(tok)
            except ValueError:
                x = 0
            if x <= 0:
                raise ValueError(f"length file {p}, line {n}: {tok!r} is not a positive integer length")
            out.append(x)
    if not out:
        raise ValueError(f"length file {p} holds no lengths")
    return tuple(out)


def check(spec: str) -> None:
    """ValueError if ``spec`` is not a usable length distribution (a file is read)."""
    if is_file_spec(spec):
        read_lengths(str(file_of(spec)))
    else:
        parse_length_dist(spec)


def budget(spec: str, seed: int, sample_id: str, max_tokens: int) -> int:
    """A new sample's token budget under ``spec`` (``""``: ``max_tokens``)."""
    if not spec:
        return max_tokens
    rng = random.Random(f"{seed}:{sample_id}")
    if is_file_spec(spec):
        table = read_lengths(str(file_of(spec)))
        return max(1, min(max_tokens, table[rng.randrange(len(table))]))
    dist = parse_length_dist(spec)
    assert dist is not None
    median, sigma = dist
    return max(1, min(max_tokens, round(rng.lognormvariate(math.log(median), sigma))))


def resolved_path(path: Path, base: Path) -> Path:
    """``path`` made absolute: against ``base`` (the config's or the scenario's folder) if the
    file is there, else against the working directory."""
    if path.is_absolute():
        return path
    return (base / path if (base / path).exists() or not path.exists() else path).resolve()


def resolved(spec: str, base: Path) -> str:
    """``spec`` with a relative file path made absolute (:func:`resolved_path`)."""
    return FILE + str(resolved_path(file_of(spec), base)) if is_file_spec(spec) else spec
