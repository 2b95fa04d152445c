"""Issue 46, item 6: every "waiting" line on the terminal gets its "done waiting" line, with
``--no-progress`` too (the lines go through ``tqdm.write``, the bar disabled).

Kept complete by the vocabulary: every event tagged ``<component>.pending`` has a
``<component>.waited`` partner, and ``follow_run`` prints a line for each of both, whatever the
outcome of the wait."""

from __future__ import annotations

import asyncio

from tqdm import tqdm

from shunter.events import BY_TAG, RunEnded
from shunter.events.examples import CASES
from shunter.progress import follow_run


def _printed(evs, capsys) -> list[str]:
    class Run:  # what follow_run reads of an Engine: its events, then how it ended
        ended = RunEnded(reason="completed", steps=1, run_id="r", source="t", wall_time=1.0)

        async def events(self):
            for ev in evs:
                yield ev

    asyncio.run(asyncio.wait_for(follow_run(Run(), tqdm(disable=True)), 10))
    return capsys.readouterr().err.splitlines()


def test_every_pending_event_has_a_waited_partner():
    pending = sorted(t for t in BY_TAG if t.endswith(".pending"))
    assert pending == ["replica.pending", "trainer.pending"]
    for tag in pending:
        assert tag.replace(".pending", ".waited") in BY_TAG, f"{tag} has no end: add its .waited event"


def test_every_wait_prints_its_start_and_its_end_whatever_the_outcome(capsys):
    import msgspec

    by_tag = {type(e).__struct_config__.tag: e for e in CASES}
    for tag in sorted(t for t in BY_TAG if t.endswith(".pending")):
        start, end = by_tag[tag], by_tag[tag.replace(".pending", ".waited")]
        for outcome in ("placed", "gave_up"):
            lines = _printed([start, msgspec.structs.replace(end, outcome=outcome)], capsys)
            assert [x.split(":")[0] for x in lines] == [tag, tag.replace(".pending", ".waited")], lines
            assert "waits up to" in lines[0]
            said = lines[1]
            assert ("found room" in said or "room for the trainer after" in said) == (outcome == "placed"), said


def test_the_trainer_pending_line_names_what_it_waits_for_and_how_long(capsys):
    from shunter.events import TrainerPending

    ev = TrainerPending(
        reason="trainer failed: node died",
        checkpoint_step=30,
        missing={"node_t": 1.0},
        free={"node_t": 0.0},
        deadline_s=300.0,
        run_id="r",
        source="engine",
        wall_time=1.0,
    )
    [line] = _printed([ev], capsys)
    assert line.startswith("trainer.pending: the run lost its trainer and restarts from its checkpoint at step 30")
    assert "it needs 1 node_t (free 0); it waits up to 300s (run.restart_wait_s)" in line
