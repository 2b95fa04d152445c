"""Datasets in verl's layout (parquet / JSONL): loading, the errors a user's files cause, the
stream's epochs, shuffle and resume position; reward functions of either signature."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shunter.engine.config import ConfigError, from_dict, load_config
from shunter.engine.data.datasets import Dataset, PromptStream, validation_specs
from shunter.engine.data.files import FIRST_ROWS, DataError, check_file, check_files, expand, read_rows
from shunter.engine.tasks import as_scorer, load_reward, score_of
from shunter.events import ChatMessage, PromptSpec


def verl_rows(n: int, start: int = 0) -> list[dict]:
    return [
        {
            "data_source": "sort_digits",
            "prompt": [{"role": "user", "content": str(10_000 + start + i)}],
            "ability": "sort",
            "reward_model": {"style": "rule", "ground_truth": "".join(sorted(str(10_000 + start + i)))},
            "extra_info": {"split": "train", "index": start + i},
        }
        for i in range(n)
    ]


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parquet_and_jsonl_in_verls_layout_read_alike(tmp_path):
    rows = verl_rows(5)
    a = read_rows(write_parquet(tmp_path / "a.parquet", rows))
    b = read_rows(write_jsonl(tmp_path / "b.jsonl", rows))
    assert [r.spec(0) for r in a] == [r.spec(0) for r in b]
    spec = a[2].spec(7)
    assert spec.messages == [ChatMessage(role="user", content="10002")] and spec.text == ""
    assert spec.answer == "00012" and spec.data_source == "sort_digits"
    assert spec.extra_info == {"split": "train", "index": 2}


def test_a_plain_string_prompt_and_a_numeric_answer_are_taken(tmp_path):
    rows = [{"prompt": "12>", "reward_model": {"ground_truth": 12}}]
    (r,) = read_rows(write_jsonl(tmp_path / "base_model.jsonl", rows))
    assert r.text == "12>" and r.messages == () and r.ground_truth == "12"
    assert r.data_source == "base_model" and not r.named  # no data_source column: the file's name
    with_one = {"prompt": "3>", "reward_model": {"ground_truth": 3}, "data_source": "mine"}
    data = Dataset.load([write_jsonl(tmp_path / "base_model.jsonl", [*rows, with_one, *rows])])
    assert data.unnamed == {str(tmp_path / "base_model.jsonl"): 2}  # counted: the summary says so
    assert PromptStream(data, 0).metrics()["data/source_from_file_name"] == 2.0


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"prompt": "1>"}], "no column 'reward_model'"),
        ([{"reward_model": {"ground_truth": "1"}}], "no column 'prompt'"),
        (
            [
                {"prompt": "1>", "reward_model": {"ground_truth": "1"}},
                {"prompt": 3, "reward_model": {"ground_truth": "1"}},
            ],
            None,
        ),
        ([{"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}], "line 1: field 'prompt[0]'"),
        ([{"prompt": [], "reward_model": {"ground_truth": "1"}}], "line 1: field 'prompt' is list"),
        ([{"prompt": "1>", "reward_model": {"style": "rule"}}], "line 1: field 'reward_model'"),
        (
            [{"prompt": "1>", "reward_model": {"ground_truth": None}}],
            "line 1: field 'reward_model.ground_truth' is missing",
        ),
        (
            [{"prompt": "1>", "reward_model": {"ground_truth": "1"}, "extra_info": 5}],
            "line 1: field 'extra_info' is int",
        ),
    ],
)
def test_bad_rows_name_the_file_the_row_and_the_field(tmp_path, rows, message):
    f = tmp_path / "bad.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as e:
        read_rows(f)
    assert str(f) in str(e.value)
    if message:
        assert message in str(e.value)


def test_mixed_types_in_a_column_are_an_error_naming_the_file_and_line(tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text(
        '{"prompt": "1>", "reward_model": {"ground_truth": "1"}}\n'
        '{"prompt": 3, "reward_model": {"ground_truth": "1"}}\n'
    )
    with pytest.raises(DataError, match="mixed.jsonl:line 2: field 'prompt' is int; expected a list"):
        read_rows(f)


def test_jsonl_numbers_keep_their_literal_as_the_ground_truth(tmp_path):
    f = tmp_path / "numbers.jsonl"
    f.write_text(
        '{"prompt": "a", "reward_model": {"ground_truth": 3}}\n'
        '{"prompt": "b", "reward_model": {"ground_truth": 12345678901234567890}}\n'
        '{"prompt": "c", "reward_model": {"ground_truth": 1.50}, "data_source": 7}\n'
        '{"prompt": "d", "reward_model": {"ground_truth": -2e3}}\n'
    )
    rows = read_rows(f)
    assert [r.ground_truth for r in rows] == ["3", "12345678901234567890", "1.50", "-2e3"]
    assert rows[2].data_source == "7"


def test_jsonl_extra_info_is_each_rows_own_object(tmp_path):
    rows = [
        {"prompt": "a", "reward_model": {"ground_truth": "1"}, "extra_info": {"a": 1, "x": 0.5}},
        {"prompt": "b", "reward_model": {"ground_truth": "2"}, "extra_info": {"b": [1, 2]}},
        {"prompt": "c", "reward_model": {"ground_truth": "3"}},
    ]
    got = [r.extra_info for r in read_rows(write_jsonl(tmp_path / "e.jsonl", rows))]
    assert got == [{"a": 1, "x": 0.5}, {"b": [1, 2]}, {}]
    assert type(got[0]["x"]) is float


def test_a_jsonl_file_not_utf8_is_an_error_naming_the_file_and_line(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(
        b'{"prompt": "a", "reward_model": {"ground_truth": "1"}}\n'
        + '{"prompt": "caf\u00e9", "reward_model": {"ground_truth": "1"}}\n'.encode("latin-1")
    )
    with pytest.raises(DataError, match=r"latin1.jsonl:line 2: not UTF-8 \(byte 0xe9"):
        read_rows(f)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(verl_rows(1)[0]).encode() + b"\n")
    assert read_rows(bom)[0].ground_truth == "00001"


def test_a_bad_line_past_the_first_megabyte_is_named_by_its_own_number(tmp_path):
    f = tmp_path / "big.jsonl"
    rows = verl_rows(20_000)
    rows[15_000]["prompt"] = 3
    lines = [json.dumps(r) + "\n" for r in rows]
    lines.insert(100, "\n")  # a blank line counts as a line
    f.write_text("".join(lines))
    assert f.stat().st_size > 2_000_000
    with pytest.raises(DataError) as e:
        read_rows(f)
    assert str(e.value).startswith(f"{f}:line 15002: field 'prompt' is int")
    lines[7000] = '{"prompt": "1>", "reward_model": \n'
    f.write_text("".join(lines))
    with pytest.raises(DataError, match=r"big.jsonl:line 7001: not valid JSON \(Expecting value at column 34\)"):
        read_rows(f)
    lines[7000] = '{"prompt": "1>", "reward_model": "cut\n'  # a line cut inside a string
    f.write_text("".join(lines))
    with pytest.raises(DataError) as e:
        read_rows(f)
    assert "not valid JSON (Unterminated string starting at column 34)" in str(e.value)


@pytest.mark.parametrize(
    "text", ['[{"prompt": "1>", "reward_model": {"ground_truth": "1"}}]', '[\n  {"prompt": "1>"}\n]\n']
)
def test_a_json_array_file_is_said_to_need_jsonl(tmp_path, text):
    f = tmp_path / "data.json"
    f.write_text(text)
    with pytest.raises(DataError, match=r"data.json:line 1: the file holds a JSON array; expected JSONL \(one JSON"):
        read_rows(f)


def test_a_line_that_is_not_an_object_is_an_error_naming_it(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(verl_rows(1)[0]) + '\n"just text"\n')
    with pytest.raises(DataError, match=r"d.jsonl:line 2: a str, not an object; expected JSONL"):
        read_rows(f)


def test_damaged_empty_and_unknown_files_are_errors_naming_them(tmp_path):
    torn = tmp_path / "torn.parquet"
    torn.write_bytes(write_parquet(tmp_path / "ok.parquet", verl_rows(50)).read_bytes()[:300])
    with pytest.raises(DataError, match="torn.parquet: cannot be read as parquet"):
        read_rows(torn)
    empty = write_parquet(tmp_path / "empty.parquet", verl_rows(0) or [])
    with pytest.raises(DataError, match="empty.parquet: holds no rows"):
        read_rows(empty)
    (tmp_path / "data.csv").write_text("prompt\n1\n")
    with pytest.raises(DataError, match="unknown format '.csv'"):
        expand([str(tmp_path / "data.csv")])
    with pytest.raises(DataError, match="matches no file"):
        expand([str(tmp_path / "nope-*.parquet")])


def test_the_check_before_a_run_refuses_what_the_full_read_refuses_in_the_first_rows(tmp_path):
    """``check_file`` (Engine.start, before anything starts) says what ``read_rows`` says of a file
    that is not one, is empty, lacks a column or has a bad row among its first rows."""
    (tmp_path / "text.parquet").write_text("prompt,answer\n312,123\n")
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "empty.jsonl").write_text("\n")
    write_parquet(tmp_path / "no-prompt.parquet", [{"question": "1", "reward_model": {"ground_truth": "1"}}])
    write_jsonl(tmp_path / "no-rm.jsonl", [{"prompt": "1"}])
    bad = verl_rows(FIRST_ROWS)
    bad[-1] = {**bad[-1], "prompt": None}
    write_parquet(tmp_path / "bad-row.parquet", bad)
    cases = {
        "text.parquet": "text.parquet: cannot be read as parquet: ",
        "empty.parquet": "empty.parquet: cannot be read as parquet: ",
        "empty.jsonl": "empty.jsonl: holds no rows",
        "no-prompt.parquet": "no-prompt.parquet: no column 'prompt' (it has question, reward_model)",
        "no-rm.jsonl": "no-rm.jsonl: no column 'reward_model' (it has prompt)",
        "bad-row.parquet": f"bad-row.parquet:row {FIRST_ROWS}: field 'prompt' is missing (null)",
    }
    for name, message in cases.items():
        with pytest.raises(DataError) as full:
            read_rows(tmp_path / name)
        with pytest.raises(DataError) as first:
            check_file(tmp_path / name)
        assert message in str(first.value), (name, str(first.value))
        assert message in str(full.value), (name, str(full.value))


def test_the_check_before_a_run_reads_only_the_first_rows_and_every_file_named(tmp_path):
    """The whole file is read once, by the launcher: the check stops after ``FIRST_ROWS`` rows
    (a bad row past them is the full read's to name), and it opens every match of every glob."""
    rows = verl_rows(5000)
    rows[4000] = {**rows[4000], "reward_model": {"style": "rule"}}
    late = write_parquet(tmp_path / "late.parquet", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "groups.parquet", row_group_size=100)
    lines = write_jsonl(tmp_path / "late.jsonl", verl_rows(50))
    lines.write_text(lines.read_text() + "not json\n")
    for f in (late, tmp_path / "groups.parquet", lines):
        check_file(f)
        with pytest.raises(DataError, match=r"(row 4001|line 51): "):
            read_rows(f)
    assert check_files(["late.*", "groups.parquet"], base=tmp_path) == [lines, late, tmp_path / "groups.parquet"]
    (tmp_path / "late-2.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"late-2.parquet: cannot be read as parquet"):
        check_files(["late*.parquet"], base=tmp_path, what="data.val_files")


def test_a_directory_or_a_missing_path_is_said_to_be_so(tmp_path):
    (tmp_path / "dir.parquet").mkdir()
    with pytest.raises(DataError, match=r"data.train_files: .*dir.parquet is not a file \(a directory\)"):
        expand(["dir.parquet"], base=tmp_path)
    with pytest.raises(DataError, match=r"data.train_files: 'nope.parquet' matches no file \(.*does not exist\)"):
        expand(["nope.parquet"], base=tmp_path)


def test_one_file_named_twice_in_two_spellings_is_read_once(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", verl_rows(3))
    (tmp_path / "sub").mkdir()
    assert expand(["./a.parquet", "a.parquet", str(a), "sub/../a.parquet"], base=tmp_path) == [tmp_path / "./a.parquet"]
    assert len(Dataset.load([a, tmp_path / "sub" / ".." / "a.parquet"]).rows) == 3


def test_globs_expand_in_order_once_each_from_the_base(tmp_path):
    for k in (2, 1, 3):
        write_parquet(tmp_path / f"part-{k}.parquet", verl_rows(2, start=10 * k))
    files = expand(["part-*.parquet", "part-1.parquet"], base=tmp_path)
    assert [f.name for f in files] == ["part-1.parquet", "part-2.parquet", "part-3.parquet"]


def test_prompts_too_long_are_left_out_and_counted(tmp_path):
    rows = verl_rows(4) + [{"prompt": [{"role": "user", "content": "9" * 40}], "reward_model": {"ground_truth": "9"}}]
    f = write_parquet(tmp_path / "t.parquet", rows)
    data = Dataset.load([f], count_tokens=lambda r: len(r.messages[0].content) + 1, max_prompt_tokens=10)
    assert len(data.rows) == 4 and data.too_long == {str(f): 1}
    with pytest.raises(DataError, match=r"no prompt left.*all 5 are longer than 10 tokens \(data.max_prompt_tokens\)"):
        Dataset.load([f], count_tokens=lambda r: 100, max_prompt_tokens=10, limit="data.max_prompt_tokens")
    with pytest.raises(DataError, match=r"longer than 10 tokens \(data.max_prompt_tokens, or when 0 rollout"):
        Dataset.load([f], count_tokens=lambda r: 100, max_prompt_tokens=10)


def test_the_prompt_limit_in_force_is_named_by_its_setting():
    assert from_dict({}).prompt_room() == (48, "rollout.max_model_len - rollout.max_tokens")
    assert from_dict({"data": {"max_prompt_tokens": 20}}).prompt_room() == (20, "data.max_prompt_tokens")


def test_a_prompt_limit_beyond_the_context_left_is_refused_at_load_naming_both():
    from_dict({"data": {"max_prompt_tokens": 48}})  # 64 - 16: the whole room
    with pytest.raises(ConfigError) as e:
        from_dict({"data": {"max_prompt_tokens": 49}})
    assert str(e.value).startswith(
        "data.max_prompt_tokens (49) is above rollout.max_model_len (64) - rollout.max_tokens (16) = 48"
    )


def test_loading_no_file_is_said_so():
    with pytest.raises(DataError, match="no data file given"):
        Dataset.load([])


def test_the_stream_visits_every_row_once_an_epoch_shuffled_by_seed_and_resumes_exactly(tmp_path):
    data = Dataset.load([write_parquet(tmp_path / "t.parquet", verl_rows(10))])
    s = PromptStream(data, seed=3)
    first = [p.answer for p in islice(s, 10)]
    second = [p.answer for p in islice(s, 10)]
    assert sorted(first) == sorted(second) == sorted(r.ground_truth for r in data.rows)
    assert first != second and s.epoch == 2  # each epoch its own order
    assert [p.answer for p in islice(PromptStream(data, seed=3), 10)] == first  # a pure function of the seed
    assert [p.prompt_id for p in islice(PromptStream(data, seed=3), 3)] == [0, 1, 2]
    resumed = PromptStream(data, seed=3)
    resumed.skip(13)  # a checkpoint after 13 prompts: the second epoch's 4th prompt next
    assert [p.answer for p in islice(resumed, 7)] == second[3:]
    plain = PromptStream(data, seed=3, shuffle=False)
    assert [p.answer for p in islice(plain, 10)] == [r.ground_truth for r in data.rows]
    with pytest.raises(ValueError, match="only moves forward"):
        resumed.skip(-1)


def test_the_stream_ends_after_its_epochs(tmp_path):
    data = Dataset.load([write_parquet(tmp_path / "t.parquet", verl_rows(3))])
    s = PromptStream(data, seed=0, epochs=2)
    assert len(list(s)) == 6 and next(s, None) is None
    assert s.metrics() == {
        "data/rows": 3.0,
        "data/filtered_too_long": 0.0,
        "data/source_from_file_name": 0.0,
        "data/epoch": 2.0,
    }


def test_validation_prompts_have_negative_ids(tmp_path):
    data = Dataset.load([write_parquet(tmp_path / "v.parquet", verl_rows(5))])
    assert [p.prompt_id for p in validation_specs(data, 3)] == [-1, -2, -3]


def test_config_resolves_data_files_from_its_folder_and_checks_they_exist(tmp_path):
    write_parquet(tmp_path / "train.parquet", verl_rows(3))
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text('[data]\ntrain_files = ["train.parquet"]\n')
    cfg = load_config(cfg_file)
    assert cfg.data.train_files == [str(tmp_path / "train.parquet")]
    cfg_file.write_text('[data]\ntrain_files = ["trian.parquet"]\n')
    with pytest.raises(ConfigError, match="data.train_files: 'trian.parquet' matches no file|trian.parquet"):
        load_config(cfg_file)
    cfg_file.write_text('[data]\nval_files = ["train.parquet"]\n')
    with pytest.raises(ConfigError, match="without data.train_files"):
        load_config(cfg_file)


# -- rewards as users write them ------------------------------------------------------------------
P = PromptSpec(prompt_id=0, text="31>", answer="13", data_source="sort_digits", extra_info={"index": 4})


def test_a_reward_in_verls_signature_gets_the_rows_fields_and_may_return_a_dict():
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return {"score": float(solution_str == ground_truth), "acc": 1.0}

    assert score_of(as_scorer(compute_score)(P, "13")) == 1.0
    assert seen == [("sort_digits", "13", "13", {"index": 4})]


def test_a_tasks_reward_signature_still_works():
    assert as_scorer(lambda prompt, response, answer: float(prompt == "31>" and response == answer))(P, "13") == 1.0


@pytest.mark.parametrize("bad", [lambda a, b: 0.0, lambda a, b, c, d, e: 0.0])
def test_a_reward_with_a_wrong_signature_is_refused_naming_both(bad):
    with pytest.raises(ValueError, match=r"takes \d positional arguments; a reward takes 3.*verl's 4"):
        as_scorer(bad)


def test_load_reward_refuses_a_wrong_signature_at_load(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def two(a, b):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="takes 2 positional"):
        load_reward("my_rewards:two")


@pytest.mark.parametrize(
    "fn",
    [
        lambda solution_str, ground_truth, data_source=None, extra_info=None: (
            data_source,
            solution_str,
            ground_truth,
            extra_info,
        ),
        lambda data_source, solution_str, ground_truth: (data_source, solution_str, ground_truth, None),
        lambda *, extra_info, ground_truth, solution_str, data_source: (
            data_source,
            solution_str,
            ground_truth,
            extra_info,
        ),
        lambda solution_str, **kw: (kw["data_source"], solution_str, kw["ground_truth"], kw["extra_info"]),
        lambda a, b, c, d: (a, b, c, d),  # verl's four, unnamed: by position
    ],
)
def test_a_verl_reward_gets_each_field_under_its_name_whatever_its_order(fn):
    got = as_scorer(fn)(P, "13")
    assert got[:3] == ("sort_digits", "13", "13") and got[3] in ({"index": 4}, None)


def test_a_verl_named_reward_that_requires_another_parameter_is_refused_naming_it():
    def mixed(data_source, response, answer):
        return 0.0

    with pytest.raises(ValueError, match=r"mixed takes verl's data_source but also requires response, answer"):
        as_scorer(mixed)


def test_a_tasks_reward_that_names_extra_info_is_still_a_tasks():
    assert as_scorer(lambda prompt, response, answer, extra_info=None: (prompt, extra_info))(P, "13") == ("31>", None)


def test_an_async_reward_is_refused_at_load(tmp_path, monkeypatch):
    (tmp_path / "async_rewards.py").write_text("async def score(prompt, response, answer):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="reward function score is async; reward functions must be synchronous"):
        load_reward("async_rewards:score")

    class Callable:
        async def __call__(self, prompt, response, answer):
            return 1.0

    with pytest.raises(ValueError, match="is async"):
        as_scorer(Callable())
