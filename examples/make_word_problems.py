"""Write the arithmetic word problems as datasets in verl's parquet layout (no download):
``prompt`` as chat messages, ``data_source``, ``reward_model.ground_truth`` and ``extra_info``
(the split and the row's index) — ``word_*.parquet`` (addends 1-9) for
``examples/word_problems.toml``, ``word_tool_*.parquet`` (addends 1-20) for its calculator-tool
variant ``examples/word_problems_tool.toml``.

    .venv/bin/python examples/make_word_problems.py examples/data
    .venv/bin/shunter run examples/word_problems_tool.toml

The validation rows are the task's held-out prompts, so no training row is among them."""

from __future__ import annotations

import sys

from make_sort_parquet import cli, write  # the same layout (this folder is on sys.path when run as a script)

from shunter.engine.tasks.word_problems import WordProblemsTask, WordProblemsToolTask


def main(out: str = "examples/data", train: int = 20_000, val: int = 128) -> None:
    write(WordProblemsTask(), out, "word", train, val, data_source="word_problems", ability="math")
    write(WordProblemsToolTask(), out, "word_tool", train, val, data_source="word_problems", ability="math")


if __name__ == "__main__":
    main(cli(sys.argv[1:], __doc__))
