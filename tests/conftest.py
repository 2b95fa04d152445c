"""Shared fixtures. The heavy ones (a Ray cluster, a tiny model, vLLM) are session-scoped
and built once; the unit tier needs none of them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))  # so tests can import fakes
