"""A user's own loop over the real engine (vLLM CPU + torch): every mistake a user makes
comes back as a typed exception with the cause first, and the run stays alive."""

from __future__ import annotations

import time

import msgspec
import pytest

pytestmark = pytest.mark.e2e


LOSSES = """
def typo_loss(inp):
    return inp.logpp.sum(), {}  # the user's typo


def no_stats_loss(inp):
    return (inp.advantages * inp.logp * inp.mask).sum()
"""


async def test_a_users_loop_gets_typed_errors_with_the_cause_first(ray_cluster, tiny_model, tmp_path, replica_pool):
    from shunter import Engine, IntentRefused, NoBatchError, RunEndedError, UserCodeError
    from shunter.engine.config import load_config
    from shunter.events import StepEnd, Stop

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    (tmp_path / "my_losses.py").write_text(LOSSES)  # the user's own module, found through run.import_paths
    cfg = load_config(
        root / "examples" / "sort_separate.toml",
        {
            "run": {
                "output_dir": str(tmp_path),
                "progress": False,
                "trainer_driver": "user",
                "import_paths": [str(tmp_path)],
            },
            "model": {"path": tiny_model, "build_tiny": ""},
            "validation": {"every": 0},
            "rollout": {"max_staleness": 0},
        },
    )
    async with Engine(cfg, pool=replica_pool) as engine:
        batch = await engine.next_batch(timeout_s=120)
        with pytest.raises(UserCodeError) as typo:
            await engine.train(batch, loss_fn="my_losses:typo_loss")
        assert str(typo.value).startswith("my_losses:typo_loss raised AttributeError")
        assert "logpp" in str(typo.value) and "\x1b[" not in str(typo.value) and len(str(typo.value)) < 600
        with pytest.raises(UserCodeError, match="returned Tensor"):
            await engine.train(batch, loss_fn="my_losses:no_stats_loss")
        import importlib
        import sys

        sys.path.insert(0, str(tmp_path))
        my_losses = importlib.import_module("my_losses")  # a function object works too: it names its module
        with pytest.raises(UserCodeError, match="my_losses:typo_loss raised AttributeError"):
            await engine.train(batch, loss_fn=my_losses.typo_loss)
        with pytest.raises(TypeError, match="loss_fn takes a 'module:function' string"):
            await engine.train(batch, loss_fn=lambda inp: inp)
        with pytest.raises(UserCodeError, match="cannot be loaded"):
            await engine.train(batch, loss_fn="my_losses:not_there")
        assert engine.ended is None
        end = await engine.train(batch)  # the same batch, with the built-in loss
        assert isinstance(end, StepEnd) and end.step == 1
        with pytest.raises(IntentRefused, match="already_trained"):
            await engine.train(batch)
        with pytest.raises(IntentRefused, match="unknown_batch"):
            await engine.train(msgspec.structs.replace(batch, batch_id=999))
        ready = await engine.publish_weights()
        assert ready is not None and ready.version == 1
        again = await engine.publish_weights()  # nothing new: a no-op that returns what is published
        assert again == ready
        for _ in range(3):  # max_staleness 0: 2 versions' worth of groups (64) may start before version 2
            await engine.train(await engine.next_batch(timeout_s=120))
        with pytest.raises(NoBatchError, match="publish_weights"):  # max_staleness 0: the gate waits for us
            await engine.next_batch(timeout_s=3)
        t0 = time.perf_counter()
        rid = await engine.add_replica("standalone")
        assert time.perf_counter() - t0 < 5, "add_replica returns before the replica's engine starts"
        up = await engine.replica_ready(rid)
        assert up.replica_id == rid and up.mode == "rollout"
        ended = await engine.stop("test done")
        with pytest.raises(RunEndedError, match="the run ended \\(stopped"):
            await engine.next_batch(timeout_s=1)
        t0 = time.perf_counter()
        for late in (engine.train(batch), engine.publish_weights(), engine.add_replica(), engine.submit(Stop())):
            with pytest.raises(RunEndedError):
                await late
        assert time.perf_counter() - t0 < 5, "after the end, every call answers at once"
    assert engine.ended == ended and ended.reason == "stopped" and ended.steps == 4
