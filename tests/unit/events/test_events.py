"""events/: tags, codec round trips, golden encodings (and old ones still read), bad bytes, the
event log, the vocabulary, and the docstring every message owes its readers."""

from __future__ import annotations

import re
import subprocess
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shunter import events as e
from tests.support.golden_cases import CASES, LEGACY, REVISIONS, legacy_path, path_for


def test_every_message_type_has_a_golden_case():
    assert {e.tag_of(m) for m in CASES} == set(e.BY_TAG)


@pytest.mark.parametrize("msg", CASES, ids=e.tag_of)
def test_golden_encoding_decodes_to_the_case_and_is_stable(msg):
    codec = e.Codec()
    golden = path_for(msg).read_bytes()
    assert codec.decode(golden) == msg
    assert codec.encode(msg) == golden


@pytest.mark.parametrize("tag", sorted(LEGACY))
def test_old_encodings_of_revised_messages_still_decode(tag):
    """Event logs written before a message lost a field stay readable."""
    assert REVISIONS[tag] >= 2
    assert e.Codec().decode(legacy_path(tag).read_bytes()) == LEGACY[tag]


ROUTE = re.compile(r"``[^`]+ -> [^`]+``")


@pytest.mark.parametrize("cls", e.MESSAGE_TYPES, ids=lambda c: e.tag_of(c))
def test_every_message_says_what_it_is_who_sends_it_to_whom_and_when(cls):
    doc = cls.__doc__ or ""
    assert len(doc.strip()) > 20, f"{cls.__name__} has no docstring"
    assert ROUTE.search(doc), f"{cls.__name__}'s docstring has no ``who -> whom``, when line"


def test_intents_and_orders_are_apart():
    assert set(e.INTENT_TYPES).isdisjoint(e.ORDER_TYPES)
    assert set(e.COMMAND_TYPES) == set(e.INTENT_TYPES) | set(e.ORDER_TYPES)
    assert all(issubclass(c, e.Intent) and not issubclass(c, e.Order) for c in e.INTENT_TYPES)


def test_literal_fields_refuse_values_outside_their_vocabulary():
    codec = e.Codec()
    bad = msgspec.msgpack.encode({"kind": "run.ended", "reason": "finished"})
    with pytest.raises(msgspec.ValidationError, match=r"Expected `str` matching one of|Invalid enum value"):
        codec.decode(bad)
    bad = msgspec.msgpack.encode(
        {
            "kind": "replica.mode_changed",
            "replica_id": "r",
            "mode": "sleeping",
            "previous": "rollout",
            "duration_s": 0.1,
        }
    )
    with pytest.raises(msgspec.ValidationError, match=r"\$.mode"):
        codec.decode(bad)


def test_tags_are_explicit_dotted_names_not_class_names():
    for tag, cls in e.BY_TAG.items():
        assert "." in tag and tag != cls.__name__
        assert tag.split(".")[0].isidentifier()


def test_messages_are_frozen():
    m = CASES[0]
    with pytest.raises(AttributeError):
        m.run_id = "other"


def test_batch_round_trip_and_kinds():
    codec = e.Codec()
    assert codec.decode_batch(codec.encode_batch(CASES)) == CASES
    assert all(isinstance(m, e.Event) for m in CASES if m.role == "event")
    assert {type(m) for m in CASES if isinstance(m, e.Command)} == set(e.COMMAND_TYPES)


def test_unknown_tag_and_wrong_types_raise_validation_errors():
    codec = e.Codec()
    bad = msgspec.msgpack.encode({"kind": "rollout.no_such_event"})
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'rollout.no_such_event'"):
        codec.decode(bad)
    wrong = msgspec.msgpack.encode({"kind": "trainer.step_end", "step": "three", "batch_id": 0, "duration_s": 1.0})
    with pytest.raises(msgspec.ValidationError, match=r"\$.step"):
        codec.decode(wrong)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_decode_into_anything_but_an_error_or_a_message(data):
    codec = e.Codec()
    try:
        msg = codec.decode(data)
    except msgspec.MsgspecError:
        return
    assert isinstance(msg, e.Message)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(CASES), st.data())
def test_truncated_golden_bytes_raise(msg, data):
    golden = path_for(msg).read_bytes()
    cut = data.draw(st.integers(0, len(golden) - 1))
    with pytest.raises(msgspec.MsgspecError):
        e.Codec().decode(golden[:cut])


def test_event_log_reads_back_and_reports_a_torn_tail(tmp_path):
    codec = e.Codec()
    path = tmp_path / "events.bin"
    path.write_bytes(b"".join(codec.frame(m) for m in CASES))
    assert list(e.read_log(path, reports=True)) == CASES
    with open(path, "ab") as f:
        f.write(codec.frame(CASES[0])[:-3])
    assert list(e.read_log(path, reports=True)) == CASES
    with pytest.raises(e.TornLog):
        list(e.read_log(path, strict=True))


def test_a_relay_report_reads_back_as_the_facts_it_folded_in_their_order(tmp_path):
    """One frame on disk; ``read_log`` (and ``flatten``) yield its facts in place, so a reader
    of the log never needs to know reports exist."""
    report = next(m for m in CASES if isinstance(m, e.RelayReport))
    before, after = e.RunStarted(policy="p", replicas=1), e.StepBegin(step=1, batch_id=0, samples=2, version=0)
    path = tmp_path / "events.bin"
    codec = e.Codec()
    path.write_bytes(b"".join(codec.frame(m) for m in (before, report, after)))
    assert list(e.read_log(path)) == [before, *report.events, after]
    assert list(e.flatten([before, report, after])) == [before, *report.events, after]
    assert list(e.read_log(path, reports=True)) == [before, report, after]


def test_stamper_sets_monotonic_envelope():
    stamp = e.Stamper("run-1", "trainer")
    a = stamp(e.PublishWeights())
    b = stamp(e.PublishWeights())
    assert (a.run_id, a.source, a.seq, b.seq) == ("run-1", "trainer", 1, 2)
    assert b.wall_time >= a.wall_time > 0


def test_package_installs_under_shunter_only(tmp_path):
    """Outside the checkout, only ``shunter.*`` is importable — no top-level ``events``."""
    code = (
        "import importlib.util as u, sys; "
        "assert u.find_spec('shunter.events') is not None; "
        "bad = [n for n in ('events', 'engine', 'policies', 'actors', 'bench') if u.find_spec(n)]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
