"""The direct copy plan (``engine.weights.copy_plan``) against a stand-in of vLLM's fused layout:
it writes what the loader writes, refuses what it does not know, and its check catches a
plan that would write something else."""

from __future__ import annotations

import torch

from shunter.engine.weights import copy_plan

H, Q, KV, I = 8, 8, 4, 12  # hidden, q rows, k/v rows, intermediate
V, VPAD = 20, 64  # vocabulary; vLLM pads its embedding's rows up to a multiple of 64


def hf_items(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    out = [("model.embed_tokens.weight", r(V, H))]
    for n in range(2):
        p = f"model.layers.{n}."
        out += [
            (p + "self_attn.q_proj.weight", r(Q, H)),
            (p + "self_attn.q_proj.bias", r(Q)),
            (p + "self_attn.k_proj.weight", r(KV, H)),
            (p + "self_attn.k_proj.bias", r(KV)),
            (p + "self_attn.v_proj.weight", r(KV, H)),
            (p + "self_attn.v_proj.bias", r(KV)),
            (p + "self_attn.o_proj.weight", r(H, Q)),
            (p + "mlp.gate_proj.weight", r(I, H)),
            (p + "mlp.up_proj.weight", r(I, H)),
            (p + "mlp.down_proj.weight", r(H, I)),
            (p + "input_layernorm.weight", r(H)),
            (p + "post_attention_layernorm.weight", r(H)),
        ]
    return out + [("model.norm.weight", r(H))]


def vllm_params() -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": torch.zeros(VPAD, H), "model.norm.weight": torch.zeros(H)}
    for n in range(2):
        p = f"model.layers.{n}."
        out.update(
            {
                p + "self_attn.qkv_proj.weight": torch.zeros(Q + 2 * KV, H),
                p + "self_attn.qkv_proj.bias": torch.zeros(Q + 2 * KV),
                p + "self_attn.o_proj.weight": torch.zeros(H, Q),
                p + "mlp.gate_up_proj.weight": torch.zeros(2 * I, H),
                p + "mlp.down_proj.weight": torch.zeros(H, I),
                p + "input_layernorm.weight": torch.zeros(H),
                p + "post_attention_layernorm.weight": torch.zeros(H),
            }
        )
    return out


def loader(params, items) -> None:
    """What vLLM's loaders do on one GPU: shards into their rows of the fused parameter."""
    offsets = {"q_proj": (0, Q), "k_proj": (Q, KV), "v_proj": (Q + KV, KV), "gate_proj": (0, I), "up_proj": (I, I)}
    for name, t in items:
        for part, (a, n) in offsets.items():
            if f".{part}." in name:
                fused = name.replace(part, "qkv_proj" if part in ("q_proj", "k_proj", "v_proj") else "gate_up_proj")
                params[fused].data[a : a + n].copy_(t)
                break
        else:
            params[name].data[: len(t) if t.dim() else None].copy_(t)  # a padded vocabulary: its first rows


def test_the_plan_writes_what_the_loader_writes_and_verifies():
    items = hf_items()
    plan = copy_plan.build(vllm_params(), [(n, tuple(t.shape)) for n, t in items])
    assert plan is not None and len(plan) == len(items)
    by_loader, by_plan = vllm_params(), vllm_params()
    loader(by_loader, items)
    copy_plan.apply(by_plan, plan, [t for _, t in items])
    assert all(torch.equal(by_loader[k], by_plan[k]) for k in by_loader)
    assert copy_plan.verify(by_loader, plan, [t for _, t in items])
    assert not copy_plan.verify(by_loader, plan, [t for _, t in hf_items(seed=1)])  # other values: refused


def test_a_plan_that_would_swap_k_and_v_fails_the_check():
    items = hf_items()
    params = vllm_params()
    loader(params, items)
    swapped = [(n.replace("k_proj", "TMP").replace("v_proj", "k_proj").replace("TMP", "v_proj"), t) for n, t in items]
    plan = copy_plan.build(params, [(n, tuple(t.shape)) for n, t in swapped])
    assert plan is not None  # same shapes: only the values tell
    assert not copy_plan.verify(params, plan, [t for _, t in swapped])


def test_layouts_it_does_not_know_get_no_plan():
    items = [(n, tuple(t.shape)) for n, t in hf_items()]
    assert copy_plan.build(vllm_params(), items + [("model.extra.weight", (3,))]) is None  # unknown source
    assert copy_plan.build(vllm_params(), [x for x in items if "v_proj.weight" not in x[0]]) is None  # shard missing
    assert copy_plan.build(vllm_params(), [x for x in items if x[0] != "model.norm.weight"]) is None  # param untouched
    bad = [(n, (s[0] + 1, *s[1:]) if n.endswith("o_proj.weight") else s) for n, s in items]
    assert copy_plan.build(vllm_params(), bad) is None  # shape does not fit
    big = [(n, (VPAD + 1, H) if n.endswith("embed_tokens.weight") else s) for n, s in items]
    assert copy_plan.build(vllm_params(), big) is None  # more rows than the padded vocabulary


def test_a_padded_vocabulary_gets_its_first_rows_and_only_there():
    """vLLM pads the embedding (and an untied output head) to a multiple of 64 rows: the HF
    tensor goes to the first rows, the padding keeps what the loader left; other parameters
    with spare rows are not taken for padded ones."""
    items = hf_items()
    params = vllm_params()
    params["model.embed_tokens.weight"].fill_(7.0)
    plan = copy_plan.build(params, [(n, tuple(t.shape)) for n, t in items])
    copy_plan.apply(params, plan, [t for _, t in items])
    emb = params["model.embed_tokens.weight"]
    assert torch.equal(emb[:V], items[0][1]) and bool((emb[V:] == 7.0).all())
    wide = {**vllm_params(), "model.layers.0.self_attn.o_proj.weight": torch.zeros(H + 1, Q)}
    assert copy_plan.build(wide, [(n, tuple(t.shape)) for n, t in items]) is None


def test_the_worker_extension_loads_once_by_the_loader_then_by_the_verified_plan():
    """``WeightSyncExtension._shunter_gpu_load`` with a stand-in worker: the first load of a
    layout goes through the model's loader and verifies a plan; the next ones use the plan."""
    from shunter.actors.vllm.extension import WeightSyncExtension

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, t in vllm_params().items():
                self.register_parameter(name.replace(".", "__"), torch.nn.Parameter(t))

        def named_parameters(self, *a, **k):
            return ((n.replace("__", "."), p) for n, p in super().named_parameters())

    class Worker(WeightSyncExtension):
        def __init__(self):
            self.model = Model()
            self.loader_calls = 0
            self.model_runner = type("R", (), {"get_model": lambda _: self.model})()

        def _shunter_legacy_load(self, items):
            self.loader_calls += 1
            loader(dict(self.model.named_parameters()), items)
            return "load_weights"

    w = Worker()
    paths = []
    for seed in (1, 2, 3):
        items = hf_items(seed)
        paths.append(w._shunter_gpu_load(items))
        want = vllm_params()
        loader(want, items)
        got = dict(w.model.named_parameters())
        assert all(torch.equal(got[k], want[k]) for k in want), (seed, paths)
    assert paths == ["load_weights+plan_verified", "copy_plan", "copy_plan"] and w.loader_calls == 1


def test_a_plan_bound_to_a_flat_buffer_copies_each_refill_of_it():
    """The receiver's fast path: the plan is bound once to views of the trainer's flat buffer;
    the trainer refills that buffer in place; each copy of the bound views writes what the
    loader writes for the new values."""
    from shunter.engine.weights import transport as wt

    first = hf_items(seed=0)
    flat = torch.empty(sum(t.numel() for _, t in first))
    entries = wt.pack_into(flat, first)
    views = wt.flat_views(flat, entries)
    params = vllm_params()
    plan = copy_plan.build(params, [(n, tuple(t.shape)) for n, t in views])
    assert plan is not None
    bound = copy_plan.bind(params, plan, [t for _, t in views])
    for seed in (1, 2):
        new = hf_items(seed=seed)
        wt.pack_into(flat, new)  # refilled in place, as the trainer does
        copy_plan.copy_all(*bound)
        expect = vllm_params()
        loader(expect, new)
        assert all(torch.equal(expect[k], params[k]) for k in params)
