"""Weight payloads (``engine.weights.transport``) on CPU: tied tensors sent once, the flat
layout, and vLLM's own IPC weight-transfer engine accepting our packed update info and
unpacking our buffer into the original tensors (vLLM's code, not a copy of it)."""

from __future__ import annotations

import pickle

import pytest
import torch

from shunter.engine.weights import transport as wt


def _items():
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(11, 4, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(6, 4, generator=g)),
        ("model.norm.weight", torch.randn(4, generator=g)),
    ]


def test_unique_tensors_drops_a_tied_alias_but_keeps_equal_copies():
    emb = torch.randn(5, 3)
    sd = {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "other": emb.clone()}
    assert [n for n, _ in wt.unique_tensors(sd)] == ["model.embed_tokens.weight", "other"]


def test_pack_into_lays_tensors_back_to_back_in_the_buffer_dtype():
    items = _items()
    buf = torch.empty(sum(t.numel() for _, t in items), dtype=torch.bfloat16)
    entries = wt.pack_into(buf, items)
    assert [(n, s, o, k) for n, s, o, k in entries] == [
        ("model.embed_tokens.weight", (11, 4), 0, 44),
        ("model.layers.0.mlp.up_proj.weight", (6, 4), 44, 24),
        ("model.norm.weight", (4,), 68, 4),
    ]
    for (_, t), (_, shape, off, n) in zip(items, entries, strict=True):
        assert torch.equal(buf[off : off + n].view(shape), t.to(torch.bfloat16))


def test_vllms_ipc_engine_accepts_our_update_info_and_unpacks_our_buffer():
    ipc = pytest.importorskip("vllm.distributed.weight_transfer.ipc_engine")
    from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

    from shunter.actors.vllm.weights import ipc_update_info

    items = _items()
    buf = torch.empty(sum(t.numel() for _, t in items), dtype=torch.bfloat16)
    info = wt.vllm_update_info(wt.pack_into(buf, items), torch.bfloat16, {"GPU-uuid": ("rebuild", "args")})
    typed = ipc.IPCWeightTransferUpdateInfo(**ipc_update_info(info))  # vLLM's own validation
    got = unpack_tensor(
        buf.view(torch.uint8),
        typed.names,
        typed.shapes,
        [getattr(torch, d) for d in typed.dtype_names],
        typed.tensor_sizes,
    )
    assert [n for n, _ in got] == [n for n, _ in items]
    for (_, a), (_, b) in zip(got, items, strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))


def test_payload_kinds_are_told_apart_and_a_wrong_kind_is_refused():
    info = {"names": ["x"]}
    vllm_payload = wt.VLLM_MAGIC + pickle.dumps(info)
    assert wt.payload_kind(vllm_payload) == wt.VLLM_IPC
    assert wt.open_vllm_ipc(vllm_payload) == info
    assert wt.payload_kind(wt.MAGIC + b"...") == wt.CUDA_IPC
    blob = wt.to_safetensors(_items())
    assert wt.payload_kind(blob) == wt.SAFETENSORS
    with pytest.raises(ValueError, match="not a vllm_ipc"):
        wt.open_vllm_ipc(blob)
    with pytest.raises(ValueError, match="not a cuda_ipc"):
        wt.open_cuda_ipc(vllm_payload)


@pytest.mark.parametrize("transport", ["cuda_ipc", "vllm_ipc", "nccl"])
def test_an_ipc_transport_on_a_cpu_trainer_is_refused_by_name(tmp_path, transport):
    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer

    t = Trainer(TrainerConfig(device="cpu", weight_transport=transport), str(tmp_path))
    with pytest.raises(ValueError, match=f"weight_transport = '{transport}' needs a cuda device"):
        t.setup()


def test_an_unknown_wire_format_is_refused_and_ipc_needs_cuda():
    with pytest.raises(ValueError, match="unknown weight wire format 'nccl'"):
        wt.FlatPublisher().publish(_items(), torch.bfloat16, wire="nccl")
    with pytest.raises(ValueError, match="cuda_ipc needs the weights on a CUDA device"):
        wt.FlatPublisher().publish(_items(), torch.bfloat16, wire="cuda_ipc")


def test_a_flat_package_names_the_layout_and_the_views_rebuild_the_tensors():
    pub = wt.FlatPublisher()
    items = wt.unique_tensors(dict(_items()))
    pkg = pub.publish(items, torch.bfloat16, wire=wt.FLAT, version=3)
    assert wt.payload_kind(pkg) == wt.FLAT
    layout = wt.package_layout(pkg)
    assert layout["version"] == 3 and layout["dtype"] == "bfloat16"
    flat, _ = pub.buffer(3)
    assert layout["nbytes"] == flat.numel() * 2
    for (name, view), (n2, t) in zip(wt.flat_views(flat, layout["entries"]), items, strict=True):
        assert name == n2 and torch.equal(view, t.to(torch.bfloat16))
    with pytest.raises(ValueError, match="safetensors payload carries no flat-buffer layout"):
        wt.package_layout(wt.to_safetensors(items))


def test_each_buffer_keeps_its_id_while_refilled_and_gets_a_new_one_when_reallocated():
    pub = wt.FlatPublisher()
    items = wt.unique_tensors(dict(_items()))
    ids = [wt.package_layout(pub.publish(items, torch.bfloat16, wire=wt.FLAT, version=v))["buffer"] for v in range(4)]
    assert ids[0] == ids[2] and ids[1] == ids[3] and ids[0] != ids[1]  # two buffers, refilled in turn
    bigger = [*items, ("extra", torch.ones(3))]
    again = wt.package_layout(pub.publish(bigger, torch.bfloat16, wire=wt.FLAT, version=4))["buffer"]
    assert again not in ids  # buffer 0 reallocated: other memory, another id
    assert wt.FlatPublisher().publish(items, torch.bfloat16, wire=wt.FLAT) != ids[0]  # another trainer


OPENED = []


def _map_buffer(n: int) -> torch.Tensor:  # stands in for torch's rebuild_cuda_tensor
    OPENED.append(n)
    return torch.arange(n, dtype=torch.float32)


def _package(buffer_id: str, entries: list) -> bytes:
    n = sum(e[3] for e in entries)
    pkg = {"handle": (_map_buffer, (n,)), "buffer": buffer_id, "entries": entries, "nbytes": 4 * n}
    return wt.MAGIC + pickle.dumps(pkg)


def test_a_receiver_maps_each_buffer_once_and_keeps_the_last_two():
    OPENED.clear()
    maps = wt.IpcMappings()
    layout = [("a", (2, 3), 0, 6), ("b", (4,), 6, 4)]
    items, nbytes, hit = wt.open_cuda_ipc_cached(_package("t:0:1", layout), maps)
    assert hit is None and nbytes == 40 and [(n, tuple(t.shape)) for n, t in items] == [("a", (2, 3)), ("b", (4,))]
    assert torch.equal(items[1][1], torch.arange(6, 10, dtype=torch.float32))
    again, _, hit = wt.open_cuda_ipc_cached(_package("t:0:1", layout), maps)
    assert hit is not None and again is items and OPENED == [10]  # the same buffer: not mapped again
    other = [("a", (3, 2), 0, 6), ("b", (4,), 6, 4)]  # same id, another layout: mapped afresh
    wt.open_cuda_ipc_cached(_package("t:0:1", other), maps)
    wt.open_cuda_ipc_cached(_package("t:1:1", layout), maps)
    wt.open_cuda_ipc_cached(_package("t:0:2", layout), maps)  # a third buffer: the oldest mapping goes
    assert OPENED == [10, 10, 10, 10]
    assert maps.get("t:0:1") is None and maps.get("t:1:1") is not None
    wt.open_cuda_ipc_cached(_package("t:1:1", layout), None)  # no mappings kept: always mapped
    assert len(OPENED) == 5


class _Tied(torch.nn.Module):
    """A tiny causal-LM-shaped module: tied embedding / head, a layer, a norm."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.embed_tokens = torch.nn.Embedding(11, 4)
        self.up = torch.nn.Linear(4, 6)
        self.norm = torch.nn.LayerNorm(6)
        self.lm_head = torch.nn.Linear(4, 11, bias=False)
        self.lm_head.weight = self.embed_tokens.weight
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.up(self.embed_tokens(x))).sum() + self.lm_head(self.embed_tokens(x)).sum()


def test_a_flattened_module_keeps_its_values_and_parameters_and_publishes_with_one_copy():
    m = _Tied()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    params = list(m.parameters())
    flat = wt.flatten_module(m)
    assert flat is not None and flat.numel() == sum(p.numel() for p in params)
    assert list(m.parameters()) == params and m.lm_head.weight is m.embed_tokens.weight  # same objects, tie kept
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    items = wt.unique_tensors(m.state_dict())
    source = wt.flat_source(items)
    assert source is not None and source.data_ptr() == flat.data_ptr()
    # an optimizer step writes through the views; the one-copy publish equals the per-tensor one
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.tensor([1, 2, 3])).backward()
    opt.step()
    assert not torch.equal(m.up.weight, before["up.weight"]) and wt.flat_source(items) is not None
    one, each = wt.FlatPublisher(), wt.FlatPublisher()
    one.publish(items, torch.bfloat16, wire=wt.FLAT, version=1, source=source)
    each.publish(items, torch.bfloat16, wire=wt.FLAT, version=1)
    assert torch.equal(one.buffer(1)[0], each.buffer(1)[0])


def test_tensors_not_back_to_back_or_of_mixed_dtypes_get_no_flat_source():
    m = _Tied()
    assert wt.flat_source(wt.unique_tensors(m.state_dict())) is None  # separate allocations
    m.norm.to(torch.float64)
    assert wt.flatten_module(m) is None  # two dtypes: left as it was
    assert wt.flat_source(wt.unique_tensors(m.state_dict())) is None
