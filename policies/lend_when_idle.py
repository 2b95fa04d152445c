"""``lend_when_idle``: lend hybrid replicas to rollout while the trainer waits (verl #7373).

Behaviour: like ``separate``, plus — when the trainer is idle with no mini-batch ready,
the hybrid replicas are switched to rollout if the expected time saved beats the
measured cost of switching there and back; as soon as a mini-batch is ready they are
reclaimed, and the trainer trains only once every lent replica is back — a hybrid lent by
someone else (the user, ``Engine.submit(SwitchToRollout(...))``) included: it is taken back
when a mini-batch is ready, as the policy's own (else the run would wait for ever). When a lent
replica comes up it asks for a ``Rebalance``: busy standalone replicas hand part of their
in-flight groups over (partial rollout makes the move cheap: only the prefix is
re-prefilled), so lending helps even when every new group is already dispatched. The
coordinator counts the new groups the gate admits as load to come, so partials move only
where new groups will not fill the lent replica: on ``lend_2to1`` (its gate admits little while
the trainer waits) the move is what makes lending pay; on ``long_tail_bimodal`` 9:7 (its gate
stays open) moving against the bare mean shifted ~1,800 samples onto every lend, the return
cut them again, and lending after the first batch lost to not lending (docs/benchmarks.md).

The estimate (all inputs come from the view):

    need   = ppo_mini_batch_size - ready_samples            samples still missing
    r_s    = sum of measured samples/s of standalone replicas in rollout
    r_h    = per-replica rate (mean of measured replicas) * number of hybrids
    wait   = need / r_s                                     trainer idle time without lending
    lend   = c_to + max(0, need - r_s * c_to) / (r_s + r_h) + c_back
    lend iff wait - lend > min_gain_s

``c_to`` / ``c_back`` are the smoothed measured switch times (``switch_cost_prior_s``
until a switch has been measured).

On a long tail that formula sees too little: the samples the trainer waits for are the
stragglers of its next batch, not a count of missing ones (many later groups are complete
already), so ``need`` is small while the wait is long. The policy therefore also predicts the
wait from the waits it measured (``predict_wait``, on by default): the time from the trainer
falling idle with no batch ready to the next ``BatchReady``, smoothed over steps
(``wait_ewma_s``), and lends when that wait is over ``wait_factor`` times the switch cost
``c_to + c_back`` and ``predicted wait - c_to - c_back > min_gain_s`` (a wait not far above
the switch cost is mostly stragglers that more replicas do not shorten).

Nothing is lent while the staleness gate is closed (extra replicas would have no new group to
start) or, by the estimate, before the first optimizer step (rates measured over less than a
mini-batch mislead).

The first batch is the one wait that needs no estimate: until an attempt's first mini-batch is
ready the trainer has nothing to train, so its GPUs are free for certain. ``first_batch = true``
lends every hybrid from the attempt's start (``RunStarted`` / ``RunResumed``) until that batch is
ready: the lent replicas take part of the in-flight groups (``Rebalance``) and start groups of
their own, so about twice the groups are in flight while the trainer waits — the first batch, the
first groups to complete, is ready sooner, and the fleet generates ahead for the steps after it.
On a long tail the first batch is the largest part of the gap to the bound (``bench/analysis/gap.py``):
``long_tail`` 705 -> 596 s, 6 % less time in all (docs/benchmarks.md). ``after_first = false``
lends for the first batch only.

What the lent fleet should start is the engine's gate, not this policy's: with the full gate
(``rollout.admit_staleness`` = ``max_staleness`` = 24 on ``long_tail``) the 16 replicas start
~20 mini-batches of groups before the first step, refilling every slot a finished sample
frees, so every group shares a full batch and the 7 standalone replicas inherit a long queue
when the lent ones go back. Admitting 14 versions ahead (``admit_staleness = 13``) leaves
slots empty as samples finish: the first batch is ready at 540 s instead of 596 and the steps
after it wait less — 95.7 % of the best split's bound instead of 93.4 % (docs/benchmarks.md).
"""

from __future__ import annotations

import math

import msgspec

from shunter.events import (
    BatchReady,
    EngineView,
    Event,
    Intent,
    ModeChanged,
    Rebalance,
    RunResumed,
    RunStarted,
    StepEnd,
    SwitchToRollout,
    SwitchToTrainer,
    WeightsReady,
)
from shunter.events.vocab import DOWN, HYBRID, ROLLOUT, STANDALONE, SWITCHING, TRAINER
from shunter.policies.base import (
    Policy,
    ValidationState,
    live_ids,
    load_on_ready,
    option_flag,
    option_number,
    option_sleep_level,
    train_or_publish,
    validate_when_due,
)


class LendState(msgspec.Struct):
    lent: list[str] = []
    trained: bool = False
    """This attempt trained a mini-batch (the first batch is behind it)."""
    lends: int = 0
    skipped: int = 0
    last_estimate_gain_s: float = 0.0
    idle_since: float = -1.0
    """When the trainer last fell idle with no batch ready (-1: it is not waiting)."""
    wait_ewma_s: float = -1.0
    """Smoothed measured wait from ``idle_since`` to the next ``BatchReady`` (-1: none yet)."""
    validation: ValidationState = msgspec.field(default_factory=ValidationState)


class LendWhenIdlePolicy(Policy):
    name = "lend_when_idle"
    State = LendState

    def __init__(
        self,
        *,
        switch_cost_prior_s: float = 1.0,
        min_gain_s: float = 0.0,
        sleep_level: int = 1,
        rebalance: bool = True,
        predict_wait: bool = True,
        wait_factor: float = 4.0,
        first_batch: bool = False,
        after_first: bool = True,
    ) -> None:
        super().__init__()
        self.first_batch = option_flag("first_batch", first_batch)
        self.after_first = option_flag("after_first", after_first)
        self.wait_factor = option_number("wait_factor", wait_factor, above=0)
        self.rebalance = option_flag("rebalance", rebalance)
        self.predict_wait = option_flag("predict_wait", predict_wait)
        self.switch_cost_prior_s = option_number("switch_cost_prior_s", switch_cost_prior_s, at_least=0)
        self.min_gain_s = option_number("min_gain_s", min_gain_s)
        self.sleep_level = option_sleep_level(sleep_level)

    @classmethod
    def check_setup(cls, *, standalone: int, hybrid: int) -> None:
        if standalone < 1:
            raise ValueError(f"needs at least one standalone replica (rollout.standalone_replicas = {standalone})")
        if hybrid < 1:
            raise ValueError(f"needs at least one hybrid replica to lend (rollout.hybrid_replicas = {hybrid})")

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        if isinstance(event, RunResumed):
            self.state.lent = []  # a resumed attempt starts with every hybrid on the trainer
        if isinstance(event, RunStarted | RunResumed):
            self.state.trained = False
        elif isinstance(event, StepEnd):
            self.state.trained = True
        self._measure_wait(event, view)
        cmds: list[Intent] = load_on_ready(event, view)
        cmds += validate_when_due(event, view, self.state.validation)
        lent = [i for i in self.state.lent if (r := view.replica(i)) is not None and r.mode != DOWN]
        # a hybrid someone else lent (the user, through Engine.submit) holds the trainer's GPUs as
        # well: this policy trains only once every hybrid is back, so it takes those back too
        others = [
            r.replica_id for r in view.replicas if r.kind == HYBRID and r.mode == ROLLOUT and r.replica_id not in lent
        ]
        if (lent or others) and (view.buffer.ready_batches > 0 or isinstance(event, BatchReady) or view.done):
            back = [i for i in lent if _mode(view, i) == ROLLOUT] + others  # still switching: next event
            lent = [i for i in lent if i not in back]
            if back:
                cmds.append(SwitchToTrainer(replica_ids=back, sleep_level=self.sleep_level))
        self.state.lent = lent
        if (
            self.rebalance
            and isinstance(event, ModeChanged)
            and event.mode == ROLLOUT
            and event.replica_id in lent
            and not view.buffer.ready_batches
        ):
            cmds.append(Rebalance())  # let the lent replica take over part of the queued work
        if lent or any(r.kind == HYBRID and r.mode in (ROLLOUT, SWITCHING) for r in view.replicas):
            return cmds  # never train while replicas on trainer resources are lent or switching
        cmds += train_or_publish(event, view)
        if not cmds and self._should_lend(view):
            ids = [i for i in live_ids(view, HYBRID) if _mode(view, i) == TRAINER]
            if ids:
                self.state.lent = ids
                self.state.lends += 1
                cmds.append(SwitchToRollout(replica_ids=ids))
        return cmds

    def _measure_wait(self, event: Event, view: EngineView) -> None:
        """Time how long the trainer waits for a batch: from falling idle with none ready to
        the ``BatchReady`` that ends it."""
        st = self.state
        waiting = view.trainer.state == "idle" and view.buffer.ready_batches == 0 and not view.done
        if st.idle_since < 0 and waiting and isinstance(event, StepEnd | WeightsReady | RunStarted | RunResumed):
            st.idle_since = event.wall_time
        elif st.idle_since >= 0 and (isinstance(event, BatchReady) or view.buffer.ready_batches > 0):
            w = event.wall_time - st.idle_since
            st.wait_ewma_s = w if st.wait_ewma_s < 0 else 0.7 * st.wait_ewma_s + 0.3 * w
            st.idle_since = -1.0

    def estimate_gain_s(self, view: EngineView) -> float | None:
        """Expected trainer time saved by lending now (None: not estimable)."""
        need = view.ppo_mini_batch_size - view.buffer.ready_samples
        if view.buffer.ready_batches == 0:  # ready groups wait for a due one still generating (on_stale=wait)
            need = max(need, view.n_samples_per_prompt)
        standalone = [r for r in view.replicas if r.kind == STANDALONE and r.mode == ROLLOUT]
        r_s = sum(r.samples_per_s for r in standalone)
        measured = [r.samples_per_s for r in view.replicas if r.samples_per_s > 0]
        hybrids = [r for r in view.replicas if r.kind == HYBRID and r.mode == TRAINER]
        if need > 0 and hybrids and not standalone:
            return math.inf  # no standalone replica serves (all died): lending is the only way forward
        if need <= 0 or r_s <= 0 or not measured or not hybrids or view.trainer.step < 1:
            return None  # rates mean little before a whole mini-batch has been generated and trained
        r_h = sum(measured) / len(measured) * len(hybrids)
        c_to = view.switch_cost_s.get(ROLLOUT, self.switch_cost_prior_s)
        c_back = view.switch_cost_s.get(TRAINER, self.switch_cost_prior_s)
        wait = need / r_s
        lend = c_to + max(0.0, need - r_s * c_to) / (r_s + r_h) + c_back
        return wait - lend

    def _should_lend(self, view: EngineView) -> bool:
        if view.done or view.trainer_driver != "engine" or view.trainer.state != "idle":
            return False
        if view.buffer.ready_batches > 0 or not (view.buffer.gate_open or view.buffer.pending_resumes):
            return False
        if not self.state.trained and self.first_batch:
            return True  # the trainer has nothing to train before its first batch
        if not self.after_first:
            return False
        gain = self.estimate_gain_s(view)
        if self.predict_wait and self.state.wait_ewma_s > 0 and view.trainer.step >= 1:
            c = view.switch_cost_s.get(ROLLOUT, self.switch_cost_prior_s) + view.switch_cost_s.get(
                TRAINER, self.switch_cost_prior_s
            )
            if self.state.wait_ewma_s > self.wait_factor * c:  # only waits well above the switch cost
                predicted = self.state.wait_ewma_s - c
                gain = predicted if gain is None else max(gain, predicted)
        if gain is None:
            return False
        self.state.last_estimate_gain_s = gain
        if gain > self.min_gain_s:
            return True
        self.state.skipped += 1
        return False


def _mode(view: EngineView, replica_id: str) -> str:
    r = view.replica(replica_id)
    return r.mode if r is not None else DOWN
