"""The ``Engine`` facade before it starts (no Ray needed): every call says the engine is not
started, instead of an ``AttributeError`` on a missing handle."""

from __future__ import annotations

import pytest

from shunter import Engine, EngineError, EngineSetupError, UserCodeError
from shunter.api_steering import loss_spec
from shunter.engine.config import from_dict
from shunter.events import Batch, Stop
from tests.support.fakes import virtual_time


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
    from shunter.engine.trainer import rl

    assert loss_spec("a.b:c") == "a.b:c"
    assert loss_spec(rl.group_advantages) == "shunter.engine.trainer.rl:group_advantages"
    with pytest.raises(TypeError, match="module:function"):
        loss_spec(lambda inp: inp)


def test_user_code_errors_are_engine_errors():
    assert issubclass(UserCodeError, EngineError)


@pytest.mark.parametrize("held", ["events.bin", "checkpoints", "registry.msgpack"])
@virtual_time
async def test_a_new_run_under_a_used_run_id_is_refused_before_anything_starts(tmp_path, held):
    """Was: re-running a finished run's id without --resume inherited its leases (same actor
    names with no RankAssigned, or a stale lease holding a rank) and appended to its log."""
    (tmp_path / "job").mkdir()
    if held == "checkpoints":
        (tmp_path / "job" / held).mkdir()
        (tmp_path / "job" / held / "step-00000002").write_bytes(b"old")
        held_file = tmp_path / "job" / held / "step-00000002"
    else:
        held_file = tmp_path / "job" / held
        held_file.write_bytes(b"old")
    engine = Engine(from_dict({"run": {"output_dir": str(tmp_path)}}), run_id="job")
    with pytest.raises(EngineSetupError, match="already holds run 'job'.*--resume") as err:
        await engine.start()
    assert held in str(err.value) and engine._launch is None  # Ray and the model were never touched
    assert held_file.read_bytes() == b"old"


@virtual_time
async def test_a_resume_with_a_damaged_registry_state_is_refused_before_anything_starts(tmp_path):
    from shunter.engine.io.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path / "job" / "checkpoints")
    staging = store.staging(2)
    (staging / "trainer.pt").write_bytes(b"x")
    store.commit(staging, run_id="job", step=2, version=1)
    (tmp_path / "job" / "registry.msgpack").write_bytes(b"")
    engine = Engine(from_dict({}), resume=tmp_path / "job")
    with pytest.raises(
        EngineSetupError, match="cannot resume run job: .*registry.msgpack: the saved rank table is empty"
    ):
        await engine.start()
    assert engine._launch is None


def test_data_and_environments_given_as_objects_are_checked_before_anything_starts(tmp_path):
    from shunter.engine.data.environments import Calculator

    rows = [{"prompt": [{"role": "user", "content": "12"}], "reward_model": {"ground_truth": "12"}}]
    Engine(from_dict({}), train_data=rows, val_data=rows, environment=Calculator)  # fine: nothing starts
    with pytest.raises(EngineSetupError, match="train_data and data.train_files are both given"):
        (tmp_path / "t.jsonl").write_text("{}")
        Engine(from_dict({"data": {"train_files": [str(tmp_path / "t.jsonl")]}}), train_data=rows)
    with pytest.raises(EngineSetupError, match="val_data and data.val_files are both given"):
        Engine(
            from_dict({"data": {"train_files": [str(tmp_path / "t.jsonl")], "val_files": [str(tmp_path / "t.jsonl")]}}),
            val_data=rows,
        )
    with pytest.raises(EngineSetupError, match="val_data is given without training data"):
        Engine(from_dict({}), val_data=rows)
    with pytest.raises(EngineSetupError, match="environment and task.environment are both given"):
        Engine(from_dict({"task": {"environment": "calculator"}}), environment=Calculator)

    class NoStop:
        async def reset(self, prompt, transcript): ...
        async def step(self, action): ...

    with pytest.raises(EngineSetupError, match=r"NoStop.stop must be a non-empty list"):
        Engine(from_dict({}), environment=NoStop)
    with pytest.raises(EngineSetupError, match="is not a class"):
        Engine(from_dict({}), environment=Calculator())
    slow = from_dict({"task": {"env_timeout_s": 100.0}, "rollout": {"generate_timeout_s": 100.0}})
    with pytest.raises(EngineSetupError, match=r"env_timeout_s \(100\) must be below 0.9 x rollout.generate_timeout_s"):
        Engine(slow, environment=Calculator)  # the check task.environment gets when the config loads


def test_rows_given_as_objects_are_checked_like_a_files_rows():
    from shunter.engine.data.datasets import Dataset
    from shunter.engine.data.files import DataError

    ok = {"prompt": "12>", "data_source": "d", "reward_model": {"ground_truth": 3}}
    d = Dataset.from_records([ok, ok], "train_data")
    assert len(d.rows) == 2 and d.rows[0].ground_truth == "3" and d.rows[0].where == "train_data[0]"
    with pytest.raises(DataError, match=r"train_data\[1\]: field 'reward_model'"):
        Dataset.from_records([ok, {"prompt": "x"}], "train_data")
    with pytest.raises(DataError, match=r"train_data\[0\]: is str"):
        Dataset.from_records(["12>"], "train_data")
    with pytest.raises(DataError, match="expected a list of rows"):
        Dataset.from_records("rows.parquet", "train_data")
    with pytest.raises(DataError, match="holds no rows"):
        Dataset.from_records([], "train_data")
    short = Dataset.from_records(
        [ok, {**ok, "prompt": "1" * 50}], "train_data", count_tokens=lambda r: len(r.text), max_prompt_tokens=10
    )
    assert len(short.rows) == 1 and short.too_long == {"train_data": 1}
