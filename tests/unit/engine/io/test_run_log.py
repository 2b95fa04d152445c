"""The structured run log an operator tails: one line per message but for the routine ones,
whose lines do not grow with the fleet (per-replica weight loads, per-group drops), and
nothing lost from the event log."""

from __future__ import annotations

import json

from shunter.engine.io.records import EventLog, LogSink, make_logger
from shunter.events import GroupDropped, SampleAborted, StepEnd, WeightsLoaded, read_log

ENV = {"run_id": "r", "source": "t", "wall_time": 1.0}


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_weight_loads_and_drops_are_logged_at_milestones_with_their_count(tmp_path):
    log, events = tmp_path / "run.log", tmp_path / "events.bin"
    sinks = [LogSink(make_logger(log)), EventLog(events)]
    msgs = []
    for v in (1, 2):
        msgs += [WeightsLoaded(replica_id=f"r{i}", version=v, duration_s=0.01, **ENV) for i in range(1200)]
    msgs += [GroupDropped(group_id=g, reason="stale", samples=2, **ENV) for g in range(25)]
    msgs += [GroupDropped(group_id=100, reason="failed", samples=2, **ENV)]
    msgs += [SampleAborted(sample_id="1.0", group_id=1, replica_id="r0", reason="failed", **ENV)]
    msgs += [StepEnd(step=1, batch_id=0, duration_s=1.0, **ENV)]
    for m in msgs:
        for s in sinks:
            s(m)
    sinks[1].close()
    got = lines(log)
    loads = [(x["version"], x["count"]) for x in got if x["event"] == "rollout.weights_loaded"]
    assert loads == [(1, 1), (1, 10), (1, 100), (1, 1000), (2, 1), (2, 10), (2, 100), (2, 1000)]
    drops = [(x["reason"], x["count"]) for x in got if x["event"] == "buffer.group_dropped"]
    assert drops == [("stale", 1), ("stale", 10), ("failed", 1)]
    assert [x["event"] for x in got][-2:] == ["rollout.sample_aborted", "trainer.step_end"]  # the rest, a line each
    assert len(list(read_log(events))) == len(msgs)  # the event log keeps every one


def test_the_milestone_counts_of_old_versions_are_forgotten(tmp_path):
    """A run of many days publishes thousands of versions: the sink keeps a bounded table."""
    sink = LogSink(make_logger(tmp_path / "run.log"))
    for v in range(500):
        sink(WeightsLoaded(replica_id="r0", version=v, duration_s=0.01, **ENV))
    assert len(sink._routine) <= 64
    assert len((tmp_path / "run.log").read_text().splitlines()) == 500  # each version's first load still logged


def test_the_same_reward_error_many_times_is_logged_at_each_milestone(tmp_path):
    """Was (outsider, 2026-12-03): the milestone filter and the repeated-error filter both
    counted, so 307 identical reward failures gave one line instead of the 1st, 10th, 100th."""
    from shunter.events import RewardFailed

    sink = LogSink(make_logger(tmp_path / "run.log"))
    for i in range(307):
        sink(
            RewardFailed(
                replica_id="r0",
                sample_id=f"{i}.0",
                group_id=i,
                failure="raised",
                error="raised KeyError: 'x'",
                user_code="m:f",
                **ENV,
            )
        )
    got = [x for x in lines(tmp_path / "run.log") if x["event"] == "rollout.reward_failed"]
    assert [x["count"] for x in got] == [1, 10, 100]


def test_the_printed_summary_says_how_many_reward_calls_failed(capsys):
    """Was (outsider, 2026-12-03): a run whose rewards mostly timed out printed a plain
    'completed'; the counts were only in the event log."""
    from shunter.events import RunEnded
    from shunter.progress import print_summary

    summary = {"wall_s": 5.0, "reward/raised": 0.0, "reward/returned": 1.0, "reward/timeout": 581.0}
    print_summary(RunEnded(reason="completed", steps=8, summary=summary, **ENV))
    out = capsys.readouterr().out
    assert "reward failures  raised 0, returned 1, timeout 581" in out and "env failures" not in out
    assert "reward workers" not in out and "data_source" not in out


def test_the_printed_summary_says_reward_workers_were_lost_and_rows_had_no_source(capsys):
    """Was (outsider, 2026-12-03): the counts were in run.log's summary only; the terminal showed
    Ray's own out-of-memory-like text for each death."""
    from shunter.events import RunEnded
    from shunter.progress import print_summary

    summary = {"wall_s": 5.0, "reward/worker_died": 13.0, "data/source_from_file_name": 20.0}
    print_summary(RunEnded(reason="completed", steps=8, summary=summary, **ENV))
    out = capsys.readouterr().out
    assert "reward workers   lost: died 13, hung 0" in out
    assert "20 rows without data_source were given their file's base name" in out


def test_a_validation_whose_reward_failed_is_a_warning_line_and_a_printed_line_not_a_failed_command(tmp_path, capsys):
    import asyncio

    from tqdm import tqdm

    from shunter.events import RunEnded, ValidateEnd
    from shunter.progress import follow_run

    err = "reward function m:f failed on 4 held-out prompts (scored 0), first: raised KeyError: " + "x" * 5000
    vals = [
        ValidateEnd(version=v, duration_s=1.0, metrics={"reward_errors": 4.0}, errors=[err], **ENV) for v in range(12)
    ]
    sink = LogSink(make_logger(tmp_path / "run.log"))
    sink(vals[0])
    [line] = lines(tmp_path / "run.log")
    assert line["event"] == "validate.end" and line["level"] == "warning" and len(line["errors"][0]) < 2100

    class Run:  # what follow_run reads of an Engine: its events, then how it ended
        ended = RunEnded(reason="completed", steps=1, **ENV)

        async def events(self):
            for v in vals:
                yield v

    asyncio.run(follow_run(Run(), tqdm(disable=True)))
    printed = [x for x in capsys.readouterr().err.splitlines() if x.startswith("validate.end")]
    assert printed[0].startswith("validate.end: version 0: reward function m:f failed on 4 held-out prompts")
    assert len(printed) == 2 and printed[1].endswith("(x10)")  # the 1st and the 10th of 12
    assert "command.failed" not in capsys.readouterr().err


def test_the_bar_ends_on_the_final_validation_and_names_its_version():
    """The final validation comes after the last step: the bar must show it (the summary prints
    it), not the last in-run one, and say which weights each figure scored."""
    import asyncio

    from tqdm import tqdm

    from shunter.events import RunEnded, StepEnd, ValidateEnd
    from shunter.progress import follow_run

    evs = [
        StepEnd(step=1, batch_id=0, duration_s=1.0, metrics={"batch/reward_mean": 0.1}, **ENV),
        ValidateEnd(version=1, duration_s=1.0, metrics={"exact": 0.06}, **ENV),
        StepEnd(step=2, batch_id=1, duration_s=1.0, metrics={"batch/reward_mean": 0.2}, **ENV),
        ValidateEnd(version=2, duration_s=1.0, metrics={"exact": 0.164}, **ENV),
    ]

    class Run:
        ended = RunEnded(reason="completed", steps=2, **ENV)

        async def events(self):
            for ev in evs:
                yield ev

    bar = tqdm(disable=True)
    asyncio.run(follow_run(Run(), bar))
    assert bar.postfix.startswith("reward 0.200") and bar.postfix.endswith("val exact 0.16 (version 2)")


def test_a_long_list_of_names_in_a_log_line_says_how_many_it_leaves_out(tmp_path):
    """A list of strings is cut to its first 8 in a log line (long ValidateEnd.errors); one of a
    large fleet's replica ids must say it was cut, not read as the whole fleet."""
    from shunter.events import ValidateBegin

    sink = LogSink(make_logger(tmp_path / "run.log"))
    sink(ValidateBegin(version=1, prompts=4, replica_ids=[f"standalone-{i}" for i in range(10)], **ENV))
    [line] = lines(tmp_path / "run.log")
    ids = line["replica_ids"]
    assert ids[:8] == [f"standalone-{i}" for i in range(8)] and ids[8:] == ["... 2 more"]
