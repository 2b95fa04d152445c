"""Is a folder a model the trainer and vLLM can load? Checked before Ray and vLLM start.

Invariant: a folder that passes holds a readable ``config.json`` (a JSON object naming a
``model_type``), weights (safetensors or PyTorch ``.bin`` files, or an index of them) and a
tokenizer; one that fails raises ``EngineSetupError`` naming the folder, what is missing or
unreadable and how to get a model there — never a traceback from deep inside a loader minutes
later.
"""

from __future__ import annotations

import json
from pathlib import Path

from shunter.engine.io.errors import EngineSetupError

WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
HINT = "point model.path at an HF model folder, or set model.build_tiny to build the tiny model there"


def check_model_dir(path: str | Path) -> Path:
    """``path`` resolved, if it holds a loadable model; else ``EngineSetupError``."""
    p = Path(path)
    where = f"model.path = {str(path)!r}"
    if not p.exists():
        raise EngineSetupError(f"{where} does not exist; {HINT}")
    if not p.is_dir():
        raise EngineSetupError(f"{where} is a file, not a model folder; {HINT}")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise EngineSetupError(f"{where} holds no HF model (no config.json); {HINT}")
    try:
        meta = json.loads(cfg.read_bytes())
    except (OSError, ValueError) as e:
        raise EngineSetupError(f"{where}: config.json is unreadable ({type(e).__name__}: {e}); {HINT}") from None
    if not isinstance(meta, dict) or not meta.get("model_type"):
        raise EngineSetupError(f"{where}: config.json names no model_type (not an HF model config); {HINT}")
    if not any(next(p.glob(g), None) is not None for g in WEIGHTS):
        raise EngineSetupError(f"{where} has a config.json but no weights (*.safetensors or pytorch_model*.bin)")
    if not any((p / t).is_file() for t in TOKENIZER):
        raise EngineSetupError(f"{where} has no tokenizer ({', '.join(TOKENIZER)})")
    return p.resolve()
