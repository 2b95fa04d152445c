"""The simulated replica: decode, attention, chunked prefill, the KV cache and preemption, by
hand on small cases, and its books under random traffic (every request ends with exactly its
target, the KV reserved never exceeds the cache, time only moves forward)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shunter.bench.sim.replica_model import ReplicaModel, lone_decode_s, prefill_s


@dataclass(frozen=True)
class Cost:
    decode_step_s: float = 0.01
    decode_step_s_per_seq: float = 0.0
    decode_s_per_kv_token: float = 0.0
    prefill_s_per_token: float = 0.0
    prefill_s_per_token_ctx: float = 0.0
    prefill_chunk_tokens: int = 100
    kv_tokens: int = 0


def run(m: ReplicaModel, until: float = 1e9) -> dict[str, tuple[float, int]]:
    """Jump from event to event; when each request finished and with how many tokens."""
    done = {}
    while (dt := m.next_event_in()) is not None and m.t + dt <= until:
        t = m.t + dt
        for rid, n in m.advance_to(t):
            done[rid] = (t, n)
    return done


def test_one_sequence_alone_takes_its_steps():
    m = ReplicaModel(Cost())
    m.submit("a", 10, 100)
    assert run(m) == {"a": (pytest.approx(1.0), 100)}


def test_batch_cost_per_sequence_slows_everyone():
    m = ReplicaModel(Cost(decode_step_s_per_seq=0.01))
    m.submit("a", 10, 100)
    m.submit("b", 10, 50)
    done = run(m)
    # 50 steps of 0.03 s together, then 50 of 0.02 s alone
    assert done["b"] == (pytest.approx(1.5), 50)
    assert done["a"] == (pytest.approx(2.5), 100)


def test_attention_cost_grows_with_context_as_the_closed_form_says():
    c = Cost(decode_s_per_kv_token=1e-5)
    m = ReplicaModel(c)
    m.submit("a", 1000, 500)
    t, n = run(m)["a"]
    assert n == 500
    assert t == pytest.approx(lone_decode_s(c, 1000, 500))
    assert t == pytest.approx(500 * 0.01 + 1e-5 * (500 * 1000 + 500 * 499 / 2))


def test_prefill_is_the_replicas_work_chunked_first_come_first_served():
    c = Cost(prefill_s_per_token=1e-3, prefill_chunk_tokens=100)  # a chunk: 0.1 s of prefill per step
    m = ReplicaModel(c)
    m.submit("a", 200, 10)
    m.submit("b", 100, 10)
    assert prefill_s(c, 200) == pytest.approx(0.2)
    done = run(m)
    # a prefills in 2 steps of 0.11 s; then b prefills in 1 step while a decodes; then both decode
    assert done["a"][0] == pytest.approx(0.22 + 0.11 + 9 * 0.01)
    assert done["b"][0] == pytest.approx(0.22 + 0.11 + 10 * 0.01)


def test_prefill_attention_grows_with_the_square_of_the_context():
    c = Cost(prefill_s_per_token=1e-4, prefill_s_per_token_ctx=1e-7)
    assert prefill_s(c, 1000) == pytest.approx(0.1 + 1e-7 * 1000 * 1000 / 2)


def test_a_request_waits_for_room_in_the_kv_cache():
    m = ReplicaModel(Cost(kv_tokens=100))
    m.submit("a", 50, 40)
    m.submit("b", 50, 10)  # 50 + 50 cannot both fit with room to grow
    assert m.batch == 1 and len(m.waiting) == 1
    done = run(m)
    assert done["a"] == (pytest.approx(0.4), 40)
    assert done["b"] == (pytest.approx(0.5), 10)


def test_the_newest_sequence_is_preempted_when_the_cache_fills_and_recomputed_later():
    c = Cost(kv_tokens=100, prefill_s_per_token=1e-4, prefill_chunk_tokens=1000)
    m = ReplicaModel(c)
    m.submit("a", 10, 80)
    m.submit("b", 10, 80)
    done = run(m)
    assert m.preemptions >= 1
    assert done["a"][1] == 80 and done["b"][1] == 80
    assert done["b"][0] > done["a"][0]
    assert m.prefilled_s > prefill_s(c, 10) * 2  # b's context was prefilled again
    # the books name the recomputation: all the prefill but the two prompts'
    assert m.books().recompute_s == pytest.approx(m.prefilled_s - 2 * prefill_s(c, 10))
    assert not m.running and not m.waiting and not m.prefilling


def test_a_preempted_context_still_cached_is_not_prefilled_again():
    """vLLM keeps a preempted request's blocks hashed in the free queue, its last block evicted
    first; new blocks come from the least recently freed. b is preempted at a context of 50
    (100 tokens of cache, a and b grew together); a grows 5 more tokens to its end, taken from
    b's tail; b comes back with 45 tokens cached and prefills 5."""
    c = Cost(kv_tokens=100, prefill_s_per_token=1e-4, prefill_chunk_tokens=1000)
    m = ReplicaModel(c)
    m.submit("a", 10, 45)
    m.submit("b", 10, 80)
    done = run(m)
    assert done["a"][1] == 45 and done["b"][1] == 80 and m.preemptions == 1
    assert m.hit_tokens == pytest.approx(45)
    assert m.books().recompute_s == pytest.approx(5 * 1e-4)


def test_freeze_stops_every_sequence_where_it_is_and_keeps_its_cache():
    m = ReplicaModel(Cost())
    m.submit("a", 10, 100)
    m.freeze(0.5)
    assert m.made("a") == 50
    assert m.next_event_in() is None
    m.advance_to(10.0)
    assert m.made("a") == 50
    m.thaw(10.0)
    assert run(m) == {"a": (pytest.approx(10.5), 100)}


def test_abort_returns_what_was_made_and_frees_room():
    m = ReplicaModel(Cost(kv_tokens=100))
    m.submit("a", 50, 40)
    m.submit("b", 50, 10)
    m.advance_to(0.25)
    assert m.remove("a") == 25
    assert m.batch == 1 and not m.waiting  # b got a's room
    assert m.remove("nope") is None


def test_a_request_that_can_never_fit_is_refused():
    m = ReplicaModel(Cost(kv_tokens=100))
    with pytest.raises(ValueError, match="cannot fit a KV cache of 100"):
        m.submit("a", 90, 20)


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(st.tuples(st.floats(0, 2), st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=12),
    kv=st.sampled_from([0, 130, 400]),
    d=st.sampled_from([0.0, 1e-4]),
    e=st.sampled_from([0.0, 1e-3]),
)
def test_books_balance_under_random_traffic(reqs, kv, d, e):
    c = Cost(kv_tokens=kv, decode_s_per_kv_token=d, prefill_s_per_token=e, decode_step_s_per_seq=1e-3)
    m = ReplicaModel(c)
    arrivals = sorted(reqs)
    done: dict[str, int] = {}
    last = 0.0
    for i, (at, ctx, target) in enumerate(arrivals):
        for rid, n in m.advance_to(at):
            done[rid] = n
        assert m.t >= last
        last = m.t
        m.submit(f"r{i}", ctx, target)
        assert not kv or m.reserved() <= kv + 1e-6
        # the free pool holds exactly the KV not reserved; a hit is never more than a context
        assert not kv or m._pool.free() == pytest.approx(kv - m.reserved(), abs=1e-6)
    while (dt := m.next_event_in()) is not None:
        for rid, n in m.advance_to(m.t + dt):
            done[rid] = n
        assert not kv or m.reserved() <= kv + 1e-6
        # the free pool holds exactly the KV not reserved; a hit is never more than a context
        assert not kv or m._pool.free() == pytest.approx(kv - m.reserved(), abs=1e-6)
    assert done == {f"r{i}": target for i, (_, _, target) in enumerate(arrivals)}
    # the KV books: never fuller than the cache, and no busy time when nothing ran
    assert m.busy_s >= 0 and m.kv_token_s >= 0
    assert not kv or m.kv_token_s <= kv * m.busy_s * (1 + 1e-9) + 1e-9
    b = m.books()
    assert 0 <= b.recompute_s <= m.prefilled_s + 1e-9
    assert 0 <= b.packing_s(c, 10**6) <= c.decode_step_s * b.steps + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.floats(0, 2), st.integers(1, 60), st.integers(1, 60), st.integers(0, 20)), min_size=1, max_size=14
    ),
    kv=st.sampled_from([130, 400]),
)
def test_the_free_pool_balances_through_preemptions_and_aborts(reqs, kv):
    """Random arrivals, some of them aborting an earlier request (running, prefilling, waiting or
    preempted): the pool always holds exactly the KV not reserved, and every request not
    aborted ends with its target."""
    m = ReplicaModel(Cost(kv_tokens=kv, prefill_s_per_token=1e-3, decode_step_s_per_seq=1e-3))
    done: dict[str, int] = {}
    aborted: set[str] = set()
    for i, (at, ctx, target, victim) in enumerate(sorted(reqs)):
        for rid, n in m.advance_to(at):
            done[rid] = n
        if victim < i and f"r{victim}" not in done:
            m.remove(f"r{victim}")
            aborted.add(f"r{victim}")
        m.submit(f"r{i}", ctx, target)
        assert m._pool.free() == pytest.approx(kv - m.reserved(), abs=1e-6)
    while (dt := m.next_event_in()) is not None:
        for rid, n in m.advance_to(m.t + dt):
            done[rid] = n
        assert m._pool.free() == pytest.approx(kv - m.reserved(), abs=1e-6)
    assert {r: n for r, n in done.items() if r not in aborted} == {
        f"r{i}": t for i, (_, _, t, _) in enumerate(sorted(reqs)) if f"r{i}" not in aborted
    }


def test_packing_counts_the_steps_a_fuller_replica_would_not_have_taken():
    """One sequence, context 100 -> 200 over 100 steps of 0.01 s: 15,000 KV token-steps. A
    cache of 1,000 tokens could carry them in 15 steps, so 85 steps' fixed part is packing loss
    on a replica of batch 256; on a replica of batch 1 the 100 steps were the fewest possible."""
    c = Cost(kv_tokens=1000)
    m = ReplicaModel(c)
    m.submit("a", 100, 100)
    run(m)
    b = m.books()
    assert (b.steps, b.seq_steps) == (pytest.approx(100), pytest.approx(100))
    assert b.kv_steps == pytest.approx(100 * 150, rel=0.01)
    assert b.packing_s(c, 256) == pytest.approx(0.85, rel=0.01)
    assert b.packing_s(c, 1) == pytest.approx(0.0, abs=1e-9)
    assert b.recompute_s == 0.0


def test_kv_occupancy_integrates_the_growing_context():
    """One sequence, context 100, 100 tokens at 0.01 s a step: busy 1 s, its context grows
    100 -> 200, so the cache of 1,000 tokens is 15 % full on average while it works."""
    m = ReplicaModel(Cost(kv_tokens=1000))
    m.submit("a", 100, 100)
    run(m)
    assert m.busy_s == pytest.approx(1.0)
    assert m.kv_token_s / (1000 * m.busy_s) == pytest.approx(0.15, rel=0.01)
