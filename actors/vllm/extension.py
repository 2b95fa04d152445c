"""vLLM worker extension that installs a new policy from a safetensors blob.

Invariant kept here: when ``shunter_load_safetensors(blob)`` returns, every
tensor in ``blob`` (HF ``state_dict`` names) is live in the worker's model --
including derived kernel state such as the CPU backend's packed copies of a
tied LM head -- and the next forward pass the worker runs uses it; otherwise
it raises.  It never returns normally having loaded nothing.

Contract on the blob: send complete layers (normally the full state dict).
With vLLM's layer-wise in-place reload (0.32), a layer that receives no
tensor keeps its old values, but a layer that receives only *part* of its
tensors (say ``q_proj`` without ``k_proj``/``v_proj``) ends up with undefined
values in the missing part.

How it is reached: ``VLLMBackend`` passes this class's dotted path as
``worker_extension_cls``; vLLM then appends it to the worker class's bases, so
``self`` below *is* the vLLM worker (``Worker`` / ``CPUWorker``), and the
method is invoked from the engine client through ``collective_rpc``.  Method
names here must not collide with attributes of the vLLM worker (vLLM asserts
on that), hence the ``shunter_`` prefix.

The weights travel as ``bytes`` (a safetensors file image), never as tensors:
``collective_rpc`` arguments cross the client -> engine-core process boundary
through vLLM's msgpack encoder, and raw tensors do not survive every hop of
that path intact on every version (on CPU they were observed to arrive as
nested lists).  Bytes do.

A tensor-parallel replica runs one worker per rank; ``collective_rpc`` calls each of them with the
same arguments, and each installs the *full* tensors (vLLM's weight loaders take the rank's
shard). A weight group joins only the first rank (``shunter_join_weight_group``); the others
get its bytes over vLLM's own tensor-parallel group (``_fan_out``).

This module is imported inside vLLM's engine-core / worker process only; it
must stay importable without importing vLLM at module import time so that the
qualified name can be resolved cheaply.
"""

from __future__ import annotations

import time
from typing import Any

# Names whose presence is optional when the model ties its output projection to
# its input embedding.  An HF ``state_dict()`` of a tied model lists the shared
# tensor under both names; safetensors serialisers usually keep only one.
_TIED_HEAD = "lm_head.weight"
_TIED_EMBED = "model.embed_tokens.weight"


def _tied(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    if cfg is None:
        return False
    get_text = getattr(cfg, "get_text_config", None)
    if callable(get_text):
        try:
            cfg = get_text()
        except Exception:  # noqa: BLE001  # pragma: no cover - defensive
            pass
    return bool(getattr(cfg, "tie_word_embeddings", False))


def _normalise_tied(weights: dict, tied: bool) -> dict:
    """Make a tied model's head/embedding pair consistent.

    With tied weights vLLM keeps one tensor; its loader knows the alias.  We
    keep exactly the embedding name (synthesising it from ``lm_head.weight`` if
    only that was sent) so the loader sees one canonical copy.
    """
    if not tied:
        return weights
    if _TIED_HEAD in weights and _TIED_EMBED not in weights:
        weights[_TIED_EMBED] = weights[_TIED_HEAD]
    weights.pop(_TIED_HEAD, None)
    return weights


def _unquantized(model: Any) -> bool:
    """Every layer with a quant method uses an unquantized one (no derived kernel state)."""
    return all(
        type(m.quant_method).__name__.startswith("Unquantized")
        for m in model.modules()
        if getattr(m, "quant_method", None) is not None
    )


def _path_fields(path: str) -> dict:
    """How a load went in: the path's name, whether the verified copy plan did it and whether
    it did so from a buffer mapped before, bound once (numbers, so they reach
    ``WeightsLoaded.detail`` as ``backend_planned`` / ``backend_mapped``)."""
    return {"path": path, "planned": float(path.startswith("copy_plan")), "mapped": float(path == "copy_plan_mapped")}


def _tp() -> tuple[int, int]:
    """(this worker's tensor-parallel rank, the replica's tensor-parallel size)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001  # pragma: no cover - another vLLM layout, or no group: one rank
        return 0, 1


def _fan_out(buf: Any, *, ok: bool) -> dict:
    """Every tensor-parallel rank, together: the first says whether it received the weight
    group's bytes, then (if so) broadcasts them over vLLM's own tensor-parallel group (NVLink /
    the node's interconnect on GPUs, gloo on CPU) into the others' buffers. The status goes first
    so that a failed receive fails every rank's call instead of leaving the others waiting in a
    broadcast that never comes."""
    import torch
    from vllm.distributed import get_tensor_model_parallel_rank, get_tp_group

    tp = get_tp_group()
    status = torch.tensor([1 if ok else 0], dtype=torch.int64, device=buf.device)
    tp.broadcast(status, src=0)
    if not int(status.item()):
        if get_tensor_model_parallel_rank() != 0:
            raise RuntimeError("shunter_recv_weights: the first tensor-parallel rank did not receive the weights")
        return {}
    t0 = time.perf_counter()
    tp.broadcast(buf, src=0)
    return {"fan_out_s": time.perf_counter() - t0}


class WeightSyncExtension:
    """Mixed into the vLLM worker class (see module docstring)."""

    def shunter_load_safetensors(self, blob: bytes) -> dict:
        """Load a safetensors-serialised HF state dict into the live model.

        Returns a small dict of plain values (timings, tensor count) so the
        reply crosses the process boundary cheaply.
        """
        from safetensors.torch import load as st_load

        t0 = time.perf_counter()
        if isinstance(blob, (bytearray, memoryview)):
            blob = bytes(blob)
        if not isinstance(blob, bytes):
            raise TypeError(f"shunter_load_safetensors expects bytes, got {type(blob).__name__}")
        weights = st_load(blob)
        if not weights:
            raise ValueError("shunter_load_safetensors: empty safetensors blob")
        t_decode = time.perf_counter() - t0

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        weights = _normalise_tied(weights, _tied(model))
        n = len(weights)

        t1 = time.perf_counter()
        path = self._shunter_reload(list(weights.items()))
        n_refreshed = self._shunter_refresh_shared_embeddings(model)
        t_load = time.perf_counter() - t1
        return {
            "ranks": _tp()[1],
            "n_tensors": n,
            "decode_s": t_decode,
            "load_s": t_load,
            **_path_fields(path),
            "refreshed_shared": n_refreshed,
        }

    def shunter_load_cuda_ipc(self, package: bytes) -> dict:
        """Load weights from CUDA IPC handles to the trainer's flat GPU copy (same GPU): device
        to device, no host round trip. GPU only. The trainer refills two buffers in place, so
        their mappings are kept (``IpcMappings``) and, once the copy plan is verified, so are its
        bound (destination, source) views: a later load from a mapped buffer is one fused
        multi-tensor copy (path ``copy_plan_mapped``)."""
        import torch

        from shunter.engine.weights import copy_plan
        from shunter.engine.weights.transport import IpcMappings, open_cuda_ipc_cached

        t0 = time.perf_counter()
        maps = getattr(self, "_shunter_ipc", None)
        if maps is None:
            maps = self._shunter_ipc = IpcMappings()
        items, nbytes, hit = open_cuda_ipc_cached(bytes(package), maps)
        t_open = time.perf_counter() - t0
        t1 = time.perf_counter()
        if hit is not None and hit[2] is not None:
            copy_plan.copy_all(*hit[2])
            path, n = "copy_plan_mapped", len(hit[2][0])
        else:
            model = self.model_runner.get_model()  # type: ignore[attr-defined]
            weights = _normalise_tied(dict(items), _tied(model))
            path = self._shunter_reload(list(weights.items()))
            n = len(weights)
            state = getattr(self, "_shunter_plan", None)
            if state is not None and state[2] and (entry := maps.get_latest()) is not None and entry[0] is items:
                key = tuple((k, tuple(t.shape)) for k, t in weights.items())
                if key == state[0]:
                    entry[2] = copy_plan.bind(dict(model.named_parameters()), state[1], list(weights.values()))
        torch.cuda.synchronize()
        t_load = time.perf_counter() - t1
        return {"n_tensors": n, "nbytes": nbytes, "open_s": t_open, "load_s": t_load, **_path_fields(path)}

    def shunter_join_weight_group(self, backend: str, host: str, port: int, timeout_s: float) -> dict:
        """Join the trainer's weight group as rank 1 (``engine.weights.group``) — the first
        tensor-parallel rank only: the group is one (trainer, replica) pair whatever the
        replica's width, and the other ranks get the bytes from the first (``_shunter_fan_out``)."""
        import torch

        from shunter.engine.weights.group import make_group

        old = getattr(self, "_shunter_group", None)
        if _tp()[0] != 0:
            if old is not None:
                old.close()
            self._shunter_group = None
            self._shunter_fans_in = True  # this rank receives over vLLM's tensor-parallel group
            return {"join_s": 0.0}
        if backend == "nccl":
            from shunter.actors.vllm import nccl as vllm_nccl

            vllm_nccl.register()
        if old is not None:
            old.close()
        t0 = time.perf_counter()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        self._shunter_group = make_group(backend, host, port, 1, 2, timeout_s, device=device)
        return {"join_s": time.perf_counter() - t0}

    def shunter_recv_weights(self, package: bytes, timeout_s: float, receive: bool = True, load: bool = True) -> dict:
        """Receive the flat weight copy a layout names over the weight group into a buffer
        kept on the model's device (``receive``), then install it (``load``)."""
        import torch

        from shunter.engine.weights import transport as wt
        from shunter.engine.weights.group import recv_flat

        group = getattr(self, "_shunter_group", None)
        rank, width = _tp()
        if group is None and not (rank != 0 and getattr(self, "_shunter_fans_in", False)):
            raise RuntimeError("shunter_recv_weights: this worker joined no weight group")
        layout = wt.package_layout(bytes(package))
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        device = next(model.parameters()).device
        dtype = getattr(torch, layout["dtype"])
        numel = layout["nbytes"] // dtype.itemsize
        buf = getattr(self, "_shunter_recv_buf", None)
        if buf is None or buf.numel() != numel or buf.dtype != dtype or buf.device != device:
            self._shunter_recv_buf = None
            buf = self._shunter_recv_buf = torch.empty(numel, dtype=dtype, device=device)
        out: dict = {"nbytes": layout["nbytes"], "ranks": width}
        if receive and width == 1:
            out.update(recv_flat(group, buf, layout["version"], timeout_s=timeout_s))
        elif receive:  # tensor-parallel: the first rank receives, then hands the bytes on
            failed: BaseException | None = None
            if rank == 0:
                try:
                    out.update(recv_flat(group, buf, layout["version"], timeout_s=timeout_s))
                except Exception as e:  # noqa: BLE001 - the other ranks are told, then it is raised
                    failed = e
            out.update(_fan_out(buf, ok=failed is None))
            if failed is not None:
                raise failed
        if load:
            t1 = time.perf_counter()
            weights = _normalise_tied(dict(wt.flat_views(buf, layout["entries"])), _tied(model))
            out.update(_path_fields(self._shunter_reload(list(weights.items()))))
            self._shunter_refresh_shared_embeddings(model)
            if device.type == "cuda":
                torch.cuda.synchronize()
            out["load_s"] = time.perf_counter() - t1
        return out

    def _shunter_refresh_shared_embeddings(self, model: Any) -> int:
        """Re-derive kernel state of embedding layers that share a weight.

        Why: on vLLM's CPU platform ``UnquantizedEmbeddingMethod.
        process_weights_after_loading`` packs the weight into a private copy
        (``layer.cpu_linear`` closes over it) used for the LM-head matmul.  With
        tied embeddings, the in-place reload writes the new values into the
        shared ``model.embed_tokens.weight`` storage, but ``lm_head`` receives
        no checkpoint tensor of its own, so the reload restores it untouched and
        its packed copy stays at the OLD weights (the logits would then come
        from the old head).  Re-running the (idempotent, unquantized-only)
        post-load step on every embedding whose weight storage is shared fixes
        that.  On GPU that step is a no-op, so this costs nothing there.
        """
        import torch

        groups: dict[int, list] = {}
        for mod in model.modules():
            w = getattr(mod, "weight", None)
            qm = getattr(mod, "quant_method", None)
            if not isinstance(w, torch.Tensor) or w.numel() == 0 or qm is None:
                continue
            if type(qm).__name__ != "UnquantizedEmbeddingMethod":
                continue
            groups.setdefault(w.data_ptr(), []).append(mod)
        shared = [m for mods in groups.values() if len(mods) > 1 for m in mods]
        if not shared:
            return 0
        try:
            from vllm.config import set_current_vllm_config

            ctx = set_current_vllm_config(self.vllm_config)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001  # pragma: no cover - layout differences
            import contextlib

            ctx = contextlib.nullcontext()
        with ctx, torch.no_grad():
            for mod in shared:
                mod.quant_method.process_weights_after_loading(mod)
        return len(shared)

    # -- version-dependent part -------------------------------------------------

    def _shunter_reload(self, items: list) -> str:
        """Push ``(name, tensor)`` pairs into the model; returns the path used.

        Preferred (vLLM >= ~0.11, checked on 0.32): ``Worker.reload_weights(
        weights_iterator=..., is_checkpoint_format=True)``, which delegates to
        ``GPUModelRunner.reload_weights`` -> ``model_loader.reload.reload_weights``
        (layer-wise reload: handles fused qkv / gate_up, tied embeddings and any
        post-load kernel processing, under the right ``vllm_config`` context).

        Fallback (older releases whose ``reload_weights`` takes no iterator, or
        lacks the method): the classic ``model.load_weights(iter)`` followed by
        ``process_weights_after_loading``.  On CPU + 0.32 the fallback breaks,
        which is why it is only a fallback.
        """
        if self._shunter_on_gpu():  # on GPU the model's own loader is complete; a verified plan is faster
            return self._shunter_gpu_load(items)
        reload = getattr(self, "reload_weights", None)
        if reload is not None:
            try:
                import inspect

                params = inspect.signature(reload).parameters
                accepts = "weights_iterator" in params or any(
                    p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
                )
            except (TypeError, ValueError):  # pragma: no cover
                accepts = True
            if accepts:
                try:
                    reload(weights_iterator=iter(items), is_checkpoint_format=True)
                    return "reload_weights"
                except TypeError as e:
                    # Worker.reload_weights(*args, **kwargs) forwards blindly; an
                    # older model runner then rejects the keyword.
                    if "weights_iterator" not in str(e) and "is_checkpoint_format" not in str(e):
                        raise
        return self._shunter_legacy_load(items)

    def _shunter_gpu_load(self, items: list) -> str:
        """On GPU: copy straight into the parameters with a plan (``engine.weights.copy_plan``) once a
        plan for this layout reproduced what the model's own loader wrote; until then, and for
        layouts or models it does not fit (quantized ones), the loader."""
        from shunter.engine.weights import copy_plan

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        key = tuple((n, tuple(t.shape)) for n, t in items)
        state = getattr(self, "_shunter_plan", None)  # (layout key, plan or None, verified)
        if state is not None and state[0] == key and state[2]:
            copy_plan.apply(dict(model.named_parameters()), state[1], [t for _, t in items])
            return "copy_plan"
        path = self._shunter_legacy_load(items)
        if state is None or state[0] != key:
            params = dict(model.named_parameters())
            plan = copy_plan.build(params, list(key)) if _unquantized(model) else None
            ok = plan is not None and copy_plan.verify(params, plan, [t for _, t in items])
            self._shunter_plan = (key, plan, ok)
            path += "+plan_verified" if ok else "+no_plan"
        return path

    def _shunter_on_gpu(self) -> bool:
        try:
            model = self.model_runner.get_model()  # type: ignore[attr-defined]
            return next(model.parameters()).device.type == "cuda"
        except Exception:  # noqa: BLE001  # pragma: no cover - defensive
            return False

    def _shunter_legacy_load(self, items: list) -> str:
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        loaded = model.load_weights(iter(items))
        try:
            from vllm.model_executor.model_loader.utils import (
                process_weights_after_loading,
            )
        except ImportError:  # pragma: no cover - very old layouts
            process_weights_after_loading = None
        if process_weights_after_loading is not None:
            device = next(model.parameters()).device
            process_weights_after_loading(
                model,
                self.model_runner.model_config,
                device,  # type: ignore[attr-defined]
            )
        if loaded is not None and len(loaded) == 0:
            raise RuntimeError("model.load_weights loaded no parameters")
        return "load_weights"
