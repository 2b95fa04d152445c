"""``Steering``: what an ``Engine`` user does with a running run — reads its ``events()``,
``submit``s intents, ``wait``s for or ``stop``s its end, and — with ``run.trainer_driver = "user"``
— takes batches (``next_batch``), trains them (``train``) and publishes weights
(``publish_weights``).

``Engine`` makes it with its ``RunLink`` (the live coordinator, the run's end), its codec, the
run's config and id, and ``restart`` (``Engine._restart``: the run started again from its last
checkpoint; False when restarts do not allow it); ``Engine``'s public calls of these names hand
over to it. Invariants: every answer from the coordinator that ends the run sets
``engine.ended``; a coordinator that died, or a run that ended with a failed component, is
restarted from its last checkpoint when restarts allow it before the caller hears of the end;
the user-driven calls refuse (``EngineError``, nothing taken) on a run the engine drives.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from shunter.api_link import RunLink
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.io.errors import EngineError, IntentRefused, NoBatchError, RunEndedError, UserCodeError, secs
from shunter.events import (
    Batch,
    Codec,
    CommandFailed,
    Event,
    Intent,
    IntentRejected,
    RelayReport,
    RunEnded,
    StepEnd,
    TrainBatch,
    Verdict,
    WeightsReady,
)


class Steering:
    def __init__(
        self,
        link: RunLink,
        codec: Codec,
        cfg: EngineConfig,
        run_id: str,
        restart: Callable[[str, int], Awaitable[bool]],
    ) -> None:
        self.link, self.codec, self.cfg, self.run_id = link, codec, cfg, run_id
        self.restart = restart
        """The run started again from its last checkpoint, the reason and the step it was lost at
        given; False if not."""

    # -- observing and steering ---------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        """``Engine.events`` (documented there)."""
        from ray.exceptions import RayActorError

        cursor = 0
        while True:
            try:
                items, cursor, missed = await self.link.live().fetch.remote(cursor, 4096, 1.0)
            except RayActorError as e:
                restarted: list[bool] = []
                async for note in self._restarting(f"coordinator died: {e}", -1, restarted):
                    yield note
                if restarted[0]:
                    cursor = 0
                    continue
                raise
            if missed:
                warnings.warn(
                    f"Engine.events(): fell behind, {missed} messages were dropped from the feed "
                    "(the event log on disk has all of them)",
                    stacklevel=2,
                )
            restarted = False
            for b in items:
                msg = self.codec.decode(b)
                if isinstance(msg, RunEnded) and msg.run_id in ("", self.run_id):
                    if msg.failed_component:  # restarted from its last checkpoint, if restarts allow
                        again: list[bool] = []
                        async for note in self._restarting(msg.error, msg.steps, again):
                            yield note
                        if again[0]:
                            restarted = True
                            break
                    self.link.ended = msg
                    yield msg
                    return
                if msg.__class__ is RelayReport:  # the facts a relay folded, one by one
                    for ev in msg.events:  # type: ignore[attr-defined]
                        yield ev
                elif isinstance(msg, Event) and not self.link.told(msg):
                    yield msg
            if restarted:
                cursor = 0

    async def _recover(self, ended: RunEnded) -> bool:
        """True if the run that ended this way was restarted from its last checkpoint."""
        return bool(ended.failed_component) and await self.restart(ended.error, ended.steps)

    async def _restarting(self, reason: str, step: int, out: list[bool]) -> AsyncIterator[Event]:
        """Restart the run (``reason``; lost at ``step``, -1 unknown), yielding what the engine
        tells meanwhile (``trainer.pending`` while it waits for room, ``trainer.waited``); appends
        to ``out`` whether it restarted. A failed restart raises here (``RestartError``)."""
        task = asyncio.ensure_future(self.restart(reason, step))
        try:
            while not task.done():
                told = asyncio.ensure_future(self.link.next_notice())
                await asyncio.wait({task, told}, return_when=asyncio.FIRST_COMPLETED)
                told.cancel()
                for note in self.link.take_notices():
                    yield note
            for note in self.link.take_notices():
                yield note
            out.append(task.result())
        finally:
            if not task.done():  # the reader stopped (Ctrl-C): the restart stops with it
                task.cancel()

    async def submit(self, intent: Intent) -> Verdict:
        """``Engine.submit`` (documented there)."""
        if not isinstance(intent, Intent):
            raise TypeError(f"submit() takes an intent (SwitchToRollout, Stop, ...), got {type(intent).__name__}")
        if isinstance(intent, TrainBatch):
            self.link.live()
            self._user_driven("submit(TrainBatch(...))")
        if self.link.ended is not None:
            raise RunEndedError(self.link.ended)
        out = self.link.seen(self.codec.decode(await self.link.live().submit.remote(self.codec.encode(intent))))
        match out:
            case IntentRejected():
                return Verdict(intent=intent, rejected=out)
            case Intent():
                return Verdict(intent=out)
            case RunEnded():
                raise RunEndedError(out)
        raise ValueError(f"the coordinator rejected {intent!r}: {getattr(out, 'error', out)}")

    async def wait(self) -> RunEnded:
        """``Engine.wait`` (documented there)."""
        from ray.exceptions import RayActorError

        while True:
            try:
                ended = self.codec.decode(await self.link.live().wait_ended.remote())
            except RayActorError as e:
                if await self.restart(f"coordinator died: {e}", -1):
                    continue
                raise
            if not await self._recover(ended):
                self.link.ended = ended
                return ended

    async def stop(self, reason: str = "stopped") -> RunEnded:
        """``Engine.stop`` (documented there)."""
        if self.link.ended is not None:
            return self.link.ended
        self.link.ended = self.codec.decode(await self.link.live().stop.remote(reason))
        return self.link.ended

    # -- user-driven training (run.trainer_driver = "user") ------------------------------
    def _user_driven(self, call: str) -> None:
        """``EngineError`` when the engine drives the trainer: its policy takes every ready batch,
        so a batch taken (or trained) by the user as well would be lost to the run's books."""
        if self.cfg.run.trainer_driver != "user":
            raise EngineError(
                f"{call} is for a run whose training loop is yours: this run has "
                f'run.trainer_driver = "{self.cfg.run.trainer_driver}", so the engine takes and trains every '
                'batch itself; set run.trainer_driver = "user" to take batches with next_batch() and train them '
                "with train() (nothing was taken from the run)"
            )

    async def next_batch(self, timeout_s: float = 600.0) -> Batch:
        """``Engine.next_batch`` (documented there)."""
        live = self.link.live()
        self._user_driven("next_batch()")
        data, why = await live.next_batch.remote(timeout_s)
        if data is not None:
            return msgspec.msgpack.decode(data, type=Batch)
        if self.link.ended is None and why.startswith("the run ended"):
            self.link.ended = self.codec.decode(await self.link.live().wait_ended.remote())
        if self.link.ended is not None:
            raise RunEndedError(self.link.ended)
        raise NoBatchError(f"no mini-batch within {secs(timeout_s)}s: {why}")

    async def train(self, batch: Batch, *, loss_fn: str = "") -> StepEnd:
        """``Engine.train`` (documented there)."""
        if not isinstance(batch, Batch):
            raise TypeError(f"train() takes the Batch next_batch() returned, got {type(batch).__name__}")
        loss_fn = loss_spec(loss_fn)
        self.link.live()
        self._user_driven("train()")
        if self.link.ended is not None:
            raise RunEndedError(self.link.ended)
        intent = TrainBatch(batch_id=batch.batch_id, samples=batch.samples, loss_fn=loss_fn)
        out = self.link.seen(self.codec.decode(await self.link.live().train.remote(self.codec.encode(intent))))
        match out:
            case StepEnd():
                return out
            case CommandFailed() if out.user_code:
                raise UserCodeError.from_report(out.user_code, out.error)
            case IntentRejected():
                raise IntentRefused(out)
            case RunEnded():
                raise RunEndedError(out)
        raise EngineError(f"train step failed: {getattr(out, 'error', out)}")

    async def publish_weights(self) -> WeightsReady | None:
        """``Engine.publish_weights`` (documented there)."""
        out = self.link.seen(self.codec.decode(await self.link.live().publish.remote()))
        match out:
            case WeightsReady():
                return out
            case IntentRejected() if out.reason == "nothing_new":
                return None
            case IntentRejected():
                raise IntentRefused(out)
            case RunEnded():
                raise RunEndedError(out)
        raise EngineError(f"publishing weights failed: {getattr(out, 'error', out)}")

    async def counters(self) -> dict[str, int]:
        """``Engine.counters``."""
        return await self.link.live().counters.remote()


def loss_spec(loss_fn: object) -> str:
    """``loss_fn`` as the ``"module:function"`` the trainer actor imports: a string as given, or
    a function defined at module level in an importable module (not ``__main__``)."""
    if isinstance(loss_fn, str):
        return loss_fn
    module, name = getattr(loss_fn, "__module__", None), getattr(loss_fn, "__qualname__", "")
    if callable(loss_fn) and module and module != "__main__" and "<" not in name:
        return f"{module}:{name}"
    raise TypeError(
        f"loss_fn takes a 'module:function' string (the trainer runs in its own process and imports "
        f"it); got {loss_fn!r}"
        + (
            " — a function defined in __main__ cannot be imported there: put it in a module next to your script"
            if module == "__main__"
            else ""
        )
    )
