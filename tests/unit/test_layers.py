"""The layer rules, enforced on every module's imports (module level and inside functions):

- ``events``: the standard library and msgspec only;
- ``policies``: that, plus ``shunter.events``;
- ``engine``: never Ray or vLLM, and nothing above it (actors, the facade, the CLI, bench);
  its control plane (the coordinator's loop and everything it imports) not even torch;
- ``actors``: vLLM only in the vLLM adapters (``actors/vllm/``: ``engine``, ``weights``, ``extension``, ``nccl``);
- nothing imports upward: events <- policies <- engine <- actors <- api <- progress <- bench <- contract
  <- cli.

``bench/`` and ``tests/`` are users: they may measure against raw vLLM.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["events", "policies", "engine", "actors", "api", "progress", "bench", "contract", "cli"]
RANK = {name: i for i, name in enumerate(LAYERS)}
VLLM_ADAPTERS = {"actors/vllm/engine.py", "actors/vllm/weights.py", "actors/vllm/extension.py", "actors/vllm/nccl.py"}
THIRD_PARTY = {"events": {"msgspec"}, "policies": {"msgspec"}}


def layer_of(rel: str) -> str:
    top = rel.split("/", 1)[0].removesuffix(".py")
    return "api" if top.startswith("api_") else top  # api_*.py: the facade's parts


def modules() -> list[str]:
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if (
            rel.split("/", 1)[0] in {"events", "policies", "engine", "actors", "bench"}
            or rel
            in {
                "api.py",
                "progress.py",
                "contract.py",
                "cli.py",
            }
            or (rel.startswith("api_") and rel.endswith(".py"))
        ):
            out.append(rel)
    return out


def imports(rel: str) -> set[str]:
    tree = ast.parse((ROOT / rel).read_text())
    pkg = ["shunter", *rel.split("/")[:-1]]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1])
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
    return found


def test_the_scan_sees_the_modules():
    assert {"engine/coordinator/coordinator.py", "events/base.py", "actors/vllm/backend.py", "api.py"} <= set(modules())


@pytest.mark.parametrize("rel", modules())
def test_layer_rules(rel):
    layer = layer_of(rel)
    for name in imports(rel):
        top = name.split(".")[0]
        if top == "shunter":
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else "shunter"
            if target in RANK:
                assert RANK[target] <= RANK[layer] or (layer == "engine" and target == "engine"), (
                    f"{rel} imports {name}: {layer} may not import {target} (above it)"
                )
            continue
        if layer in THIRD_PARTY:
            assert top in sys.stdlib_module_names or top in THIRD_PARTY[layer], (
                f"{rel} imports {name}: {layer} may import only the standard library and {THIRD_PARTY[layer]}"
            )
        if layer == "engine":
            assert top not in ("ray", "vllm"), f"{rel} imports {name}: the engine never imports Ray or vLLM"
        if top == "vllm" and layer != "bench":
            assert rel in VLLM_ADAPTERS, f"{rel} imports {name}: only {sorted(VLLM_ADAPTERS)} import vLLM"


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")


@pytest.mark.parametrize(
    ("module", "banned"),
    [
        ("shunter.events", ("torch", "vllm", "ray", "transformers")),
        ("shunter.policies", ("torch", "vllm", "ray", "transformers")),
        ("shunter.engine.coordinator.coordinator", ("torch", "vllm", "ray", "transformers")),
        ("shunter.contract", ("torch", "vllm", "ray", "transformers")),
        ("shunter.engine.trainer.trainer", ("vllm", "ray")),
    ],
)
def test_importing_a_layer_pulls_in_nothing_it_must_not(module, banned):
    code = (
        f"import sys, {module}; bad = [m for m in {banned!r} if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = _fresh(code)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_module_is_over_400_lines():
    """Modules stay small enough to read in one sitting (CONTRIBUTING: one responsibility, at
    most ~400 lines): cut a growing one where a newcomer would look for its parts."""
    pkgs = ["engine", "actors", "events", "policies", "bench"]
    files = [p for d in pkgs for p in (ROOT / d).rglob("*.py")] + list(ROOT.glob("*.py"))
    over = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 400}
    assert not over, over
