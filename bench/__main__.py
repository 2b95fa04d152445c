"""``python -m shunter.bench``: run a scenario, build the report, export a trace.

python -m shunter.bench run bench/scenarios/sync_vs_async.toml [--out bench/results/sync_vs_async.json]
python -m shunter.bench report bench/results/*.json [--out bench/REPORT.md]
python -m shunter.bench trace runs/<run_id>/events.bin trace.json
python -m shunter.bench gpu --config examples/gpu_qwen05b.toml --out bench/results/gpu_h200.json
python -m shunter.bench gpu-sim DIR [DIR ...]   # the simulator vs the real two-GPU runs in DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shunter.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one scenario file, write one JSON")
    r.add_argument("scenario")
    r.add_argument("--out", help="default: bench/results/<scenario name>.json")
    r.add_argument("--seeds", type=int, nargs="*", help="override the scenario's seeds")
    rep = sub.add_parser("report", help="Markdown table + PNG plots from result JSONs")
    rep.add_argument("results", nargs="+")
    rep.add_argument("--out", default="bench/REPORT.md")
    t = sub.add_parser("trace", help="event log -> Perfetto / Chrome trace JSON")
    t.add_argument("events")
    t.add_argument("out")
    sub.add_parser(
        "gpu", help="GPU measurements (weight sync, rollout efficiency, switch cost, policies)", add_help=False
    )
    sub.add_parser("gpu-sim", help="the simulator calibrated on real GPU runs, predicted vs measured", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "gpu":
        from shunter.bench.gpu import measure as gpu

        return gpu.main(argv[1:])
    if argv and argv[0] == "gpu-sim":
        from shunter.bench.gpu import sim_vs_real as gpu_sim

        return gpu_sim.main(argv[1:])
    args = p.parse_args(argv)
    try:
        return _command(args)
    except (ValueError, OSError) as e:  # a scenario's or a file's mistake: one line, not a traceback
        print(f"python -m shunter.bench {args.cmd}: {e}", file=sys.stderr)
        return 2


def _command(args: argparse.Namespace) -> int:
    if args.cmd == "run":
        from shunter.bench.runner import kinds as runners

        out = runners.run_file(args.scenario, out=args.out, seeds=args.seeds)
        print(f"wrote {out}")
    elif args.cmd == "report":
        from shunter.bench.report.markdown import write_report

        print(f"wrote {write_report([Path(x) for x in args.results], Path(args.out))}")
    else:
        from shunter.bench.report.trace import write_trace
        from shunter.events import read_log

        print(f"wrote {write_trace(read_log(args.events), args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
