"""Examples users copy, each run by a test (``tests/e2e/test_examples.py``, ``tests/contracts``):

- ``custom_policy``: a policy of your own (``EagerLendPolicy``); ``custom_policy_run``: a run with it;
- ``custom_loop``: your own training loop over ``Engine.next_batch`` / ``train`` / ``publish_weights``,
  with your own loss;
- ``my_reward``: a reward function of verl's signature;
- ``make_sort_parquet``, ``make_word_problems``: datasets in verl's layout, written offline.

The ``*.toml`` files beside them are the configs the README and docs run.
"""
