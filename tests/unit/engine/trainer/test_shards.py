"""Sharded trainer state on disk (``engine.trainer.shards``) on the tiny model, in real gloo
process groups of spawned processes with FSDP2 (``fully_shard`` per block, then the root):

- saved at 2 ranks, loaded at 2, at a 1-rank mesh and by a plain model in one process; saved by
  one process, loaded at 2: parameters and AdamW state (exp_avg, exp_avg_sq, step) equal the saved
  ones, and one more step from the loaded state equals one more step from the original;
- the old single-process format (``model/`` + ``trainer.pt``) loads at 1 and 2;
- a truncated shard, a missing ``.metadata``, one rank's unreadable RNG file: every rank raises
  the error naming the file and the checkpoint, within the test's bound (no rank left waiting);
- ``write_hf_folder`` from 2 ranks (several safetensors files and an index) loads with
  ``AutoModelForCausalLM.from_pretrained`` and gives the unsharded model's logits.

One spawn of 2 ranks and one of 1 rank carry all the distributed checks (a spawned process
costs seconds of imports on a busy 2-core machine); they write what they saw, the test compares.
"""

from __future__ import annotations

import json
import os
import shutil
import traceback
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from shunter.engine.trainer.rank_group import free_port  # noqa: E402 - after the skips

STEPS = 3
LR = 1e-2  # large enough that AdamW's state moves visibly in 3 steps


# -- what every process does ----------------------------------------------------------------
def _batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(2, 42, (4, 12), generator=g)


def _build(model_dir: str, shard: bool):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    if shard:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for block in model.model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from shunter.engine.weights.transport import flatten_module

        flatten_module(model)  # as today's trainer: the parameters are views of one flat buffer
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    return model, opt


def _step(model, opt) -> None:
    x = _batch()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _snapshot(model, opt) -> dict:
    """Full parameters and AdamW state by name (on rank 0; other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    sharded = torch.distributed.is_initialized()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True) if sharded else StateDictOptions()
    params = get_model_state_dict(model, options=options)
    optim = get_optimizer_state_dict(model, opt, options=options)
    if sharded and torch.distributed.get_rank() != 0:
        return {}
    return {
        "params": {k: v.detach().clone() for k, v in params.items()},
        "optim": {k: {n: t.clone() for n, t in s.items()} for k, s in optim["state"].items()},
    }


def _save_old_format(root: Path, model, opt, *, step: int, version: int, model_dir: str) -> None:
    """The checkpoint ``Trainer.save`` wrote up to issue 47 (kept here: the format is frozen)."""
    model.save_pretrained(root / "model", safe_serialization=True)
    for f in Path(model_dir).iterdir():
        if f.is_file() and not (root / "model" / f.name).exists() and f.suffix not in (".safetensors", ".bin", ".pt"):
            shutil.copy2(f, root / "model" / f.name)
    torch.save(
        {"optimizer": opt.state_dict(), "step": step, "version": version, "rng": torch.get_rng_state()},
        root / "trainer.pt",
    )


def _load_then_step(root: Path, model_dir: str, shard: bool) -> dict:
    """A fresh model loads ``root``: its snapshot, the step/version, and the snapshot after one more step."""
    from shunter.engine.trainer.shards import load_state

    model, opt = _build(model_dir, shard)
    step, version = load_state(root, model, opt)
    loaded = _snapshot(model, opt)
    rng = torch.get_rng_state()
    _step(model, opt)
    return {"loaded": loaded, "after": _snapshot(model, opt), "step": step, "version": version, "rng": rng}


def _expect_error(fn) -> str:
    from shunter.engine.trainer.shards import ShardStateError

    try:
        fn()
    except ShardStateError as e:
        return str(e)
    return "no error"


def _worker(rank: int, world: int, port: int, tmp: str, model_dir: str) -> None:
    torch.set_num_threads(1)
    out: dict = {}
    try:
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
        _run(rank, world, Path(tmp), model_dir, out)
    except BaseException:  # noqa: BLE001 - the parent reports it
        out["error"] = traceback.format_exc()
    finally:
        torch.save(out, Path(tmp) / f"out{world}-rank{rank}.pt")
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _run(rank: int, world: int, tmp: Path, model_dir: str, out: dict) -> None:
    from shunter.engine.trainer.shards import load_state, save_state, write_hf_folder

    if world == 1:  # a 1-rank FSDP mesh loads the 2-rank save and the old format
        out["2to1mesh"] = _load_then_step(tmp / "ckpt2", model_dir, shard=True)
        out["old_at_1mesh"] = _load_then_step(tmp / "old", model_dir, shard=True)
        return
    model, opt = _build(model_dir, shard=True)
    for _ in range(STEPS):
        _step(model, opt)
    torch.manual_seed(100 + rank)  # each rank's RNG its own, so that its restore shows
    out["rng_saved"] = torch.get_rng_state()
    out["nbytes"] = save_state(tmp / "ckpt2", model, opt, step=STEPS, version=2, model_dir=model_dir)
    write_hf_folder(tmp / "ckpt2" / "model", model, model_dir, max_shard_bytes=300_000)
    out["saved"] = _snapshot(model, opt)
    _step(model, opt)
    out["saved_after"] = _snapshot(model, opt)
    out["2to2"] = _load_then_step(tmp / "ckpt2", model_dir, shard=True)
    out["1to2"] = _load_then_step(tmp / "ckpt1", model_dir, shard=True)
    out["old_at_2"] = _load_then_step(tmp / "old", model_dir, shard=True)
    # damage: rank 0 makes damaged copies, then both ranks load them
    if rank == 0:
        for name in ("truncated", "no_metadata", "bad_rng"):
            shutil.copytree(tmp / "ckpt2", tmp / name)
        shard = tmp / "truncated" / "dcp" / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        (tmp / "no_metadata" / "dcp" / ".metadata").unlink()
        (tmp / "bad_rng" / "rng" / "rank1.pt").write_bytes(b"not a torch file")
    torch.distributed.barrier()
    fresh, fopt = _build(model_dir, shard=True)
    for name in ("truncated", "no_metadata", "bad_rng"):
        out[name] = _expect_error(lambda name=name: load_state(tmp / name, fresh, fopt))


# -- the tests ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from shunter.engine.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", sft_steps=0))


def _spawn(world: int, tmp: Path, model_dir: str) -> list[dict]:
    import multiprocessing

    import torch.multiprocessing as mp

    # a fork server imports torch and transformers once for both spawns and every rank (a fresh
    # interpreter's imports are most of a rank's time on a busy 2-core machine); forked from a
    # process that never ran torch, so no thread pool is copied half-alive
    multiprocessing.set_forkserver_preload(["torch", "transformers.models.qwen2.modeling_qwen2", __name__])
    ctx = mp.start_processes(
        _worker, args=(world, free_port(), str(tmp), model_dir), nprocs=world, join=False, start_method="forkserver"
    )
    for _ in range(120):  # bounded: a rank left waiting would show as a timeout here, not a hang
        if ctx.join(timeout=1):
            break
    else:
        for p in ctx.processes:
            p.kill()
        pytest.fail(f"the {world}-rank group did not finish within 120 s")
    outs = [torch.load(tmp / f"out{world}-rank{r}.pt", weights_only=False) for r in range(world)]
    for r, o in enumerate(outs):
        assert "error" not in o, f"rank {r}:\n{o['error']}"
    return outs


def _same(a: dict, b: dict, atol: float) -> None:
    assert a["params"].keys() == b["params"].keys()
    for k in a["params"]:
        torch.testing.assert_close(a["params"][k], b["params"][k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    assert a["optim"].keys() == b["optim"].keys()
    for k, s in a["optim"].items():
        assert s.keys() == b["optim"][k].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for n in s:
            torch.testing.assert_close(
                s[n], b["optim"][k][n], atol=atol, rtol=0, msg=lambda m, k=k, n=n: f"{k}.{n}: {m}"
            )


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """Everything saved and loaded, once: one process, a 2-rank group, a 1-rank group."""
    from shunter.engine.trainer.shards import save_state

    tmp = tmp_path_factory.mktemp("shards")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # one process: the old format and this format, from the same trained plain model
    model, opt = _build(model_dir, shard=False)
    for _ in range(STEPS):
        _step(model, opt)
    _save_old_format(tmp / "old", model, opt, step=STEPS, version=1, model_dir=model_dir)
    save_state(tmp / "ckpt1", model, opt, step=STEPS, version=1, model_dir=model_dir)
    one = {"saved": _snapshot(model, opt)}
    _step(model, opt)
    one["saved_after"] = _snapshot(model, opt)
    two = _spawn(2, tmp, model_dir)
    mesh1 = _spawn(1, tmp, model_dir)[0]
    one["2to1"] = _load_then_step(tmp / "ckpt2", model_dir, shard=False)
    one["old_at_1"] = _load_then_step(tmp / "old", model_dir, shard=False)
    return {"tmp": tmp, "one": one, "two": two, "mesh1": mesh1}


@pytest.mark.timeout(300)
def test_saved_at_2_loads_at_2_at_a_1_rank_mesh_and_in_one_process(runs):
    saved, after = runs["two"][0]["saved"], runs["two"][0]["saved_after"]
    assert saved["optim"] and all(s["step"].item() == STEPS for s in saved["optim"].values())
    for got in (runs["two"][0]["2to2"], runs["mesh1"]["2to1mesh"], runs["one"]["2to1"]):
        assert (got["step"], got["version"]) == (STEPS, 2)
        _same(got["loaded"], saved, atol=0)  # exactly what was saved
        _same(got["after"], after, atol=1e-6)  # and one more step lands where the original's did
    for r in (0, 1):  # each rank's RNG is back; one process takes rank 0's
        assert torch.equal(runs["two"][r]["2to2"]["rng"], runs["two"][r]["rng_saved"])
    assert torch.equal(runs["one"]["2to1"]["rng"], runs["two"][0]["rng_saved"])
    assert runs["two"][0]["nbytes"] == runs["two"][1]["nbytes"] > 0


@pytest.mark.timeout(300)
def test_saved_by_one_process_loads_at_2(runs):
    got, one = runs["two"][0]["1to2"], runs["one"]
    assert (got["step"], got["version"]) == (STEPS, 1)
    _same(got["loaded"], one["saved"], atol=0)
    _same(got["after"], one["saved_after"], atol=1e-6)


@pytest.mark.timeout(300)
def test_the_old_single_process_format_loads_at_1_and_2(runs):
    one = runs["one"]
    for got in (one["old_at_1"], runs["mesh1"]["old_at_1mesh"], runs["two"][0]["old_at_2"]):
        assert (got["step"], got["version"]) == (STEPS, 1)
        _same(got["loaded"], one["saved"], atol=0)
        _same(got["after"], one["saved_after"], atol=1e-6)


@pytest.mark.timeout(300)
def test_a_damaged_checkpoint_is_named_on_every_rank(runs):
    tmp = runs["tmp"]
    for out in runs["two"]:
        assert out["truncated"].startswith(f"checkpoint {tmp / 'truncated'}: dcp/__1_0.distcp is truncated")
        assert out["no_metadata"].startswith(f"checkpoint {tmp / 'no_metadata'}: dcp/.metadata is missing")
        # only rank 1 reads that file; rank 0 raises too instead of waiting for it
        assert out["bad_rng"].startswith(f"checkpoint {tmp / 'bad_rng'}: rng/rank1.pt does not load")
        assert out["bad_rng"].endswith("(rank 1)")


@pytest.mark.timeout(300)
def test_hf_folder_from_2_ranks_serves_the_same_logits(runs, model_dir):
    from transformers import AutoModelForCausalLM

    folder = runs["tmp"] / "ckpt2" / "model"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((folder / f).is_file() for f in files)
    assert "lm_head.weight" not in index["weight_map"]  # tied: saved once, as HF does
    assert (folder / "tokenizer.json").is_file() and not (folder / "model.safetensors").exists()
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    served = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    plain.load_state_dict(runs["two"][0]["saved"]["params"])
    x = _batch()
    with torch.no_grad():
        torch.testing.assert_close(served(input_ids=x).logits, plain(input_ids=x).logits, atol=0, rtol=0)


@pytest.mark.timeout(120)
def test_hf_folder_of_a_plain_model_in_one_process(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from shunter.engine.trainer.shards import write_hf_folder

    model, opt = _build(model_dir, shard=False)
    _step(model, opt)
    write_hf_folder(tmp_path / "model", model, model_dir, dtype=torch.bfloat16)
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert not (tmp_path / "model" / "model.safetensors.index.json").exists()
    served = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))
    assert served.dtype == torch.bfloat16
    for k, v in model.state_dict().items():
        torch.testing.assert_close(served.state_dict()[k], v.to(torch.bfloat16), atol=0, rtol=0)


@pytest.mark.timeout(300)
def test_the_docs_layout_names_every_file_a_checkpoint_holds(runs, model_dir):
    """docs/architecture.md's layout, against the files of a real 2-rank checkpoint."""
    import re

    root = Path(__file__).resolve().parents[4]
    text = (root / "docs" / "architecture.md").read_text()
    layout = text[text.index("## The trainer's state on disk") :].split("```")[1]
    ckpt = runs["tmp"] / "ckpt2"
    original = {f.name for f in Path(model_dir).iterdir()}
    for f in sorted(ckpt.rglob("*")):
        rel = f.relative_to(ckpt).as_posix()
        if f.is_dir() or (rel.startswith("model/") and f.name in original and f.name != "config.json"):
            continue  # the original model's files, copied as they are
        rel = re.sub(r"__\d+_0", "__<r>_0", re.sub(r"rank\d+", "rank<r>", rel))
        rel = re.sub(r"model-\d+-of-\d+", "model-0000i-of-0000n", rel)
        name = rel.split("/")[-1]
        assert name in layout and (rel.split("/")[0] + "/" in layout or "/" not in rel), f"{rel} is not in the docs"
