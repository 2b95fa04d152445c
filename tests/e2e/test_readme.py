"""The Python snippets of the README and of ``docs/*.md`` run as written (each a whole program),
from a folder laid out like the repository: ``examples/`` and the tiny model where the example
config expects it. A block that is not a whole program says so on the line before its fence,
``<!-- not run: the reason -->``, and is left out; a block shown in two places runs once. A run a
snippet makes takes its standalone replicas from the tier's ``ReplicaPool`` unless it names a
pool of its own (the ``pooled`` fixture), so the snippets share the vLLM engine starts."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->")


def python_blocks(path: Path) -> list[tuple[str, str, str | None]]:
    """``(name, source, why not run or None)`` for each ```python block of one Markdown file."""
    text = path.read_text()
    blocks = []
    for n, m in enumerate(re.finditer(r"```python\n(.*?)```", text, flags=re.S), 1):
        line_before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marked = NOT_RUN.fullmatch(line_before)
        blocks.append((f"{path.relative_to(ROOT)} snippet {n}", m.group(1), marked.group(1) if marked else None))
    return blocks


def collect() -> dict[str, str]:
    """The snippets to run, by name (``docs/embedding.md snippet 1``), each source once."""
    found: dict[str, str] = {}
    for path in DOCS:
        for name, src, why_not in python_blocks(path):
            if why_not is None and src not in found.values():
                found[name] = src
    return found


SNIPPETS = collect()


def test_the_readme_has_its_snippets():
    assert sum(name.startswith("README.md") for name in SNIPPETS) >= 2
    assert all("asyncio.run(main())" in s for s in SNIPPETS.values())


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_doc_snippet_runs_as_written(name, ray_cluster, tiny_model, tmp_path, monkeypatch, capsys, pooled):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / ".shunter" / "models").mkdir(parents=True)
    (tmp_path / ".shunter" / "models" / "sort-tiny").symlink_to(tiny_model)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    src = SNIPPETS[name]
    exec(compile(src, name, "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out.strip(), "the snippet printed nothing"
    if "events()" in src:
        assert "run ended: completed" in out
