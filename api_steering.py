"""What an ``Engine`` user does with a running run: reads its ``events()``, ``submit``s intents,
``wait``s for or ``stop``s its end, and — with ``run.trainer_driver = "user"`` — takes batches
(``next_batch``), trains them (``train``) and publishes weights (``publish_weights``).

``EngineSteering`` is a mixin of ``shunter.api.Engine`` (``Engine.__init__`` sets the state its
methods use). Invariants: every answer from the coordinator that ends the run sets
``engine.ended``; a coordinator that died, or a run that ended with a failed component, is
restarted from its last checkpoint when restarts allow it (``Engine._restart``) before the caller
hears of the end; the user-driven calls refuse (``EngineError``, nothing taken) on a run the
engine drives.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator

import msgspec

from shunter.engine.io.errors import EngineError, IntentRefused, NoBatchError, RunEndedError, UserCodeError
from shunter.events import (
    Batch,
    CommandFailed,
    Event,
    Intent,
    IntentRejected,
    RelayReport,
    RunEnded,
    StepEnd,
    TrainBatch,
    WeightsReady,
)


class EngineSteering:
    """``Engine``'s events, intents, end, and the user-driven training calls (a mixin)."""

    # -- observing and steering ---------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        """Typed events of the run from its start (commands on the bus are skipped), until
        ``RunEnded``; the facts a relay folded into a ``RelayReport`` come one by one, as
        the replicas emitted them. The feed keeps the last 200,000 messages; a reader that falls further
        behind gets a warning with the number it missed. When the run restarts from a
        checkpoint the stream goes on with the new attempt's events (``RunResumed`` first)."""
        from ray.exceptions import RayActorError

        cursor = 0
        while True:
            try:
                items, cursor, missed = await self._live().fetch.remote(cursor, 4096, 1.0)
            except RayActorError as e:
                if await self._restart(f"coordinator died: {e}"):
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
                msg = self._codec.decode(b)
                if isinstance(msg, RunEnded) and msg.run_id in ("", self.run_id):
                    if await self._recover(msg):
                        restarted = True
                        break
                    self.ended = msg
                    yield msg
                    return
                if msg.__class__ is RelayReport:  # the facts a relay folded, one by one
                    for ev in msg.events:  # type: ignore[attr-defined]
                        yield ev
                elif isinstance(msg, Event):
                    yield msg
            if restarted:
                cursor = 0

    async def _recover(self, ended: RunEnded) -> bool:
        """True if the run that ended this way was restarted from its last checkpoint."""
        return bool(ended.failed_component) and await self._restart(ended.error)

    async def submit(self, intent: Intent) -> None:
        """Put an intent on the bus (``SwitchToRollout``, ``Rebalance``, ``Stop`` …); its outcome
        arrives in ``events()``."""
        if not isinstance(intent, Intent):
            raise TypeError(f"submit() takes an intent (SwitchToRollout, Stop, ...), got {type(intent).__name__}")
        if isinstance(intent, TrainBatch):
            self._live()
            self._user_driven("submit(TrainBatch(...))")
        if self.ended is not None:
            raise RunEndedError(self.ended)
        if not await self._live().submit.remote(self._codec.encode(intent)):
            raise ValueError(f"the coordinator rejected {intent!r}")

    async def wait(self) -> RunEnded:
        """The run's end, restarting it from its last checkpoint when a component died."""
        from ray.exceptions import RayActorError

        while True:
            try:
                ended = self._codec.decode(await self._live().wait_ended.remote())
            except RayActorError as e:
                if await self._restart(f"coordinator died: {e}"):
                    continue
                raise
            if not await self._recover(ended):
                self.ended = ended
                return ended

    async def stop(self, reason: str = "stopped") -> RunEnded:
        """End the run (the finale: final publish, load, validation, checkpoint) and return
        its ``RunEnded``."""
        if self.ended is not None:
            return self.ended
        self.ended = self._codec.decode(await self._live().stop.remote(reason))
        return self.ended

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
        """The next ready mini-batch (whole groups); rollout keeps running meanwhile.

        Raises ``NoBatchError`` after ``timeout_s`` saying why none is ready (groups still
        generating, the staleness gate waiting for ``publish_weights()``, no replica serving),
        or ``RunEndedError`` once the run is over. Only with ``run.trainer_driver = "user"``: with
        ``"engine"`` it raises ``EngineError`` and takes nothing (the engine trains every batch)."""
        live = self._live()
        self._user_driven("next_batch()")
        data, why = await live.next_batch.remote(timeout_s)
        if data is not None:
            return msgspec.msgpack.decode(data, type=Batch)
        if self.ended is None and why.startswith("the run ended"):
            self.ended = self._codec.decode(await self._live().wait_ended.remote())
        if self.ended is not None:
            raise RunEndedError(self.ended)
        raise NoBatchError(f"no mini-batch within {timeout_s:g}s: {why}")

    async def train(self, batch: Batch, *, loss_fn: str = "") -> StepEnd:
        """One optimizer step on ``batch`` (from :meth:`next_batch`; its ``samples`` may be
        replaced) on the trainer actor — the built-in loss, or ``loss_fn = "module:function"``
        taking a ``shunter.engine.trainer.loss.LossInput``.

        Raises ``UserCodeError`` when the loss fails (the run goes on and the batch may be
        trained again), ``IntentRefused`` for a batch already trained or never handed out,
        ``RunEndedError`` once the run is over; ``EngineError`` unless ``run.trainer_driver = "user"``."""
        if not isinstance(batch, Batch):
            raise TypeError(f"train() takes the Batch next_batch() returned, got {type(batch).__name__}")
        loss_fn = _loss_spec(loss_fn)
        self._live()
        self._user_driven("train()")
        if self.ended is not None:
            raise RunEndedError(self.ended)
        intent = TrainBatch(batch_id=batch.batch_id, samples=batch.samples, loss_fn=loss_fn)
        out = self._seen(self._codec.decode(await self._live().train.remote(self._codec.encode(intent))))
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
        """Publish the trainer's weights as the next version and return its ``WeightsReady``.
        With no optimizer step since the last publish nothing is published: the last
        ``WeightsReady`` is returned (None before the first publish)."""
        out = self._seen(self._codec.decode(await self._live().publish.remote()))
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
        return await self._live().counters.remote()


def _loss_spec(loss_fn: object) -> str:
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
