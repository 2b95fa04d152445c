"""The ``Engine`` facade before it starts (no Ray needed): every call says the engine is not
started, instead of an ``AttributeError`` on a missing handle."""

from __future__ import annotations

import pytest
from fakes import virtual_time

from shunter import Engine, EngineError, UserCodeError
from shunter.api import _loss_spec
from shunter.engine.config import from_dict
from shunter.events import Batch, Stop


@virtual_time
async def test_calls_before_start_say_the_engine_is_not_started():
    engine = Engine(from_dict({}))
    for call in (
        engine.next_batch(1),
        engine.publish_weights(),
        engine.wait(),
        engine.submit(Stop()),
        engine.train(Batch(batch_id=0, samples=[])),
    ):
        with pytest.raises(EngineError, match="the engine is not started"):
            await call


def test_a_loss_given_as_a_function_becomes_its_import_string():
    from shunter.engine import rl

    assert _loss_spec("a.b:c") == "a.b:c"
    assert _loss_spec(rl.group_advantages) == "shunter.engine.rl:group_advantages"
    with pytest.raises(TypeError, match="module:function"):
        _loss_spec(lambda inp: inp)


def test_user_code_errors_are_engine_errors():
    assert issubclass(UserCodeError, EngineError)
