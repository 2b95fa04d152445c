"""A model sharded over the trainer ranks with torch FSDP2: built on the meta device, wrapped
block by block, loaded shard by shard, and gathered back bucket by bucket.

Invariants:

- ``build`` never materialises the whole model on any rank: the LM is made on the meta device,
  ``fully_shard`` wraps every transformer block (the classes the model names in
  ``_no_split_modules``) and then the root (a ``TokenScorer``, so the output head is gathered
  inside the root's forward), and each rank then fills only its own shard of each parameter
  from the HF folder's safetensors, one tensor at a time (``distribute_tensor(...,
  src_data_rank=None)``: every rank slices locally, no communication). Buffers the folder does
  not hold (rotary frequencies) are computed by the model's own ``_init_weights``.
- ``precision = "bf16"`` is FSDP's ``MixedPrecisionPolicy``: bf16 parameters in the forward and
  backward, fp32 gradient reduction, fp32 master weights and optimizer state.
- ``gathered`` yields the LM's unique tensors (tied ones once, under their first HF name) as
  full tensors in buckets of at most ``bucket_bytes`` (a tensor larger than that is a bucket of
  its own); every rank iterates it in step (each full tensor is a collective), and no more
  than one bucket of full tensors exists at a time beyond what the caller keeps.

The torchtitan recipe (``parallelize``: blocks, then the root; meta init; mixed precision);
``docs/architecture.md`` says what runs where.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from shunter.engine.trainer.rank_group import RankGroup
from shunter.engine.trainer.scoring import TokenScorer


class ShardLoadError(ValueError):
    """The HF folder does not hold a tensor the model has, or holds it in another shape."""


def blocks(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: modules of the classes it names in ``_no_split_modules``
    (HF's own list of the units that must stay whole), outermost first."""
    names = set(getattr(lm, "_no_split_modules", None) or [])
    found = [m for m in lm.modules() if type(m).__name__ in names]
    if not found:
        raise ValueError(
            f"{type(lm).__name__} names no transformer block class in _no_split_modules "
            f"({sorted(names)}): cannot shard it block by block"
        )
    return found


def _safetensors_index(model_dir: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / f for name, f in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise ShardLoadError(f"model dir {str(model_dir)!r} has no model.safetensors(.index.json)")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 - safe_open has keys(), not iteration


def build(
    model_dir: str,
    group: RankGroup,
    device: str,
    *,
    temperature: float,
    bf16: bool,
    checkpointing: bool,
    trainable: bool = True,
) -> TokenScorer:
    """The LM of ``model_dir`` sharded over ``group`` as a ``TokenScorer`` root (module
    docstring); ``trainable = False`` for the frozen KL reference."""
    from safetensors import safe_open
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import distribute_tensor
    from transformers import AutoConfig, AutoModelForCausalLM

    root = Path(model_dir)
    config = AutoConfig.from_pretrained(str(root))
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if checkpointing and trainable:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    scorer = TokenScorer(lm, temperature=temperature, amp=False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    kw = {"mesh": group.mesh, **({"mp_policy": mp} if mp is not None else {})}
    for block in blocks(lm):
        fully_shard(block, **kw)
    fully_shard(scorer, **kw)
    scorer.to_empty(device=device)

    files = _safetensors_index(root)
    handles: dict[Path, object] = {}
    try:
        with torch.no_grad():
            seen: set[int] = set()
            # the state dict: parameters and persistent buffers (the non-persistent ones no file
            # holds), a tied tensor under its first name only, as HF saves it
            for name, p in lm.state_dict(keep_vars=True).items():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if name not in files:
                    raise ShardLoadError(f"model dir {model_dir!r} has no tensor {name!r}")
                f = files[name]
                if f not in handles:
                    handles[f] = safe_open(str(f), framework="pt")
                full = handles[f].get_tensor(name)  # type: ignore[attr-defined]
                if tuple(full.shape) != tuple(p.shape):
                    raise ShardLoadError(
                        f"model dir {model_dir!r}: {name!r} is {tuple(full.shape)}, the model wants {tuple(p.shape)}"
                    )
                full = full.to(device=device, dtype=p.dtype)
                if isinstance(p, torch.distributed.tensor.DTensor):
                    local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                    p.to_local().copy_(local)
                else:
                    p.copy_(full)
                del full
    finally:
        handles.clear()
    for m in lm.modules():  # buffers no file holds (rotary frequencies): the model's own init computes them
        if getattr(m, "_non_persistent_buffers_set", None):
            lm._init_weights(m)
    if trainable:
        lm.train()
    else:
        lm.eval().requires_grad_(False)
    return scorer


def reshard(root: torch.nn.Module) -> None:
    """Drop every gathered copy of the sharded parameters under ``root`` (FSDP2 keeps the root's
    after a forward pass), so the module's parameters are its shards again: what a gather, a
    checkpoint or an in-place change of the shards must see."""
    from torch.distributed.fsdp import FSDPModule

    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def gathered(lm: torch.nn.Module, bucket_bytes: int, dtype: torch.dtype) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The LM's unique tensors as full ``dtype`` tensors, bucket by bucket (module docstring).
    A collective: every rank iterates it to the end, in step."""
    from torch.distributed.tensor import DTensor

    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    seen: set[int] = set()
    for name, t in lm.state_dict(keep_vars=True).items():  # the tensors themselves: a tied one is seen twice
        if id(t) in seen:
            continue
        seen.add(id(t))
        full = t.full_tensor() if isinstance(t, DTensor) else t
        full = full.detach().to(dtype)
        nbytes = full.numel() * full.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, full))
        size += nbytes
    if bucket:
        yield bucket
