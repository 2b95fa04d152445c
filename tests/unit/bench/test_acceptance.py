"""A scenario's own acceptance figure (issue 46): declared as data in its file, printed by
``bench run`` with its verdict, written to the JSON and the report; a criterion naming no figure
of the scenario's results is refused at load, in one line. And the names a result may hold are
all known (``bench/runner/figure_names.py``), so that check can be made before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from shunter.bench.__main__ import main as bench_main
from shunter.bench.report.markdown import write_report
from shunter.bench.runner.acceptance import judge, line
from shunter.bench.runner.figure_names import RETIRED, known
from shunter.bench.runner.scenario_file import Acceptance, load

ROOT = Path(__file__).resolve().parents[3]
ANALYTIC = ROOT / "bench" / "scenarios" / "analytic_sync.toml"


def shipped_analytic_sync(tmp_path: Path, *changes: tuple[str, str]) -> Path:
    """The shipped ``analytic_sync`` scenario — its acceptance as it stands — at a small scale
    (2 optimizer steps instead of 8: one weight version), with ``changes`` made to its text."""
    text = ANALYTIC.read_text()
    for old, new in (("run = { total_steps = 8 }", "run = { total_steps = 2 }"), *changes):
        assert old in text, old
        text = text.replace(old, new)
    f = tmp_path / "analytic_sync.toml"
    f.write_text(text)
    return f


def test_bench_run_prints_the_scenarios_acceptance_figure_and_its_verdict(tmp_path, capsys):
    """An outside tester read ``analytic_sync``'s "96% of its bound" as a failure; its own figure,
    simulated time over the closed form within 2 %, was in one column of a 29-column table."""
    out = tmp_path / "analytic_sync.json"
    # the shipped criterion, and a second one on a figure this run does not measure (no KV limit): it fails
    unmeasured = ("at_most = 1.02\n", 'at_most = 1.02\n\n[[acceptance]]\nfigure = "kv_occupancy"\nat_most = 1.0\n')
    f = shipped_analytic_sync(tmp_path, unmeasured)
    assert bench_main(["run", str(f), "--seeds", "1", "--out", str(out)]) == 0  # a verdict is no exit status
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    variants = list(result["metrics"])
    assert len(variants) == 2
    for name in variants:
        x = result["metrics"][name]["sim_over_analytic"]["median"]
        assert 0.98 <= x <= 1.02
        assert f"{name}: sim_over_analytic = {x:.5g} (accept: 0.98 <= x <= 1.02 on every seed) PASS" in printed
        assert f"{name}: kv_occupancy = not measured (accept: x <= 1 on every seed) FAIL" in printed
    # the JSON holds the same verdicts, the report prints them
    verdicts = result["acceptance"]
    assert [(v["variant"], v["figure"], v["verdict"]) for v in verdicts] == [
        *((n, "sim_over_analytic", "PASS") for n in variants),
        *((n, "kv_occupancy", "FAIL") for n in variants),
    ]
    report = write_report([out], tmp_path / "REPORT.md").read_text()
    assert all(f"- {line(v)}" in report for v in verdicts)
    # a criterion the figure misses fails
    strict = msgspec.structs.replace(load(ANALYTIC), acceptance=[Acceptance(figure="sim_over_analytic", at_least=1.5)])
    assert [line(v) for v in judge(strict, result["metrics"])] == [
        f"{n}: sim_over_analytic = {result['metrics'][n]['sim_over_analytic']['median']:.5g} "
        "(accept: x >= 1.5 on every seed) FAIL"
        for n in variants
    ]
    # every figure the run wrote is a known name, none a retired one
    for m in result["metrics"].values():
        assert set(m) <= known("sim"), set(m) - known("sim")


@pytest.mark.parametrize(
    ("figure", "said"),
    [
        ("sim_over_analytc", "did you mean 'sim_over_analytic'?"),
        ("events_per_s", "renamed or replaced: facts_per_cpu_s"),
        ("no_such_thing", "see bench/runner/figure_names.py"),
    ],
)
def test_an_acceptance_of_an_unknown_figure_is_refused_at_load_in_one_line(tmp_path, capsys, figure, said):
    f = shipped_analytic_sync(tmp_path, ('figure = "sim_over_analytic"', f'figure = "{figure}"'))
    with pytest.raises(ValueError, match="no such figure"):
        load(f)
    out = tmp_path / "a.json"
    assert bench_main(["run", str(f), "--seeds", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m shunter.bench run: scenario {f}: acceptance of '{figure}': no such figure")
    assert said in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("at_least = 0.98\nat_most = 1.02\n", "", "give at_least, at_most or both"),
        ("at_least = 0.98", "at_least = 1.1", "at_least = 1.1 is above at_most = 1.02"),
        ("at_most = 1.02", 'at_most = 1.02\nvariants = ["nope"]', "no variant named 'nope'"),
    ],
)
def test_an_acceptance_that_cannot_be_judged_is_refused_at_load(tmp_path, old, new, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        load(shipped_analytic_sync(tmp_path, (old, new)))


def test_every_figure_in_the_recorded_results_is_a_known_or_retired_name():
    """What keeps ``figure_names`` complete: every result JSON in ``bench/results/`` (a figure a
    runner writes is in them once its scenario has run), by its scenario's kind and baseline."""
    seen = 0
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        r = json.loads(path.read_text())
        if "scenario" not in r or "metrics" not in r:  # a GPU measurement, a soak's report
            continue
        meta = r["scenario"]["scenario"]
        names = known(meta.get("kind", "sim"), meta.get("baseline", "")) | set(RETIRED)
        for variant, m in r["metrics"].items():
            if variant in ("raw Ray actor calls", "CoordinatorActor ingest over Ray"):
                names_here = known("overhead")
            else:
                names_here = names
            assert set(m) <= names_here, (path.name, variant, sorted(set(m) - names_here))
            seen += 1
    assert seen > 50
