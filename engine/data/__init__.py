"""The data a run learns from, and how its samples are scored and stepped.

- ``files``: prompt files in verl's layout (parquet, JSONL) — naming them, reading and checking
  their rows (``read_rows``, ``Row``, ``DataError``);
- ``datasets``: the rows kept (``Dataset``) and the stream a run draws from them (``PromptStream``),
  validation prompts;
- ``rewards``: scoring finished samples with the user's reward function, off the loop that
  generates (``InlineRewards``, ``ThreadRewards``);
- ``environments``: multi-turn environments — the protocol, loading by import string, contained
  calls, the built-in ``Calculator``;
- ``turns``: a multi-turn sample's bookkeeping, as pure functions over ``Sample``.
"""
