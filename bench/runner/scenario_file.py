"""A bench scenario file (``bench/scenarios/*.toml``) as data: its Structs — the scenario's
``[scenario]`` block (:class:`Meta`), the simulated ``[cluster]``, the ``[cost]`` model, the
engine settings and the ``[[variant]]`` s — and :func:`load`.

Invariant: a scenario loads only as these Structs (unknown keys are errors, never a silent
default), and relative length files are resolved from the scenario file's folder at load, so a
scenario means the same from any working directory.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

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


class Scenario(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    scenario: Meta
    cluster: Cluster = Cluster()
    cost: CostModel = CostModel()
    engine: dict[str, Any] = {}
    variant: list[Variant] = []


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
    wrong = [
        n for n in [sc.scenario.baseline, *(n for pair in sc.scenario.pairs for n in pair)] if n and n not in names
    ]
    if wrong:
        raise ValueError(f"scenario {p}: no variant named {', '.join(map(repr, wrong))} (variants: {names})")
    return sc
