"""``shunter`` command line: run a config, read an event log, print the config schema.

Invariant: the CLI is only a user of the ``Engine`` facade and the codec — no logic of
its own beyond presenting progress and the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from shunter.engine.config import ConfigError, load_config, schema


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shunter", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run an async RL job from a TOML config")
    r.add_argument("config")
    r.add_argument("--steps", type=int, help="override run.total_steps")
    r.add_argument("--policy", help="override run.policy")
    r.add_argument("--output-dir", help="override run.output_dir")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--resume", metavar="PATH",
                   help="continue a run from a checkpoint folder or a run folder (its newest valid checkpoint)")
    e = sub.add_parser("events", help="print an event log (events.bin) as JSON lines")
    e.add_argument("path")
    e.add_argument("--kind", action="append", help="only these tags (repeatable)")
    sub.add_parser("config-schema", help="print the documented config schema (JSON schema)")
    args = p.parse_args(argv)
    if args.cmd == "run":
        return _run(args)
    if args.cmd == "events":
        return _events(args)
    print(json.dumps(schema(), indent=2))
    return 0


def _run(args) -> int:
    over: dict = {"run": {}}
    if args.steps:
        over["run"]["total_steps"] = args.steps
    if args.policy:
        over["run"]["policy"] = args.policy
    if args.output_dir:
        over["run"]["output_dir"] = args.output_dir
    if args.no_progress:
        over["run"]["progress"] = False
    try:
        cfg = load_config(args.config, over)
    except ConfigError as e:
        print(f"shunter: bad config: {e}", file=sys.stderr)
        return 2
    from shunter.engine.checkpoint import CheckpointError
    from shunter.progress import run_with_progress

    try:
        ended = asyncio.run(run_with_progress(cfg, resume=args.resume))
    except CheckpointError as e:
        print(f"shunter: cannot resume: {e}", file=sys.stderr)
        return 2
    return 0 if ended.reason == "completed" else 1


def _events(args) -> int:
    import msgspec

    from shunter.events import read_log, tag_of

    for msg in read_log(Path(args.path)):
        if args.kind and tag_of(msg) not in args.kind:
            continue
        sys.stdout.write(msgspec.json.encode(msg).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
