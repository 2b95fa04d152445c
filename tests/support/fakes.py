"""Test fakes — the only stand-ins in the suite. Each replaces exactly one boundary:

- ``FakeBackend`` replaces vLLM (``shunter.engine.replica.backend.Backend``): it "generates" a
  deterministic answer token by token with a delay per token, honours ``abort`` (returning
  the prefix), and ``load_weights`` changes what it generates next;
- ``CharTokenizer`` replaces the HF tokenizer (one id per character, 0 = eos);
- ``FakeTrainerCore`` replaces the torch ``Trainer``: it counts steps and versions, checks
  the samples it is given, reports the real trainer's batch metrics (``engine.trainer.batch_stats``),
  and runs a user loss by its spec through the real loss protocol (``shunter.engine.trainer.loss``) on
  small stand-in tensors.

Everything else under test — coordinator, policies, buffer, dispatcher, rollout core,
trainer host, executor contract — is the real code. ``local_run`` runs on the event loop's
own clock, so under ``virtual()`` (a ``looptime`` loop) a test never depends on the wall clock.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shunter.engine.replica.backend import EngineDead, GenParams, GenResult
from shunter.engine.trainer.batch_stats import batch_metrics
from shunter.events import Sample

T = TypeVar("T")


def loop_clock() -> float:
    """The running loop's time (virtual under ``virtual()``); 0 outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return 0.0


def virtual(make: Callable[[], Awaitable[T]], timeout: float = 3600.0) -> T:
    """Run a coroutine on a fresh ``looptime`` loop: sleeps and timeouts are virtual (a test
    takes the same course however busy the machine is); ``timeout`` is virtual seconds."""
    import looptime

    loop = looptime.new_event_loop(start=0.0, noop_cycles=1)
    try:

        async def bounded() -> T:
            async with asyncio.timeout(timeout):
                return await make()

        return loop.run_until_complete(bounded())
    finally:  # like asyncio.run: what is still running is cancelled, then the loop closes
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()

        async def drain() -> None:
            await asyncio.gather(*pending, return_exceptions=True)

        loop.run_until_complete(drain())
        loop.close()


def round_trip(msg: Any) -> None:
    """A sink: every message survives the codec (Literal values, types) — the unit tier's
    stand-in for the Ray boundary, where a bad value would be rejected."""
    from shunter.events import Codec

    codec = _CODEC.setdefault("c", Codec())
    back = codec.decode(codec.encode(msg))
    assert back == msg, (back, msg)


_CODEC: dict[str, Any] = {}

ALPHABET = "\0" + "0123456789abcdefghijklmnopqrstuvwxyz>+=,"


class CharTokenizer:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [ALPHABET.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(ALPHABET[i] for i in ids if i)

    def render(self, messages) -> list[int]:
        """The tiny model's chat template: the contents, then the sort task's separator."""
        return self.encode("".join(m.content for m in messages) + ">")


class FakeBackend:
    """Answers the sort task correctly (sorted prompt digits, then eos), one token per
    ``token_s``; a resumed request continues after the prefix it is given. ``die()``: its
    engine is gone, as vLLM's after a ``kill -9`` of its EngineCore (every call, those in
    flight included, raises ``EngineDead``)."""

    def __init__(
        self, token_s: float = 0.001, answer_len: int | None = None, respond: Callable[[str], str] | None = None
    ) -> None:
        self.token_s = token_s
        self.answer_len = answer_len
        self.respond = respond
        """``respond(context text) -> continuation`` instead of the sort answer (then eos);
        ``params.stop`` strings end it where they occur, kept in the output."""
        self.weights = b"v0"
        self.loads = 0
        self.sleeping = False
        self._aborted: set[str] = set()
        self.requests = 0
        self.dead = False
        self.wake_s = 0.0
        """How long ``wake_up`` takes (replicas of one fleet wake at different times)."""

    def die(self) -> None:
        self.dead = True

    def _alive(self) -> None:
        if self.dead:
            raise EngineDead("the fake engine core is gone")

    async def start(self) -> None:
        pass

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: GenParams) -> GenResult:
        self._alive()
        assert not self.sleeping, "generate on a sleeping engine"
        self.requests += 1
        tok = CharTokenizer()
        text = tok.decode(prompt_token_ids)
        if self.respond is not None:
            rest = [tok.encode(c)[0] for c in self.respond(text)] + [0]
        else:
            prompt, _, done = text.partition(">")
            target = "".join(sorted(prompt)) if self.answer_len is None else "1" * self.answer_len
            rest = [tok.encode(c)[0] for c in target[len(done) :]] + [0]
        out: list[int] = []
        for t in rest[: params.max_tokens]:
            if request_id in self._aborted:
                return GenResult(out, [-0.5] * len(out), "abort")
            await asyncio.sleep(self.token_s)
            self._alive()
            out.append(t)
            if params.stop and any(tok.decode(out).endswith(x) for x in params.stop):
                return GenResult(out, [math.log(0.5)] * len(out), "stop")
        finish = "stop" if out and out[-1] == 0 else "length"
        return GenResult(out, [math.log(0.5)] * len(out), finish)

    async def abort(self, request_ids: list[str]) -> None:
        self._alive()
        self._aborted.update(request_ids)

    async def load_weights(self, blob: bytes) -> float:
        self._alive()
        self.weights = blob
        self.loads += 1
        return 0.0

    async def sleep(self, level: int = 1) -> None:
        self.sleeping = True

    async def wake_up(self) -> None:
        if self.wake_s:
            await asyncio.sleep(self.wake_s)
        self.sleeping = False

    async def shutdown(self) -> None:
        pass


class FakeTrainerCore:
    def __init__(self, step_s: float = 0.0) -> None:
        self.step = 0
        self.version = 0
        self.step_s = step_s
        self.seen: list[list[Sample]] = []
        self.offloaded: set[str] = set()
        self.restored_batches: list[list[int]] = []  # prompt ids per batch trained before the checkpoint resumed from

    async def train_step(self, samples: list[Sample], loss_fn: str = "") -> dict[str, float]:
        for s in samples:
            s.check()
        if loss_fn:
            _run_user_loss(samples, loss_fn, self.version)
        if self.step_s:
            await asyncio.sleep(self.step_s)
        self.step += 1
        self.seen.append(samples)
        return batch_metrics(samples, self.version)  # the real trainer's batch/*, env/*, reward/* figures

    def publish(self) -> bytes:
        self.version += 1
        return f"v{self.version}".encode()

    def offload(self, parts: list[str]) -> int:
        self.offloaded |= set(parts)
        return 0

    def onload(self, parts: list[str]) -> int:
        self.offloaded -= set(parts)
        return 0

    def save(self, path: str) -> int:
        """The trainer's checkpoint part: step, version and the prompts of every batch trained."""
        import json
        from pathlib import Path

        data = json.dumps(
            {
                "step": self.step,
                "version": self.version,
                "trained": self.restored_batches + [[s.prompt_id for s in b] for b in self.seen],
            }
        ).encode()
        (Path(path) / "trainer.json").write_bytes(data)
        return len(data)

    def load(self, path: str) -> None:
        import json
        from pathlib import Path

        st = json.loads((Path(path) / "trainer.json").read_text())
        self.step, self.version = st["step"], st["version"]
        self.restored_batches = st["trained"]


def one_token_sample(sample_id: str = "0.0", group_id: int = 0, version: int = 0) -> Sample:
    """A finished sample of one prompt token and one response token (what a trainer core needs)."""
    return Sample(
        sample_id=sample_id,
        group_id=group_id,
        prompt_id=group_id,
        prompt_token_ids=[1],
        token_ids=[2],
        logprobs=[-1.0],
        versions=[version],
        max_tokens=4,
    )


def _run_user_loss(samples: list[Sample], spec: str, version: int) -> None:
    """The user's loss on stand-in tensors, through the real protocol (UserCodeError if it fails)."""
    import torch

    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.loss import LossInput, call_loss, load_loss

    width = max(len(s.token_ids) for s in samples)
    mask = torch.tensor([[1.0] * len(s.token_ids) + [0.0] * (width - len(s.token_ids)) for s in samples])
    old = torch.tensor([s.logprobs + [0.0] * (width - len(s.logprobs)) for s in samples])
    logp = (old + 0.0).requires_grad_(True)
    inp = LossInput(
        logp=logp,
        old_logp=old,
        advantages=torch.zeros_like(mask),
        mask=mask,
        rewards=torch.tensor([s.reward for s in samples]),
        group_ids=torch.tensor([s.group_id for s in samples]),
        versions=torch.zeros_like(mask).long(),
        ref_logp=None,
        trainer_version=version,
        token_share=1.0,
        cfg=TrainerConfig(),
    )
    call_loss(load_loss(spec), spec, inp)


def local_run(
    cfg,
    *,
    token_s: float = 0.0005,
    step_s: float = 0.0,
    policy=None,
    run_id: str = "test",
    answer_len: int | None = None,
    reward=None,
    checkpoints=None,
    resume=None,
    check_codec: bool = True,
    prompts=None,
    respond=None,
    rewards=None,
    relays: int = 0,
):
    """A real ``Coordinator`` over in-process replicas (``RolloutCore`` + ``FakeBackend``)
    and a ``TrainerHost`` around ``FakeTrainerCore``, on the loop's clock (run it under
    ``virtual()``). Returns (coordinator, backends, trainer core).

    ``checkpoints``: a folder for the run's checkpoints; ``resume``: a checkpoint folder to
    continue from (trainer, replicas' weight version and coordinator restored from it);
    ``check_codec``: every message goes through the codec (``round_trip``); ``prompts``:
    (training stream, validation prompts) instead of the task's (a dataset's, say); ``respond``:
    what the fake engines answer (``FakeBackend``); ``rewards``: a function of the replica id giving
    the ``Rewards`` its samples are scored with (as a run's reward workers would); ``cfg.task.environment``
    makes the runs multi-turn; ``relays``: replicas per relay (``engine.coordinator.relay``, with the config's
    ``rollout.report_window_s``: facts folded into reports, the trainer handing weights to the
    relays); 0: none, every fact posted as it comes."""
    from shunter.engine.coordinator.assemble import build_coordinator, replica_kinds, resume_version
    from shunter.engine.coordinator.local_executor import LocalExecutor
    from shunter.engine.data.environments import load_environment
    from shunter.engine.replica.core import RolloutCore
    from shunter.engine.tasks import load_task
    from shunter.engine.trainer.host import TrainerHost
    from shunter.events import RankAssigned, ReplicaRestart, ReplicaUp, Stamper
    from shunter.events.vocab import ROLLOUT, STANDALONE, TRAINER

    task = load_task(cfg.task.name)
    version = resume_version(resume)
    kinds = replica_kinds(cfg)
    backends, cores, ups = {}, {}, []

    def make(rid: str, kind: str, rank: int) -> ReplicaUp:
        mode = ROLLOUT if kind == STANDALONE else TRAINER
        backends[rid] = FakeBackend(token_s=token_s, answer_len=answer_len, respond=respond)
        if mode == TRAINER:
            backends[rid].sleeping = True
        cores[rid] = RolloutCore(
            rid,
            backends[rid],
            CharTokenizer(),
            reward or task.reward,
            Stamper(run_id, rid, loop_clock),
            mode=mode,
            reward_name=getattr(reward, "__name__", "task.reward"),
            version=version,
            environment=load_environment(cfg.task.environment) if cfg.task.environment else None,
            env_name=cfg.task.environment,
            max_turns=cfg.task.max_turns,
            env_timeout_s=cfg.task.env_timeout_s,
            rewards=rewards(rid) if rewards is not None else None,
        )
        return ReplicaUp(
            replica_id=rid, replica_kind=kind, rank=rank, mode=mode, version=version, wall_time=loop_clock()
        )

    for rank, kind in enumerate(kinds):
        ups.append(make(f"{kind}-{rank}", kind, rank))
    trainer = FakeTrainerCore(step_s=step_s)
    if resume is not None:
        trainer.load(resume)
    executor = LocalExecutor(
        run_id,
        TrainerHost(trainer, Stamper(run_id, "trainer", loop_clock), threaded=False),
        cores,
        max_tokens=cfg.rollout.max_tokens,
        clock=loop_clock,
    )
    if relays:
        from shunter.engine.coordinator.relay import route_through_relays

        executor.trainer.deliver = executor.deliver
        r = cfg.rollout
        route_through_relays(
            executor,
            [f"{kind}-{rank}" for rank, kind in enumerate(kinds)],
            relays,
            run_id,
            loop_clock,
            window_s=r.report_window_s,
            max_events=r.report_max_events,
        )
    coord = build_coordinator(
        cfg,
        executor,
        run_id=run_id,
        prompts=prompts,
        policy=policy,
        sinks=[round_trip] if check_codec else [],
        clock=loop_clock,
        checkpoints=checkpoints,
        resume=resume,
    )
    made = itertools.count(len(kinds))

    def replace(m) -> None:  # what Engine does on ReplicaRestart: a new replica after the delay
        if isinstance(m, ReplicaRestart):
            asyncio.get_running_loop().call_later(m.delay_s, start, m)

    def start(m: ReplicaRestart) -> None:
        if coord.ended is not None:
            return
        rid = f"{m.replica_kind}-{next(made)}"
        up = make(rid, m.replica_kind, m.rank)
        stamp = {"run_id": run_id, "source": "engine", "wall_time": loop_clock()}
        coord.post(RankAssigned(replica_id=rid, replica_kind=m.replica_kind, rank=m.rank, actor_name=rid, **stamp))
        coord.post(up)

    coord.sinks.append(replace)
    coord.post_many(ups)
    return coord, backends, trainer


# -- fault schedules (tests/unit/engine/coordinator/test_fault_schedules.py, tests/support/fault_soak.py) ----
ACTIONS = ("kill_replica", "trainer_dies", "coordinator_crashes", "stop")


class Crash(BaseException):
    """The coordinator's process dies here, with whatever it held in memory (a BaseException,
    like a kill: the loop's fault barrier contains errors, not the death of its process)."""


async def run_with_faults(
    c, schedule: list[tuple[int, str]], root, token_s: float = 0.001, fired=None, relays: int = 0
):
    """Run to the end, resuming from the last checkpoint after each lost trainer or
    coordinator. Returns (prompt ids per counted step, every StepEnd, attempts, last
    coordinator); the faults actually injected are appended to ``fired``; ``relays``: replicas
    per relay (``local_run``)."""
    import asyncio
    import shutil

    from shunter.engine.io.checkpoint import CheckpointStore
    from shunter.events import ComponentFailed, RelayReport, SampleEnd, Stamper, StepEnd, Stop

    fired = [] if fired is None else fired
    pending = sorted(schedule)
    steps_seen: list[StepEnd] = []
    resume, attempts = None, 0
    while True:
        attempts += 1
        assert attempts <= len(schedule) + 1, "more attempts than faults"
        coord, _, trainer = local_run(c, token_s=token_s, checkpoints=root, resume=resume, relays=relays)
        killed = set()

        armed: list[bool] = []

        def chaos(m, coord=coord, killed=killed, armed=armed):
            ended = isinstance(m, SampleEnd) or (
                isinstance(m, RelayReport) and any(isinstance(e, SampleEnd) for e in m.events)
            )
            if armed and ended:  # a stop lands at any moment, not only between steps
                armed.clear()
                coord.post(Stamper(coord.state.run_id, "user")(Stop(reason="stopped")))
            if not isinstance(m, StepEnd):
                return
            steps_seen.append(m)
            while pending and pending[0][0] <= m.step:
                _, action = pending.pop(0)
                live = [r for r in coord.executor.replicas if r not in killed]
                if action == "kill_replica" and len(live) > 1:
                    killed.add(live[0])
                    fired.append(action)
                    coord.executor.kill(live[0], reason="chaos")
                elif action == "trainer_dies":
                    fired.append(action)
                    coord.post(coord.stamp(ComponentFailed(component="trainer", error="chaos")))
                elif action == "coordinator_crashes":
                    fired.append(action)
                    raise Crash
                elif action == "stop":  # an operator's SIGTERM / Ctrl-C: Engine.stop(), then --resume
                    fired.append(action)
                    armed.append(True)

        coord.sinks.append(chaos)
        try:
            async with asyncio.timeout(30):
                ended = await coord.run()
        except Crash:
            ended = None
        if ended is not None and not ended.failed_component and ended.reason != "stopped":
            assert ended.reason == "completed", ended
            batches = trainer.restored_batches + [[s.prompt_id for s in b] for b in trainer.seen]
            return batches, steps_seen, attempts, coord
        found = CheckpointStore(root).latest()
        resume = found[0] if found else None
        if resume is None:  # lost before the first checkpoint: start over
            shutil.rmtree(root, ignore_errors=True)


def virtual_time(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Decorator: an ``async def`` test runs on a ``looptime`` loop (see ``virtual``)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return virtual(lambda: fn(*args, **kwargs))

    return wrapper


async def run_to_end(coord, timeout: float = 3600.0):
    """Run a coordinator to its ``RunEnded`` (virtual seconds), recording what it handled;
    closes its executor. Returns (ended, messages)."""
    seen: list = []
    coord.sinks.append(seen.append)
    try:
        async with asyncio.timeout(timeout):
            ended = await coord.run()
    finally:
        await coord.executor.close()
    return ended, seen


class CoordinatorCrash(BaseException):  # a death, not an error: the loop cannot contain it
    pass


async def run_until(coord, pred, timeout=20, crash=False):
    """Run the coordinator until ``pred`` holds for a message; with ``crash`` the loop dies
    right there (an exception out of a sink), with whatever it held in memory."""
    seen = []
    hit = asyncio.Event()

    def watch(m):
        seen.append(m)
        if pred(m) and not hit.is_set():
            hit.set()
            if crash:
                raise CoordinatorCrash

    coord.sinks.append(watch)
    task = asyncio.create_task(coord.run())
    async with asyncio.timeout(timeout):
        await hit.wait()
    return seen, task
