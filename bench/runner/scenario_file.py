"""A bench scenario file (``bench/scenarios/*.toml``) as data: its Structs — the scenario's
``[scenario]`` block (:class:`Meta`), the simulated ``[cluster]``, the ``[cost]`` model, the
engine settings, the ``[[variant]]`` s and the ``[[acceptance]]`` criteria (:class:`Acceptance`) — and :func:`load`.

Invariant: a scenario loads only as these Structs (unknown keys are errors, never a silent
default); every name it compares results by — baseline, pairs, an acceptance's figure and
variants — is checked at load, before anything runs; and relative length files are resolved
from the scenario file's folder at load, so a scenario means the same from any working directory.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from shunter.bench.runner.figure_names import RETIRED, known
from shunter.bench.sim.cost_model import CostModel
from shunter.engine.replica import lengths


class Variant(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    policy: str
    trainer_gpus: int = 0
    max_staleness: int = 1
    hybrid: bool = False
    policy_options: dict[str, float | int | str | bool] = {}
    engine: dict[str, Any] = {}
    cost: dict[str, Any] = {}
    """Cost-model fields this variant changes (a workload twin: e.g. single-turn samples of
    the same generated length beside multi-turn ones); compare such variants through ``pairs``."""
    charge_coordinator: bool | None = None
    """Overrides the scenario's ``charge_coordinator`` for this variant (the same run with the
    coordinator's CPU not charged is the reference a charged one is compared with, ``pairs``)."""


class Cluster(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    gpus: int = 8
    gpus_per_replica: int = 1
    gpus_per_node: int = 8
    """GPUs of one host: its replicas answer through one relay (``engine.coordinator.relay``)."""


class Meta(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    description: str = ""
    kind: str = "sim"
    seeds: list[int] = msgspec.field(default_factory=lambda: [1, 2, 3])
    baseline: str = ""
    timeline: bool = False
    """Draw a timeline PNG of every variant's first-seed run next to the results."""
    charge_coordinator: bool = True
    """The coordinator's real CPU time passes on the simulated clock (``shunter.bench.sim.accounting.ChargedInbox``):
    a coordinator that cannot keep up slows the run instead of hiding in virtual time."""
    production_sinks: bool = False
    """Attach a production run's sinks (event log, structured log, metrics, feed) in a
    temporary folder, so the coordinator pays what a real run's pays per message."""
    pairs: list[list[str]] = []
    """[variant, reference] pairs: ``time_vs_reference`` = variant wall time / reference wall
    time, seed by seed (0.9 = 10 % less time)."""


class Acceptance(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A criterion the scenario states for its result (``[[acceptance]]``): ``figure`` (a name of
    ``bench/runner/figure_names.py``) lies within ``at_least`` .. ``at_most`` (either may be left
    out) on every seed, for each of ``variants`` (none named: every variant). ``bench run``
    prints each verdict and writes it to the JSON (``shunter.bench.runner.acceptance``)."""

    figure: str
    at_least: float | None = None
    at_most: float | None = None
    variants: list[str] = []

    def criterion(self) -> str:
        if self.at_least is not None and self.at_most is not None:
            bound = f"{self.at_least:g} <= x <= {self.at_most:g}"
        elif self.at_least is not None:
            bound = f"x >= {self.at_least:g}"
        else:
            bound = f"x <= {self.at_most:g}"
        return f"{bound} on every seed"

    def holds(self, x: float) -> bool:
        return (self.at_least is None or x >= self.at_least) and (self.at_most is None or x <= self.at_most)


class Scenario(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    scenario: Meta
    cluster: Cluster = Cluster()
    cost: CostModel = CostModel()
    engine: dict[str, Any] = {}
    variant: list[Variant] = []
    acceptance: list[Acceptance] = []


def load(path: str | Path) -> Scenario:
    """A scenario file; relative length files (``cost.lengths_file``, ``rollout.length_dist =
    "file:..."`` of the engine block and of each variant's) are resolved from its folder."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"scenario {p}: {e}") from None
    base = p.resolve().parent
    cost = data.get("cost")
    if isinstance(cost, dict) and isinstance(f := cost.get("lengths_file"), str) and f:
        cost["lengths_file"] = str(lengths.resolved_path(Path(f), base))
    for eng in [data.get("engine"), *(v.get("engine") for v in data.get("variant", []) if isinstance(v, dict))]:
        ro = eng.get("rollout") if isinstance(eng, dict) else None
        if isinstance(ro, dict) and isinstance(ro.get("length_dist"), str):
            ro["length_dist"] = lengths.resolved(ro["length_dist"], base)
    try:
        sc = msgspec.convert(data, Scenario)
    except msgspec.ValidationError as e:
        raise ValueError(f"scenario {p}: {e}") from None
    # names the results are compared by, checked before anything runs (a typo found after the
    # last variant would lose every result of the run)
    names = [v.name for v in sc.variant]
    if bad := [pair for pair in sc.scenario.pairs if len(pair) != 2]:
        raise ValueError(f"scenario {p}: a pair is [variant, reference], got {bad[0]!r}")
    named = [sc.scenario.baseline, *(n for pair in sc.scenario.pairs for n in pair)]
    wrong = [n for n in [*named, *(n for a in sc.acceptance for n in a.variants)] if n and n not in names]
    if wrong:
        raise ValueError(f"scenario {p}: no variant named {', '.join(map(repr, wrong))} (variants: {names})")
    for a in sc.acceptance:
        check_acceptance(p, sc, a)
    return sc


def check_acceptance(p: Path, sc: Scenario, a: Acceptance) -> None:
    """``a`` names a figure a result of this scenario's kind holds, and a bound that can hold."""
    where = f"scenario {p}: acceptance of {a.figure!r}"
    figures = known(sc.scenario.kind, sc.scenario.baseline)
    if a.figure not in figures:
        if a.figure in RETIRED:
            hint = f"it was renamed or replaced: {RETIRED[a.figure]}"
        else:
            close = difflib.get_close_matches(a.figure, sorted(figures), n=3)
            hint = f"did you mean {' or '.join(map(repr, close))}?" if close else "see bench/runner/figure_names.py"
        raise ValueError(f"{where}: no such figure in a {sc.scenario.kind!r} scenario's result ({hint})")
    paired = {pair[0] for pair in sc.scenario.pairs}
    if a.figure == "time_vs_reference" and (
        lone := [n for n in a.variants or [v.name for v in sc.variant] if n not in paired]
    ):
        raise ValueError(f"{where}: only a variant of scenario.pairs has it, not {', '.join(map(repr, lone))}")
    if a.at_least is None and a.at_most is None:
        raise ValueError(f"{where}: give at_least, at_most or both")
    if a.at_least is not None and a.at_most is not None and a.at_least > a.at_most:
        raise ValueError(f"{where}: at_least = {a.at_least:g} is above at_most = {a.at_most:g}")
