"""Write the arithmetic word problems as a dataset in verl's parquet layout (no download):
``prompt`` as chat messages, ``data_source``, ``reward_model.ground_truth`` and ``extra_info``
(the split and the row's index), for ``examples/word_problems.toml`` and its calculator-tool variant
``examples/word_problems_tool.toml``.

    .venv/bin/python examples/make_word_problems.py examples/data
    .venv/bin/shunter run examples/word_problems_tool.toml

The validation rows are the task's held-out prompts, so no training row is among them."""

from __future__ import annotations

import sys
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from shunter.engine.tasks.word_problems import WordProblemsTask


def rows(prompts, split: str) -> list[dict]:
    return [
        {
            "data_source": "word_problems",
            "prompt": [{"role": "user", "content": p.text.removesuffix(">")}],  # the chat template adds ">"
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"split": split, "index": i},
        }
        for i, p in enumerate(prompts)
    ]


def main(out: str = "examples/data", train: int = 20_000, val: int = 128) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    task = WordProblemsTask()
    pq.write_table(
        pa.Table.from_pylist(rows(islice(task.train_prompts(seed=0), train), "train")), folder / "word_train.parquet"
    )
    pq.write_table(pa.Table.from_pylist(rows(task.validation_prompts(val), "test")), folder / "word_val.parquet")
    print(f"wrote {train} training and {val} validation rows to {folder}/")


if __name__ == "__main__":
    main(*sys.argv[1:2])
