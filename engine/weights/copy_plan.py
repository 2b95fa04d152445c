"""A direct copy plan from HF-named tensors into a vLLM model's parameters, fused ones
included (``q_proj`` / ``k_proj`` / ``v_proj`` -> ``qkv_proj``, ``gate_proj`` / ``up_proj`` ->
``gate_up_proj``, rows in that order, as vLLM's loaders write them on one GPU), and vocabularies
that vLLM pads (its embedding and output head have rows up to a multiple of 64; the HF tensor
fills the first ones, the padding rows stay as the loader left them).

Invariant: a plan is only *used* after it reproduced exactly, on one load, the parameter
values vLLM's own loader wrote (:func:`verify`); a layout it does not know, a shape that does
not add up, or a value that differs yields no plan, and the loader stays in charge. So a plan
can make a load faster (a few hundred device copies instead of the loader's per-tensor Python
path) but never make it wrong. Plain torch, no vLLM: the worker extension builds, verifies and
applies it (``actors/vllm/extension.py``).
"""

from __future__ import annotations

import torch

VOCAB = ("embed_tokens.weight", "lm_head.weight")  # parameters whose rows vLLM pads
FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}

Step = tuple[str, int, int, int]  # (parameter name, first row, end row, index of the source tensor)


def _target(name: str) -> tuple[str, int] | None:
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p in FUSED:
            fused, shard = FUSED[p]
            return ".".join([*parts[:i], fused, *parts[i + 1 :]]), shard
    return None


def build(params: dict[str, torch.Tensor], items: list[tuple[str, tuple[int, ...]]]) -> list[Step] | None:
    """The plan for sources named and shaped as ``items`` into ``params`` (a model's
    ``named_parameters()``), or None when any source or parameter does not fit."""
    direct: list[Step] = []
    shards: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}
    for i, (name, shape) in enumerate(items):
        shape = tuple(shape)
        if name in params:
            have = tuple(params[name].shape)
            padded = (
                name.endswith(VOCAB) and len(have) == len(shape) > 0 and have[1:] == shape[1:] and have[0] >= shape[0]
            )
            if have != shape and not padded:
                return None
            direct.append((name, 0, shape[0] if shape else 0, i))
            continue
        t = _target(name)
        if t is None or t[0] not in params:
            return None
        shards.setdefault(t[0], []).append((t[1], i, shape))
    plan = direct
    for pname, parts in shards.items():
        p = params[pname]
        parts.sort()
        if [s for s, _, _ in parts] != list(range(len(parts))):
            return None  # a shard is missing or repeated
        row = 0
        for _, i, shape in parts:
            if not shape or tuple(shape[1:]) != tuple(p.shape[1:]):
                return None
            plan.append((pname, row, row + shape[0], i))
            row += shape[0]
        if row != p.shape[0]:
            return None
    covered = {s[0] for s in plan}
    if covered != set(params):  # a parameter the sources would leave untouched: not ours to plan
        return None
    return plan


def _dst(params: dict[str, torch.Tensor], step: Step) -> torch.Tensor:
    p = params[step[0]].data
    return p if p.dim() == 0 else p[step[1] : step[2]]


def bind(
    params: dict[str, torch.Tensor], plan: list[Step], tensors: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The plan as (destination views, source views): reusable for every load from the same
    source tensors (a mapped flat buffer the trainer refills), so a load is one :func:`copy_all`."""
    dsts = [_dst(params, step) for step in plan]
    return dsts, [tensors[step[3]].reshape(d.shape) for d, step in zip(dsts, plan, strict=True)]


@torch.no_grad()
def copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """``dst.copy_(src)`` for each pair, as one fused multi-tensor copy where torch has it."""
    if not dsts:
        return
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(dsts, srcs)
        return
    for d, s in zip(dsts, srcs, strict=True):  # pragma: no cover - torch without _foreach_copy_
        d.copy_(s)


@torch.no_grad()
def apply(params: dict[str, torch.Tensor], plan: list[Step], tensors: list[torch.Tensor]) -> None:
    copy_all(*bind(params, plan, tensors))


@torch.no_grad()
def verify(params: dict[str, torch.Tensor], plan: list[Step], tensors: list[torch.Tensor]) -> bool:
    """Whether the parameters hold exactly what :func:`apply` would write."""
    for step in plan:
        dst = _dst(params, step)
        src = tensors[step[3]].reshape(dst.shape).to(dst.dtype)
        if not torch.equal(dst, src):
            return False
    return True
