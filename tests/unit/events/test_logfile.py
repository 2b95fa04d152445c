"""Event logs on disk, damaged as operators find them (issue 14): every damaged byte range is
named with its offsets, everything else is still read, ``shunter events`` says so with a
non-zero status, and neither a repair nor a resumed run ever loses a byte."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shunter import events as e
from shunter.cli import main
from shunter.engine.io.records import EventLog
from shunter.events.examples import CASES


def _frames(n: int = 300) -> list[bytes]:
    codec = e.Codec()
    return [codec.frame(CASES[i % len(CASES)]) for i in range(n)]


def _read(path):
    reader = e.LogReader(path)
    return list(reader), reader


def test_a_whole_log_reads_back_with_no_damage(tmp_path):
    path = tmp_path / "events.bin"
    path.write_bytes(b"".join(_frames()))
    msgs, reader = _read(path)
    assert len(msgs) == 300 and reader.damage == [] and e.repair(path) is None


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "empty file"),
        (os.urandom(5000), "no whole event frame anywhere"),
        (b"step,loss\n1,0.5\n" * 50, "no whole event frame anywhere"),
    ],
    ids=["empty", "random-bytes", "text"],
)
def test_files_that_hold_no_events_are_called_what_they_are(tmp_path, capsys, content, why):
    path = tmp_path / "events.bin"
    path.write_bytes(content)
    msgs, reader = _read(path)
    assert msgs == [] and len(reader.damage) == 1 and why in reader.damage[0].why
    assert reader.damage[0].end == len(content)
    assert main(["events", str(path)]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and why in err


def test_a_torn_tail_is_reported_with_its_offset(tmp_path, capsys):
    frames = _frames()
    path = tmp_path / "events.bin"
    whole = b"".join(frames)
    path.write_bytes(whole[:-7])  # the writer was killed mid-frame
    msgs, reader = _read(path)
    assert len(msgs) == 299
    (d,) = reader.damage
    assert d.torn_tail and (d.start, d.end) == (len(whole) - len(frames[-1]), len(whole) - 7)
    assert main(["events", str(path)]) == 1
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 299 and f"bytes {d.start}-{d.end}" in out.err and "--repair" in out.err


def test_a_garbage_tail_is_not_ignored(tmp_path):
    path = tmp_path / "events.bin"
    path.write_bytes(b"".join(_frames()) + b"\x00\x00\x00\x05hello, not a frame\n")
    msgs, reader = _read(path)
    assert len(msgs) == 300 and len(reader.damage) == 1


@pytest.mark.parametrize("where", ["length", "body"])
def test_one_damaged_frame_mid_file_costs_only_its_own_bytes(tmp_path, where):
    frames = _frames()
    data = bytearray(b"".join(frames))
    k = 150
    start = sum(len(f) for f in frames[:k])
    if where == "length":
        data[start] = 0x7F  # the length now claims far more than the file holds
    else:
        data[start + 4] = 0xC1  # a byte msgpack never uses, first in the body
    path = tmp_path / "events.bin"
    path.write_bytes(bytes(data))
    msgs, reader = _read(path)
    assert len(msgs) == 299
    (d,) = reader.damage
    assert (d.start, d.end) == (start, start + len(frames[k]))
    with pytest.raises(e.TornLog, match=f"bytes {start}-"):
        list(e.read_log(path, strict=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=64)), min_size=1, max_size=4))
def test_bytes_overwritten_anywhere_lose_only_the_frames_they_touch(tmp_path, cuts):
    frames = _frames(200)
    data = bytearray(b"".join(frames))
    touched = set()
    starts = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
    for at, junk in cuts:
        at %= len(data)
        junk = junk[: len(data) - at]
        data[at : at + len(junk)] = junk
        touched |= {i for i, s in enumerate(starts) if s < at + len(junk) and at < s + len(frames[i])}
    path = tmp_path / f"events-{os.urandom(4).hex()}.bin"
    path.write_bytes(bytes(data))
    msgs, reader = _read(path)
    want = [CASES[i % len(CASES)] for i in range(200) if i not in touched]
    it = iter(msgs)
    assert all(any(m == w for m in it) for w in want), "an untouched frame was not read"
    assert len(msgs) <= 200
    if bytes(data) != b"".join(frames) and len(msgs) < 200:
        assert reader.damage, "frames were lost without a word"


def test_repair_keeps_every_byte_and_the_readable_frames_in_place(tmp_path):
    frames = _frames()
    data = bytearray(b"".join(frames))
    start = sum(len(f) for f in frames[:100])
    data[start] = 0x7F
    path = tmp_path / "events.bin"
    path.write_bytes(bytes(data))
    fix = e.repair(path)
    assert fix is not None and fix.whole and fix.frames == 299
    assert fix.kept_as.read_bytes() == bytes(data)  # the original, whole
    msgs, reader = _read(path)
    assert len(msgs) == 299 and reader.damage == []
    assert e.repair(path) is None


def test_a_resumed_run_never_truncates_a_log_damaged_mid_file(tmp_path):
    """Was: the log of a resumed run was cut at the first damaged frame (9.6 MB -> 4.8 MB)."""
    frames = _frames(2000)
    data = bytearray(b"".join(frames))
    mid = sum(len(f) for f in frames[:1000])
    data[mid : mid + 4] = b"\xff\xff\xff\xff"
    path = tmp_path / "events.bin"
    path.write_bytes(bytes(data))
    log = EventLog(path)
    log(CASES[0])
    log.close()
    assert log.repaired is not None and log.repaired.kept_as.read_bytes() == bytes(data)
    msgs, reader = _read(path)
    assert len(msgs) == 2000 and reader.damage == []  # 1999 kept + the new one


def test_a_torn_tail_is_kept_aside_and_cut_when_a_run_resumes(tmp_path):
    frames = _frames()
    whole = b"".join(frames)
    path = tmp_path / "events.bin"
    path.write_bytes(whole[:-5])
    log = EventLog(path)
    log(CASES[1])
    log.close()
    fix = log.repaired
    assert fix is not None and not fix.whole and fix.kept_as.name == f"events.bin.torn-{len(whole) - len(frames[-1])}"
    assert fix.kept_as.read_bytes() == frames[-1][:-5]
    msgs, reader = _read(path)
    assert msgs == [CASES[i % len(CASES)] for i in range(299)] + [CASES[1]] and not reader.damage


def test_the_cli_names_a_missing_log_and_a_bad_kind(tmp_path, capsys):
    assert main(["events", str(tmp_path / "nope.bin")]) == 2
    assert "no event log at" in capsys.readouterr().err
    assert main(["events", str(tmp_path)]) == 2
    path = tmp_path / "events.bin"
    path.write_bytes(b"".join(_frames(3)))
    assert main(["events", str(path), "--kind", "trainer.stepend"]) == 2
    assert "unknown --kind trainer.stepend" in capsys.readouterr().err


def test_the_cli_repairs_on_request(tmp_path, capsys):
    path = tmp_path / "events.bin"
    path.write_bytes(b"".join(_frames())[:-3])
    assert main(["events", str(path), "--repair"]) == 0
    assert "torn tail" in capsys.readouterr().err
    assert main(["events", str(path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 299
