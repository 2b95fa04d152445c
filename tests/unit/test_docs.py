"""The documentation holds together: every relative link of the README, CONTRIBUTING.md and
``docs/*.md`` reaches a file (and, where it names one, a heading of it); every Python snippet
``tests/e2e/test_readme.py`` runs compiles and is a whole program; every import string the docs
show resolves from a checkout; the README stays a front door."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without its fenced code blocks (a link inside one is code, not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", _prose(path.read_text()), flags=re.M)}


LINKS = [
    (page, target)
    for page in PAGES
    for target in LINK.findall(_prose(page.read_text()))
    if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto: ...
]


def test_the_docs_have_relative_links():
    assert len(LINKS) > 20 and any(p.parent.name == "docs" for p, _ in LINKS)


@pytest.mark.parametrize(("page", "target"), LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS])
def test_every_relative_link_reaches_a_file(page, target):
    file, _, anchor = target.partition("#")
    dest = (page.parent / file).resolve() if file else page
    assert dest.exists(), f"{page.relative_to(ROOT)} links to {target}: no such file"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest), f"{page.relative_to(ROOT)} links to {target}: no such heading"


def _snippet_collector():
    spec = importlib.util.spec_from_file_location("doc_snippets", ROOT / "tests" / "e2e" / "test_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_doc_snippet_the_e2e_tier_runs_compiles():
    e2e = _snippet_collector()
    snippets = e2e.collect()
    assert sum(name.startswith("README.md") for name in snippets) >= 2
    for name, src in snippets.items():
        compile(src, name, "exec")
        assert "asyncio.run(main())" in src, f"{name} is not a whole program: mark it <!-- not run: why -->"
    blocks = [b for path in e2e.DOCS for b in e2e.python_blocks(path)]
    for name, src, why_not in blocks:
        assert why_not is None or why_not.strip(), f"{name}: say why it is not run"
        assert why_not is not None or src in snippets.values(), f"{name} would not run"


def test_every_import_string_the_docs_show_resolves():
    """``tests/unit/engine/config/test_import_strings.py`` checks the README's; these are the ``docs/`` pages'."""
    shown = sorted({m for p in PAGES for m in re.findall(r"\b((?:examples|shunter)\.[\w.]+:\w+)", p.read_text())})
    assert "shunter.engine.tasks.math_reward:compute_score" in shown
    code = (
        "import sys\n"
        "from shunter.policies.registry import import_object\n"
        "for s in sys.argv[1:]: import_object(s, 'doc')"
    )
    out = subprocess.run([sys.executable, "-c", code, *shown], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 260


def test_the_configuration_reference_names_every_field():
    """``docs/configuration.md`` was written from ``shunter config-schema``: each table has its
    section and each field its row there; a field added to a config Struct must be added too."""
    from shunter.engine.config import schema

    s = schema()
    defs = s["$defs"]
    text = (ROOT / "docs" / "configuration.md").read_text()
    sections = dict(re.findall(r"^## `\[(\w+)\]`\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M))
    missing = []
    for table, ref in defs["EngineConfig"]["properties"].items():
        fields = defs[ref["$ref"].split("/")[-1]]["properties"]
        rows = set(re.findall(r"^\| `(\w+)` \|", sections.get(table, ""), flags=re.M))
        missing += [f"{table}.{f}" for f in fields if f not in rows]
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_the_policy_reference_is_the_one_the_code_writes():
    """``docs/policies.md``'s reference is ``shunter.policies.reference.render()``: every field of
    the view, member of ``Policy`` and helper of ``policies/base.py``, each with its documentation
    from the code (a field added without a doc makes ``render()`` raise, naming it). After a
    change: ``python -m shunter.policies.reference``."""
    from shunter.policies import reference

    page = (ROOT / "docs" / "policies.md").read_text()
    assert reference.shown(page) == reference.render(), "run: python -m shunter.policies.reference"
    for field in ("in_flight_groups", "ready_batches", "gate_open", "steps_since_publish", "done"):
        assert f"| `{field}` |" in page
    for name in ("view.ids(*, kind", "train_or_publish(event", "load_on_ready(event", "SwitchToRollout"):
        assert name in page


def test_the_policy_reference_refuses_a_field_without_its_documentation(monkeypatch):
    """A view field added without an attribute docstring fails the reference, naming it."""
    import msgspec

    from shunter.policies import reference

    class Bare(msgspec.Struct, frozen=True):
        """A view part."""

        documented: int = 0
        """Has its doc."""
        undocumented: int = 0

    monkeypatch.setattr(reference, "VIEWS", (*reference.VIEWS, ("view.bare", Bare)))
    with pytest.raises(ValueError, match=r"Bare\.undocumented has no documentation in the code"):
        reference.render()


def test_contributing_names_every_module():
    """CONTRIBUTING's "Every module" lists each module of the package and of ``tests/support``
    under its package's bullet: a module added must be added there too."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("### Every module") : text.index("## Adding an event")]
    bullets = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^- \*\*`?([\w/ ]+?)/?`?\*\*.*?(?=^- \*\*|\Z)", section, re.S | re.M)
    }
    dirs = ("events", "policies", "engine", "actors", "bench", "tests/support")
    missing = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if p.name == "__init__.py" or not (rel.startswith(dirs) or "/" not in rel) or rel == "conftest.py":
            continue
        folder = rel.rsplit("/", 1)[0] if "/" in rel else "the root"
        owner = next(
            (b for b in sorted(bullets, key=len, reverse=True) if folder == b or folder.startswith(b + "/")), None
        )
        if owner is None or f"`{p.name}`" not in bullets[owner]:
            missing.append(rel)
    assert not missing, f"CONTRIBUTING.md's 'Every module' does not name {missing}"
