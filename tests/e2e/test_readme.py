"""The README's Python snippets run as written (each a whole program), from a folder laid out
like the repository: ``examples/`` and the tiny model where the example config expects it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_readme_has_its_snippets():
    assert len(SNIPPETS) >= 2 and all("asyncio.run(main())" in s for s in SNIPPETS)


@pytest.mark.parametrize("n", range(len(SNIPPETS)))
def test_readme_snippet_runs_as_written(n, ray_cluster, tiny_model, tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / ".shunter" / "models").mkdir(parents=True)
    (tmp_path / ".shunter" / "models" / "sort-tiny").symlink_to(tiny_model)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    exec(compile(SNIPPETS[n], f"README.md snippet {n + 1}", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out.strip(), "the snippet printed nothing"
    if "events()" in SNIPPETS[n]:
        assert "run ended: completed" in out
