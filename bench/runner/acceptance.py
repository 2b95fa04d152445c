"""A scenario's verdicts: each ``[[acceptance]]`` criterion (``scenario_file.Acceptance``) judged
on a result's figures (:func:`judge`), one line each (:func:`line`) for the console, the JSON
(``"acceptance"``) and the Markdown report.

Invariant: a criterion passes only if its figure was measured for the variant and lies within
its bounds on every seed (the min and the max over seeds both do); a figure not measured fails,
saying so.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shunter.bench.runner.scenario_file import Scenario

Outcome = Literal["PASS", "FAIL"]


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    variant: str
    figure: str
    criterion: str
    """The bound, as the scenario states it (``Acceptance.criterion``)."""
    verdict: Outcome
    median: float | None = None
    min: float | None = None
    max: float | None = None
    """The figure over the seeds (None: not measured for this variant)."""
    seeds: int = 0


def judge(sc: Scenario, metrics: dict[str, dict[str, dict[str, float]]]) -> list[Verdict]:
    """Every criterion of ``sc`` on each of its variants, from a result's ``metrics`` (variant ->
    figure -> min / median / max over the seeds)."""
    out = []
    for a in sc.acceptance:
        for name in a.variants or [v.name for v in sc.variant]:
            stats = metrics.get(name, {}).get(a.figure)
            if not stats:
                out.append(Verdict(variant=name, figure=a.figure, criterion=a.criterion(), verdict="FAIL"))
                continue
            ok = a.holds(stats["min"]) and a.holds(stats["max"])
            out.append(
                Verdict(
                    variant=name,
                    figure=a.figure,
                    criterion=a.criterion(),
                    verdict="PASS" if ok else "FAIL",
                    median=stats["median"],
                    min=stats["min"],
                    max=stats["max"],
                    seeds=len(sc.scenario.seeds),
                )
            )
    return out


def line(v: Verdict | dict) -> str:
    """``<variant>: <figure> = <value> (accept: <criterion>) PASS|FAIL``; a verdict read back from
    a result JSON (a dict) reads the same."""
    if isinstance(v, dict):
        v = msgspec.convert(v, Verdict)
    if v.median is None or v.min is None or v.max is None:
        value = "not measured"
    elif v.min == v.max:
        value = f"{v.median:.5g}"
    else:
        value = f"{v.median:.5g} (seeds {v.min:.5g}–{v.max:.5g})"
    return f"{v.variant}: {v.figure} = {value} (accept: {v.criterion}) {v.verdict}"
