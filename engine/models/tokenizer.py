"""``HFTokenizer``: a Hugging Face tokenizer as the engine's ``Tokenizer``
(``shunter.engine.replica.backend.Tokenizer``), used wherever a model folder's tokenizer serves
the engine — a replica's actor, the launcher counting prompt tokens, the GPU bench's core-alone
measurement.

Invariant: text is encoded without special tokens and decoded without them, and a chat prompt
goes through the model's own chat template (with the generation prompt), so every user of a
model folder tokenizes a prompt exactly as its replicas do.
"""

from __future__ import annotations


class HFTokenizer:
    """Adapts an HF tokenizer to the engine's Tokenizer protocol (no special tokens added)."""

    def __init__(self, tok) -> None:
        self._tok = tok
        self.eos_token_id = tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def render(self, messages) -> list[int]:
        """A chat prompt through the model's chat template, with the generation prompt."""
        if not getattr(self._tok, "chat_template", None):
            raise ValueError("the model's tokenizer has no chat template; give the dataset's 'prompt' as a string")
        text = self._tok.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], tokenize=False, add_generation_prompt=True
        )
        return self.encode(text)
