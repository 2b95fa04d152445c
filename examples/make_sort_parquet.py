"""Write the sort task as a dataset in verl's parquet layout, the way a user prepares their own
data: ``prompt`` as chat messages, ``data_source``, ``reward_model.ground_truth``, ``extra_info``.

    .venv/bin/python examples/make_sort_parquet.py examples/data
    .venv/bin/shunter run examples/sort_data.toml

The validation rows are the task's held-out prompts, so no training row is among them."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shunter.engine.tasks import SortDigitsTask


def rows(prompts, split: str, data_source: str = "sort_digits", ability: str = "sort") -> list[dict]:
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": p.text.removesuffix(">")}],  # the chat template adds ">"
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"split": split, "index": i},
        }
        for i, p in enumerate(prompts)
    ]


def write(task, out: str, name: str, train: int, val: int, **row_fields) -> None:
    """A task's training prompts and held-out prompts as ``<name>_train.parquet`` / ``<name>_val.parquet``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    train_rows = rows(islice(task.train_prompts(seed=0), train), "train", **row_fields)
    pq.write_table(pa.Table.from_pylist(train_rows), folder / f"{name}_train.parquet")
    pq.write_table(
        pa.Table.from_pylist(rows(task.validation_prompts(val), "test", **row_fields)), folder / f"{name}_val.parquet"
    )
    print(f"wrote {train} training and {val} validation rows to {folder}/")


def main(out: str = "examples/data", train: int = 20_000, val: int = 128) -> None:
    write(SortDigitsTask(), out, "sort", train, val)


def cli(argv: list[str], doc: str | None) -> str:
    """The output folder from the command line (``--help`` prints the module's doc)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="examples/data", help="folder to write into (default: examples/data)")
    return str(ap.parse_args(argv).out)


if __name__ == "__main__":
    main(cli(sys.argv[1:], __doc__))
