"""One entry point per scenario kind: ``sim`` (the simulated cluster), ``overhead`` (engine
overhead next to raw Ray calls), ``real`` (real vLLM + trainer on this machine).

Invariant: every kind writes the same JSON shape (``shunter.bench.runner.results.result_json``), so the report
reads them all the same way; a scenario's acceptance criteria are judged on it whatever its kind,
printed and written with it (``"acceptance"``).
"""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path

import msgspec

from shunter.bench.runner.acceptance import judge, line
from shunter.bench.runner.results import write
from shunter.bench.runner.scenario_file import load
from shunter.bench.runner.simulated import run_scenario


def run_file(path: str, *, out: str | None = None, seeds: list[int] | None = None) -> Path:
    sc = load(path)
    if seeds:
        sc = msgspec.structs.replace(sc, scenario=msgspec.structs.replace(sc.scenario, seeds=seeds))
    print(f"scenario {sc.scenario.name} ({sc.scenario.kind}): {sc.scenario.description}")
    target = Path(out) if out else Path("bench/results") / f"{sc.scenario.name}.json"
    if sc.scenario.kind == "sim":
        target.parent.mkdir(parents=True, exist_ok=True)
        result = run_scenario(sc, out_dir=target.parent)
    elif sc.scenario.kind == "overhead":
        from shunter.bench.runner.overhead import run_overhead

        result = run_overhead(sc)
    elif sc.scenario.kind == "real":
        from shunter.bench.runner.real import run_real

        result = run_real(sc)
    else:
        raise ValueError(f"scenario {path}: unknown kind {sc.scenario.kind!r} (sim, overhead, real)")
    result["command"] = command_line(path, seeds)
    verdicts = judge(sc, result["metrics"])
    if verdicts:
        result["acceptance"] = msgspec.to_builtins(verdicts)
        print("acceptance (as the scenario states it):")
        for v in verdicts:
            print(f"  {line(v)}")
    return write(result, target)


def command_line(path: str, seeds: list[int] | None) -> str:
    """The command that reproduces a result, naming the scenario file as it was run (relative
    to the working directory where it lies below it, quoted for the shell) — the report quotes it."""
    p = Path(path)
    with contextlib.suppress(ValueError):
        p = p.resolve().relative_to(Path.cwd().resolve())
    seeds_arg = " --seeds " + " ".join(map(str, seeds)) if seeds else ""
    return f"python -m shunter.bench run {shlex.quote(p.as_posix())}{seeds_arg}"  # a path with a space: one argument
