"""What the CLI's driver does before Ray starts: a run of an already-built model checks the
model's marker without importing torch, transformers or vLLM (they cost ~7 s of a 2-core machine
on every ``shunter run``, before any component could start)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from shunter.engine import tiny_model

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import sys, ray
class Reached(Exception):
    pass
def stop(*a, **k):
    heavy = sorted(m for m in ("torch", "transformers", "vllm", "tokenizers") if m in sys.modules)
    print("HEAVY=" + ",".join(heavy), flush=True)
    raise Reached
ray.init = stop
from shunter import cli
try:
    cli.main(["run", sys.argv[1], "--steps", "2", "--no-progress", "--output-dir", sys.argv[2]])
except Reached:
    pass
"""


def _built_model(path: Path) -> None:
    """A folder as ``build_tiny_model`` leaves it (marker last), without building one."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (path / "model.safetensors").write_bytes(b"")
    (path / "tokenizer.json").write_text("{}")
    marker = {"params": tiny_model.build_params("sort_digits", seed=0, sft_steps=25)}
    (path / tiny_model.MARKER).write_text(json.dumps(marker))


def test_a_run_of_a_built_model_imports_no_torch_before_ray_starts(tmp_path):
    model = tmp_path / "sort-tiny"
    _built_model(model)
    cfg = tmp_path / "run.toml"
    text = (ROOT / "examples" / "sort_separate.toml").read_text()
    cfg.write_text(re.sub(r'(?m)^path = ".shunter/models/sort-tiny"$', f'path = "{model}"', text, count=1))
    assert str(model) in cfg.read_text()
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(cfg), str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("HEAVY=")), None)
    assert line is not None, out.stdout + out.stderr  # the driver got as far as starting Ray
    assert line == "HEAVY=", f"imported before Ray starts: {line[6:]}"
    assert tiny_model.read_marker(model)["params"] == tiny_model.build_params()  # left as it was
