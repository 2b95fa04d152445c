"""Model folders: what the trainer and vLLM load.

- ``folder``: is a folder a model both can load? Checked before Ray and vLLM start;
- ``tiny``: the tiny Qwen2-style model with a 42-symbol tokenizer, built offline in seconds (the
  demo's and the tests' model);
- ``tokenizer``: ``HFTokenizer`` — a Hugging Face tokenizer as the engine's ``Tokenizer``
  (chat templates rendered to ids).
"""
