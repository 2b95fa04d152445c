"""``shunter`` command line: run a config, check a policy, read an event log, print the
config schema.

Invariant: the CLI is only a user of the ``Engine`` facade, the policy contract and the
codec — no logic of its own beyond presenting progress and results. Import strings
(``module:Name``) resolve from the config file's folder and the working directory first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from shunter.engine.config.base import ConfigError
from shunter.engine.config.load import load_config, schema

EXIT_STATUSES: dict[int, str] = {
    0: "the run completed; every policy check passed; the event log read whole",
    1: "the run failed or did not start (its error is printed: a crash, a stall, unusable data, no model, no Ray "
    "cluster at the address, checkpoints that cannot be saved, no room to restart after a lost trainer — with the "
    "--resume line where a checkpoint was saved), or its policy or your program ended it early with a Stop; a "
    "policy check failed; the event log is damaged",
    2: "a usage error: a bad config, option or argument; a checkpoint --resume cannot use; no event log at the path",
    130: "stopped by Ctrl-C: the run stopped at a consistent cut and saved a checkpoint there if "
    "run.checkpoint_every > 0 (--resume continues it); a second Ctrl-C stops at once, without saving",
    143: "stopped by SIGTERM (kill, a scheduler's preemption): as 130",
}
"""The CLI's exit statuses, one table: ``shunter --help`` prints it and the README holds the
same rows (a test keeps them equal)."""
OK, FAILED, USAGE = 0, 1, 2


def exit_statuses() -> str:
    return "exit statuses:\n" + "\n".join(f"  {k:<4} {v}" for k, v in EXIT_STATUSES.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="shunter",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog=exit_statuses(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run an async RL job from a TOML config")
    r.add_argument("config")
    r.add_argument("--steps", type=_at_least_one, help="override run.total_steps (1 or more)")
    r.add_argument("--policy", help="override run.policy")
    r.add_argument("--output-dir", help="override run.output_dir")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="override run.ray_address: join the Ray cluster 'ray start --head' started ('auto': the one on this "
        "machine); without it the run starts its own local cluster",
    )
    r.add_argument(
        "--run-id", help="the run's id (default: '<run.name>-<random>'); its records go to <output_dir>/<id>"
    )
    r.add_argument(
        "--resume",
        metavar="PATH",
        help="continue a run from a checkpoint folder or a run folder (its newest valid checkpoint)",
    )
    c = sub.add_parser("check-policy", help="run the policy contract on any policy ('module:Class' or a built-in)")
    c.add_argument("policy")
    c.add_argument("--options", default="{}", help="JSON object of constructor options (run.policy_options)")
    c.add_argument(
        "--standalone", type=_count, help="standalone replicas (default: the first setup the policy accepts)"
    )
    c.add_argument("--hybrid", type=_count, help="hybrid replicas")
    c.add_argument("--only", action="append", choices=_checks(), help="run only this check (repeatable)")
    c.add_argument("--time-limit", type=_positive, default=30.0, help="real seconds per check (default 30)")
    c.add_argument(
        "--budget-ms",
        type=_positive,
        default=10.0,
        help="run.policy_budget_ms: more than 3 decide() calls slower than this fail (default 10)",
    )
    e = sub.add_parser(
        "events",
        help="print an event log (events.bin) as JSON lines; damage goes to stderr with byte offsets (exit status 1)",
    )
    e.add_argument("path")
    e.add_argument("--kind", action="append", help="only these tags (repeatable)")
    e.add_argument(
        "--repair",
        action="store_true",
        help="make a damaged log readable: the damaged bytes are kept aside (nothing is deleted), "
        "the readable frames stay in place",
    )
    sub.add_parser("config-schema", help="print the documented config schema (JSON schema)")
    args = p.parse_args(argv)
    if args.cmd == "run":
        return _run(args)
    if args.cmd == "events":
        return _events(args)
    if args.cmd == "check-policy":
        return _check_policy(args)
    print(json.dumps(schema(), indent=2))
    return OK


def _run(args) -> int:
    over: dict = {"run": {}}
    if args.steps is not None:
        over["run"]["total_steps"] = args.steps
    if args.policy:
        over["run"]["policy"] = args.policy
    if args.output_dir:
        over["run"]["output_dir"] = args.output_dir
    if args.no_progress:
        over["run"]["progress"] = False
    if args.address:
        over["run"]["ray_address"] = args.address
    try:
        cfg = load_config(args.config, over)
    except ConfigError as e:
        print(f"shunter: bad config: {e}", file=sys.stderr)
        return USAGE
    from shunter.engine.io.checkpoint import CheckpointError
    from shunter.engine.io.errors import EngineSetupError, RestartError
    from shunter.progress import run_with_progress

    try:
        ended = asyncio.run(run_with_progress(cfg, resume=args.resume, run_id=args.run_id))
    except CheckpointError as e:
        print(f"shunter: cannot resume: {e}", file=sys.stderr)
        return USAGE
    except RestartError as e:  # it ran, lost a component, and could not start again
        print(f"shunter: the run failed: {e}", file=sys.stderr)
        return FAILED
    except EngineSetupError as e:
        print(f"shunter: the run did not start: {e}", file=sys.stderr)
        return FAILED
    except (KeyboardInterrupt, asyncio.CancelledError):  # stopped on the way out; progress said how to resume
        from shunter import progress

        return progress.exit_on_next_signal()  # the run is saved: one more signal on the way out exits
    if ended.reason == "error":
        from shunter import progress

        how_on = "" if "--resume" in ended.error or progress.RUN_DIR is None else f"; {progress.then(progress.RUN_DIR)}"
        print(f"shunter: the run failed: {ended.error}{how_on}", file=sys.stderr)
    return OK if ended.reason == "completed" else FAILED


def _check_policy(args) -> int:
    import os

    from shunter import contract
    from shunter.policies.registry import import_paths

    try:
        options = json.loads(args.options)
        if not isinstance(options, dict):
            raise ValueError("--options must be a JSON object")
    except ValueError as e:
        print(f"shunter: bad --options: {e}", file=sys.stderr)
        return USAGE
    with import_paths([os.getcwd()]):
        try:
            subject = contract.subject_for(args.policy, options, standalone=args.standalone, hybrid=args.hybrid)
            subject.make()  # options the constructor refuses: a usage error, said once
        except ValueError as e:
            print(f"shunter: {e}", file=sys.stderr)
            return USAGE
        subject.time_limit_s, subject.budget_ms = args.time_limit, args.budget_ms
        setup = f"{subject.standalone} standalone + {subject.hybrid} hybrid replicas"
        print(f"checking {args.policy} with {setup}", flush=True)
        results = []
        for name in args.only or list(contract.CHECKS):
            (r,) = contract.run_checks(subject, [name])
            results.append(r)
            print(f"  {'ok  ' if r.ok else 'FAIL'} {r.check:<17} {r.seconds:6.2f}s  {r.detail}", flush=True)
        if subject.decisions is not None:
            print(f"what it did in the run check ({subject.steps} simulated steps, {setup}):")
            for line in subject.decisions.lines():
                print(f"  {line}")
    failed = [r.check for r in results if not r.ok]
    verdict = f"{len(failed)} of {len(results)} checks failed ({', '.join(failed)})" if failed else "all passed"
    print(f"{args.policy}: {verdict}")
    return FAILED if failed else OK


def _checks() -> list[str]:
    from shunter import contract

    return list(contract.CHECKS)


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def _at_least_one(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {n}")
    return n


def _positive(text: str) -> float:
    x = float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return x


def _events(args) -> int:
    import msgspec

    from shunter.events import BY_TAG, LogReader, repair, tag_of

    path = Path(args.path)
    if not path.is_file():
        print(
            f"shunter: no event log at {path}" + (" (a folder: its events.bin?)" if path.is_dir() else ""),
            file=sys.stderr,
        )
        return USAGE
    if unknown := sorted(set(args.kind or ()) - set(BY_TAG)):
        print(f"shunter: unknown --kind {', '.join(unknown)} (tags: shunter.events.BY_TAG)", file=sys.stderr)
        return USAGE
    if args.repair:
        fix = repair(path)
        print(fix.describe() if fix else f"{path}: whole, nothing to repair", file=sys.stderr)
        return OK
    reader = LogReader(path)
    for msg in reader:
        if args.kind and tag_of(msg) not in args.kind:
            continue
        sys.stdout.write(msgspec.json.encode(msg).decode() + "\n")
    for d in reader.damage:
        print(f"shunter: damaged event log: {d.describe(path)}", file=sys.stderr)
    if reader.damage and reader.size:
        print(
            f"shunter: read {reader.frames} frames of {path}; `shunter events --repair {path}` keeps the damaged "
            "bytes aside and the readable frames in place",
            file=sys.stderr,
        )
    return FAILED if reader.damage else OK


if __name__ == "__main__":
    sys.exit(main())
