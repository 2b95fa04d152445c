"""The shape of the tree, enforced on every module of the package — ``events/``, ``policies/``,
``engine/``, ``actors/``, ``bench/`` and the root modules (``api*.py``, ``cli.py``, ...) — and, for
the rules about names, on the tests, examples and scripts that import it too:

1. **No import circle.** Module-level, function-level and ``TYPE_CHECKING`` imports all count: a
   circle of types is still a circle to a reader.
2. **One home per name.** A name is imported from the module that defines it, or from a package
   ``__init__`` that lists it in ``__all__`` (a package's public API: ``shunter.events``,
   ``shunter.engine.config`` ...). Only a package ``__init__`` re-exports.
3. **No underscore name crosses a module.** A name two modules share is public.
4. **The layers.** Nothing imports upward (``LAYERS``); ``events`` imports the standard library and
   msgspec only, ``policies`` that and ``events``; ``engine/`` holds only its sub-packages (each
   with an ``__init__`` that is its map), each importing only the engine's sub-packages listed
   for it in ``ENGINE`` and none of the third-party packages listed for it in ``ENGINE_BANS``
   (module level and inside functions); only ``actors/vllm/`` imports vLLM (``bench/`` and the
   tests are users: they may measure against raw vLLM); importing a light layer in a fresh
   interpreter pulls in nothing heavy.

Modules stay small by having one job each, not by a line count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("events", "policies", "engine", "actors", "bench")
USER_DIRS = ("tests", "examples", "scripts")
LAYERS = ["events", "policies", "engine", "actors", "api", "progress", "bench", "contract", "cli"]
RANK = {name: i for i, name in enumerate(LAYERS)}
THIRD_PARTY = {"events": {"msgspec"}, "policies": {"msgspec"}}

ENGINE = {  # sub-package -> the engine's sub-packages it may import (see engine/__init__.py)
    "io": set(),
    "tasks": set(),
    "data": {"io", "tasks"},
    "replica": {"io", "tasks", "data"},
    "config": {"io", "tasks", "data", "replica"},  # its checks load what a config names
    "weights": {"io"},
    "models": {"io", "tasks"},
    "trainer": {"io", "tasks", "data", "config", "weights"},
    "coordinator": {"io", "tasks", "data", "replica", "config", "trainer"},  # trainer.host only: no torch
}
ENGINE_BANS = {  # sub-package -> third-party packages none of its modules may import, anywhere
    **{sub: {"ray", "vllm"} for sub in ENGINE},
    **{sub: {"ray", "vllm", "torch", "transformers"} for sub in ("tasks", "data", "replica", "config", "coordinator")},
}


def _rel_module(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["shunter", *parts]) if parts else "shunter"


@cache
def package_files() -> dict[str, str]:
    """Module name -> path relative to the root, for every module of the package."""
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        top = rel.split("/", 1)[0]
        if top in PACKAGE_DIRS or ("/" not in rel and rel != "conftest.py"):
            out[_rel_module(rel)] = rel
    return out


@cache
def user_files() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for d in USER_DIRS for p in (ROOT / d).rglob("*.py"))


@cache
def tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text())


def imports_of(rel: str) -> list[tuple[str, ast.ImportFrom | ast.Import, str | None]]:
    """(module imported, the node, the name imported from it or None) for every import in ``rel``,
    relative ones resolved."""
    pkg = _rel_module(rel).split(".") if rel.endswith("__init__.py") else _rel_module(rel).split(".")[:-1]
    out: list[tuple[str, ast.ImportFrom | ast.Import, str | None]] = []
    for node in ast.walk(tree(rel)):
        if isinstance(node, ast.Import):
            out += [(a.name, node, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            out += [(module, node, a.name) for a in node.names]
    return out


@cache
def homes(module: str) -> tuple[frozenset[str], frozenset[str] | None]:
    """(the names ``module`` defines at its top level, its ``__all__`` if it has one)."""
    defined: set[str] = set()
    listed: set[str] | None = None
    body = tree(package_files()[module]).body
    for node in body:
        for n in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(n.name)
            elif isinstance(n, ast.Assign | ast.AnnAssign):
                for target in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    defined |= {x.id for x in ast.walk(target) if isinstance(x, ast.Name)}
                    if isinstance(target, ast.Name) and target.id == "__all__":
                        listed = {e.value for e in n.value.elts}  # type: ignore[union-attr]
    return frozenset(defined), frozenset(listed) if listed is not None else None


def _graph() -> dict[str, set[str]]:
    mods = package_files()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, rel in mods.items():
        for module, _, name in imports_of(rel):
            target = f"{module}.{name}" if name and f"{module}.{name}" in mods else module
            if target in mods and target != m:
                graph[m].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_scan_sees_the_package():
    mods = package_files()
    assert {"shunter", "shunter.api", "shunter.events.base", "shunter.engine.coordinator.coordinator"} <= set(mods)
    assert {"shunter.actors.vllm.backend", "shunter.bench.sim.cluster"} <= set(mods)
    assert "tests/support/fakes.py" in user_files()


def test_the_import_graph_has_no_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check works
    circles = _circles(_graph())
    assert not circles, "import circles (each a group of modules that import one another):\n" + "\n".join(
        " -> ".join(c) for c in circles
    )


def test_a_name_is_imported_from_its_home_and_only_a_package_init_re_exports():
    mods = package_files()
    bad = []
    for rel in [*mods.values(), *user_files()]:
        is_init = rel.endswith("__init__.py")
        for module, node, name in imports_of(rel):
            if name is None or module not in mods or name == "*":
                continue
            alias = next(a for a in node.names if a.name == name)
            if alias.asname == name and not is_init:
                bad.append(f"{rel}:{node.lineno} re-exports {module}.{name} (`as {name}`): only a package __init__ may")
            defined, listed = homes(module)
            if name in defined or f"{module}.{name}" in mods or (listed is not None and name in listed):
                continue
            bad.append(f"{rel}:{node.lineno} imports {name} from {module}, which does not define it")
        if not is_init and rel in mods.values():
            defined, listed = homes(_rel_module(rel))
            if listed is not None and listed - defined:
                bad.append(f"{rel} lists {sorted(listed - defined)} in __all__ without defining them: a re-export")
    assert not bad, "\n".join(bad)


def test_no_underscore_name_crosses_a_module():
    mods = package_files()
    bad = [
        f"{rel}:{node.lineno} imports {module}.{name}"
        for rel in [*mods.values(), *user_files()]
        for module, node, name in imports_of(rel)
        if module.startswith(("shunter", "tests")) and name and name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, "a name two modules share is public (drop its underscore):\n" + "\n".join(bad)


def _layer(rel: str) -> str:
    top = rel.split("/", 1)[0].removesuffix(".py")
    return "api" if top.startswith("api_") or top == "__init__" else top  # the facade's parts; the root


@pytest.mark.parametrize("rel", sorted(package_files().values()))
def test_layer_rules(rel):
    layer = _layer(rel)
    sub = rel.split("/")[1] if layer == "engine" and rel.count("/") >= 2 else ""
    for name, node, _ in imports_of(rel):
        top = name.split(".")[0]
        where = f"{rel}:{node.lineno} imports {name}"
        if top == "shunter":
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else "shunter"
            if target in RANK:
                assert RANK[target] <= RANK[layer], f"{where}: {layer} may not import {target} (above it)"
            if sub and target == "engine" and len(parts) > 2 and parts[2] != sub:
                assert parts[2] in ENGINE[sub], f"{where}: engine/{sub} may import only {sorted(ENGINE[sub])}"
            continue
        if layer in THIRD_PARTY:
            assert top in sys.stdlib_module_names or top in THIRD_PARTY[layer], (
                f"{where}: {layer} may import only the standard library and {THIRD_PARTY[layer]}"
            )
        if sub:
            assert top not in ENGINE_BANS[sub], f"{where}: engine/{sub} never imports {sorted(ENGINE_BANS[sub])}"
        if top == "vllm" and layer != "bench":
            assert rel.startswith("actors/vllm/"), f"{where}: only actors/vllm/ imports vLLM"


def test_the_engine_holds_only_its_sub_packages():
    engine = ROOT / "engine"
    loose = sorted(p.name for p in engine.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in engine/ (each belongs in a sub-package): {loose}"
    subs = sorted(p.name for p in engine.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert subs == sorted(ENGINE), f"engine/'s sub-packages {subs} differ from the layer table {sorted(ENGINE)}"


@pytest.mark.parametrize("init", sorted(rel for rel in package_files().values() if rel.endswith("__init__.py")))
def test_every_package_init_is_the_map_of_its_modules(init):
    """A package's ``__init__`` docstring names each of its modules and sub-packages (````name````)."""
    folder = (ROOT / init).parent
    doc = ast.get_docstring(tree(init)) or ""
    parts = [p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")]
    parts += [
        p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists() and p.name not in USER_DIRS
    ]
    missing = sorted(m for m in parts if f"``{m}``" not in doc)
    assert not missing, f"{init} is its package's map: it names no {missing}"


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")


@pytest.mark.parametrize(
    ("module", "banned"),
    [
        ("shunter.events", ("torch", "vllm", "ray", "transformers")),
        ("shunter.policies", ("torch", "vllm", "ray", "transformers")),
        ("shunter.engine.coordinator.assemble", ("torch", "vllm", "ray", "transformers")),
        ("shunter.engine.coordinator.local_executor", ("torch", "vllm", "ray", "transformers")),
        ("shunter.engine.config", ("torch", "vllm", "ray", "transformers")),
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
