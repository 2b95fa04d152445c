"""What the simulator charges the coordinator (issue 46): its process's CPU time, never the wall
clock — a turn blocked without the CPU (a lock, I/O) costs no simulated time, a CPU-busy one does,
whatever else the machine runs — with the wall figure beside it; and decoding what the relays
send is the coordinator's work too."""

from __future__ import annotations

import time

import msgspec
import pytest

from shunter.bench.sim.cluster import run_sim
from shunter.events import LoopIdle, RunStarted
from shunter.policies import SeparatePolicy
from tests.support.configs import SMALL, sim_config

CALLS, EACH_S = 8, 0.04  # the policy's first calls: 0.32 s blocked, or busy on the CPU, in all


class FirstCalls(SeparatePolicy):
    """A user's policy (not shunter's own: it runs on the policy's worker thread, which the turn
    waits on) whose first ``CALLS`` decisions each take ``EACH_S`` — blocked without the CPU
    (``sleep``: the subject of the test, not a wait for something) or busy on it (``spin``:
    measured on its own thread's CPU clock, so it uses that much CPU however loaded the machine)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.calls = how, 0

    def decide(self, event, view):
        # not the run's opening nor a quiet loop's: the coordinator decides those outside a turn
        if self.calls < CALLS and not isinstance(event, RunStarted | LoopIdle):
            self.calls += 1
            if self.how == "sleep":
                time.sleep(EACH_S)
            else:
                t0 = time.thread_time()
                while time.thread_time() - t0 < EACH_S:
                    pass
        return super().decide(event, view)


def test_a_turn_blocked_without_the_cpu_is_not_charged_and_a_busy_one_is():
    cfg = sim_config("separate", 2, 0, eta=1, steps=2)
    policies = {how: FirstCalls(how) for how in ("sleep", "spin")}
    runs = {
        how: run_sim(cfg, SMALL, seed=3, keep=False, policy=p, charge_coordinator=True) for how, p in policies.items()
    }
    assert all(r.ended.reason == "completed" for r in runs.values())
    assert all(p.calls == CALLS for p in policies.values())
    sleep, spin = runs["sleep"], runs["spin"]
    total = CALLS * EACH_S
    # the wall clock saw both; only the CPU-busy calls were charged
    assert sleep.coordinator_wall_s >= total and spin.coordinator_wall_s >= total
    assert sleep.coordinator_cpu_s < total / 2, (sleep.coordinator_cpu_s, sleep.coordinator_wall_s)
    assert spin.coordinator_cpu_s >= total
    assert sum(sleep.handle_s) <= sleep.coordinator_cpu_s < spin.coordinator_cpu_s - total / 2
    # on the simulated clock: messages queued behind the busy turns, not behind the blocked ones
    # (a fact waits in its relay's window at most; the blocked turns' own CPU is a few ms)
    assert max(spin.latency_s) >= EACH_S
    assert max(sleep.latency_s) < cfg.rollout.report_window_s + EACH_S / 2


def test_decoding_the_relays_bytes_is_charged_to_the_coordinator():
    """Each simulated node's relay posts over a wire as a relay actor does: encoded there,
    decoded in the coordinator's process — a piece of the coordinator's work, measured and
    charged like a turn (a fake timer: every piece costs 250 ms)."""
    ticks = iter(range(10**9))

    def timer() -> float:
        return next(ticks) * 0.25

    cfg = sim_config("separate", 2, 0, eta=1, steps=2)
    none = msgspec.structs.replace(cfg, run=msgspec.structs.replace(cfg.run, relays="none"))
    relayed = run_sim(cfg, SMALL, seed=3, keep=False, timer=timer, charge_coordinator=True)
    local = run_sim(none, SMALL, seed=3, keep=False, timer=timer, charge_coordinator=True)
    assert relayed.ended.reason == local.ended.reason == "completed"
    assert relayed.relays == 1 and relayed.decode_cpu_s >= 0.25 and relayed.decode_cpu_s % 0.25 == 0
    assert relayed.coordinator_cpu_s == pytest.approx(sum(relayed.handle_s) + relayed.decode_cpu_s)
    # the coordinator's own process holds the streams (run.relays = "none"): nothing crosses a wire
    assert local.decode_cpu_s == 0 and local.coordinator_cpu_s == pytest.approx(sum(local.handle_s))
