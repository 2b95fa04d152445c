"""The package builds without a warning a newcomer would read as a fault: every folder whose
files ship is declared (setuptools' "Package would be ignored" banner), the scenario files
ship in the wheel, and the editable install ``scripts/setup.sh`` makes prints nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(hook: str, out: Path, env: dict[str, str] | None = None) -> str:
    code = f"import setuptools.build_meta as b; print(b.{hook}({str(out)!r}))"
    p = subprocess.run(
        [sys.executable, "-c", code],  # warnings as pip shows them: UserWarning and up
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout + p.stderr


def warnings_in(text: str) -> list[str]:
    """Lines that warn, but setuptools' own note that byte-compiling is off (pip turns it on)."""
    return [x for x in text.splitlines() if re.search(r"warn|ignored", x, re.I) and "byte-compiling" not in x]


def test_the_wheel_builds_without_a_warning_and_ships_the_scenarios(tmp_path):
    out = build("build_wheel", tmp_path)
    assert warnings_in(out) == []
    (whl,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(whl).namelist()
    shipped = {Path(n).name for n in names if n.startswith("shunter/bench/scenarios/")}
    assert shipped == {p.name for p in (ROOT / "bench" / "scenarios").glob("*.toml")}
    data = {Path(n).name for n in names if n.startswith("shunter/bench/data/")}  # length files they name
    assert data == {p.name for p in (ROOT / "bench" / "data").glob("*.txt")} and data


def test_the_editable_install_setup_makes_prints_no_warning(tmp_path):
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    (filt,) = re.findall(r'PYTHONWARNINGS="([^"]+)" \.venv/bin/python -m pip install', setup)
    assert warnings_in(build("build_editable", tmp_path, {"PYTHONWARNINGS": filt})) == []
