"""A trainer's state on disk, sharded: what ``save_state`` writes, ``load_state`` reads at any
world size, and ``write_hf_folder`` gathers into a model folder a replica can serve.

Invariants:

- **Every rank returns, or every rank raises.** The functions are collective over the default
  process group when one is initialised (every rank calls them, in the same order), else they
  run in one process. What a rank reads or writes on its own (its RNG file, the state file, a
  file check) is followed by an agreement step (an all-gather of each rank's error, or none):
  when one rank fails, every rank raises the same ``ShardStateError`` naming the file and the
  checkpoint, and no rank is left waiting in a collective the failed one never reaches. Torch
  Distributed Checkpoint (DCP) gathers its ranks' read and write errors itself; a rank that dies
  outright is ended by the process group's timeout.
- **A checkpoint loads at any world size.** Model and optimizer state are saved by DCP with
  fully qualified names (``get_state_dict``): each rank writes its own shards, and a load reads
  whatever slices the loading rank's parameters need (DTensor shards on an FSDP mesh of any
  size, or whole tensors for a plain model in one process).
- **Nothing executable is unpickled** from what this module wrote: tensors load with
  ``weights_only=True``, DCP's ``.metadata`` (a pickle) through an unpickler that admits only
  DCP's metadata classes, the step, version and optimizer hyper-parameters are JSON.
- **The HF folder is gathered one bounded file at a time**: a full tensor is gathered for one
  parameter at a time (every rank takes part, rank 0 keeps it) and rank 0 holds at most one
  safetensors file's tensors (``max_shard_bytes``, or one larger tensor) before writing it.

Layout of a checkpoint folder ``root`` (the parts this module writes)::

    root/
      trainer.json           format, step, version, world size, the original model dir and the
                             optimizer's param_groups (parameters by name) — rank 0
      dcp/.metadata          DCP's index of every tensor and the slices each file holds
      dcp/__<r>_0.distcp     rank r's shards: "model.<fqn>", "optimizer.state.<fqn>.<key>"
      rng/rank<r>.pt         rank r's RNG: {"cpu": ..., "cuda": ... when cuda is available}
      model/                 (``write_hf_folder``) config, model[-0000i-of-0000n].safetensors
                             [+ model.safetensors.index.json], the original's tokenizer files

The old single-process format, still loaded: ``root/model`` (an HF folder) and ``root/trainer.pt``
(``{"optimizer": optimizer.state_dict(), "step", "version", "rng"}``, parameters by index).
A rank with no saved RNG (a world larger than the one saved, or an old checkpoint's ranks > 0)
keeps the RNG it has.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from shunter.engine.io.checkpoint import CheckpointError

FORMAT = "shunter-dcp-1"
STATE_FILE = "trainer.json"
DCP_DIR = "dcp"
RNG_DIR = "rng"
OLD_STATE = "trainer.pt"
MODEL_DIR = "model"
INDEX_FILE = "model.safetensors.index.json"
MAX_SHARD_BYTES = 1 << 30
_METADATA = ".metadata"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
T = TypeVar("T")


class ShardStateError(CheckpointError):
    """A trainer state that cannot be saved or loaded; the message names the file and the checkpoint."""


# -- the process group --------------------------------------------------------------------
def _grouped() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _grouped() else 0


def _world() -> int:
    return dist.get_world_size() if _grouped() else 1


@contextmanager
def _one_process_quiet() -> Iterator[None]:
    """DCP warns that it assumes one process whenever there is no group: that is our intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _agreed(fn: Callable[[], T]) -> T:
    """``fn()`` on every rank; when it raises on any rank, every rank raises (the first failed
    rank's message, with its rank). One all-gather: no rank waits for one that gave up."""
    out: T | None = None
    err: str | None = None
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - carried to every rank, then raised there
        err = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
    if _grouped():
        errors: list[str | None] = [None] * _world()
        dist.all_gather_object(errors, err)
        failed = [(r, m) for r, m in enumerate(errors) if m is not None]
        if failed:
            r, m = failed[0]
            raise ShardStateError(m if _world() == 1 else f"{m} (rank {r})")
    elif err is not None:
        raise ShardStateError(err)
    return out  # type: ignore[return-value]


# -- RNG ----------------------------------------------------------------------------------
def _rng_state() -> dict[str, torch.Tensor]:
    st = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def _set_rng(st: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(st["cpu"].cpu())
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"].cpu())


def _load_rng(root: Path, rank: int) -> None:
    path = root / RNG_DIR / f"rank{rank}.pt"
    if not path.is_file():
        return  # a rank the saved world did not have keeps its own RNG
    try:
        st = torch.load(path, map_location="cpu", weights_only=True)
        _set_rng(st)
    except Exception as e:  # noqa: BLE001 - name the file
        raise ShardStateError(
            f"checkpoint {root}: {path.relative_to(root)} does not load: {type(e).__name__}: {e}"
        ) from None


# -- save ---------------------------------------------------------------------------------
def save_state(
    root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, step: int, version: int, model_dir: str
) -> int:
    """Write the model and optimizer (DCP, each rank its shards), every rank's RNG and (rank 0)
    the step and version under ``root``. Collective when a process group exists. Returns the
    bytes of everything under ``root`` once written (the same on every rank)."""
    root = Path(root)
    rank = _rank()
    msd, osd = get_state_dict(model, optimizer)
    groups = osd.pop("param_groups")

    def local() -> None:
        (root / RNG_DIR).mkdir(parents=True, exist_ok=True)
        torch.save(_rng_state(), root / RNG_DIR / f"rank{rank}.pt")
        if rank == 0:
            state = {
                "format": FORMAT,
                "step": int(step),
                "version": int(version),
                "world_size": _world(),
                "model_dir": str(model_dir),
                "param_groups": groups,
            }
            (root / STATE_FILE).write_text(json.dumps(state, indent=1))

    _agreed(local)
    try:
        with _one_process_quiet():
            dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=root / DCP_DIR, no_dist=not _grouped())
    except Exception as e:  # noqa: BLE001 - DCP's error carries every failed rank's
        raise ShardStateError(f"checkpoint {root}: {DCP_DIR}/ was not written: {_first_line(e)}") from e
    # counted between two agreements: every rank's files closed before any rank counts, and no rank
    # goes on to write more (a caller's next file) while another still counts — they differed under load
    _agreed(lambda: None)
    nbytes = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    _agreed(lambda: None)
    return nbytes


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0] if len(text) < 2000 else text[:2000]


# -- load ---------------------------------------------------------------------------------
_METADATA_CLASSES = {  # what DCP's .metadata holds (torch 2.13): its dataclasses, paths, dtypes
    ("torch.distributed.checkpoint.metadata", n)
    for n in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a lookup in a table of torch's layouts
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` without running anything but DCP's own metadata classes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and not name.startswith("_"):
            found = getattr(torch, name, None)
            if isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not a DCP metadata class")


class _Reader(dcp.FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = Path(self.path) / _METADATA
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp.metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _check_files(root: Path) -> dict[str, Any]:
    """The state file, and the DCP files as its metadata says they are (present, long enough)."""
    state_path = root / STATE_FILE
    try:
        state = json.loads(state_path.read_text())
        step, version = int(state["step"]), int(state["version"])
        if state.get("format") != FORMAT:
            raise ValueError(f"format {state.get('format')!r}, expected {FORMAT!r}")
    except Exception as e:  # noqa: BLE001 - name the file
        raise ShardStateError(f"checkpoint {root}: {STATE_FILE} does not load: {type(e).__name__}: {e}") from None
    meta_path = root / DCP_DIR / _METADATA
    if not meta_path.is_file():
        raise ShardStateError(
            f"checkpoint {root}: {DCP_DIR}/{_METADATA} is missing (an unfinished or damaged checkpoint)"
        )
    try:
        metadata = _Reader(root / DCP_DIR).read_metadata()
    except Exception as e:  # noqa: BLE001 - name the file
        raise ShardStateError(
            f"checkpoint {root}: {DCP_DIR}/{_METADATA} does not load: {type(e).__name__}: {e}"
        ) from None
    need: dict[str, int] = {}
    for info in metadata.storage_data.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for rel, size in sorted(need.items()):
        f = root / DCP_DIR / rel
        if not f.is_file():
            raise ShardStateError(f"checkpoint {root}: {DCP_DIR}/{rel} is missing")
        if (got := f.stat().st_size) < size:
            raise ShardStateError(
                f"checkpoint {root}: {DCP_DIR}/{rel} is truncated ({got} bytes, {DCP_DIR}/{_METADATA} says {size})"
            )
    state["step"], state["version"] = step, version
    return state


def _format_of(root: Path) -> str:
    if (root / STATE_FILE).is_file():
        return "dcp"
    if (root / OLD_STATE).is_file():
        return "old"
    raise ShardStateError(
        f"checkpoint {root}: neither {STATE_FILE} nor {OLD_STATE} (not a trainer checkpoint, or a damaged one)"
    )


def _restore_groups(saved: list[dict[str, Any]], optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """JSON's lists back to the tuples the optimizer keeps (``betas``)."""
    out = []
    for g, cur in zip(saved, optimizer.param_groups, strict=False):
        out.append({k: tuple(v) if isinstance(cur.get(k), tuple) and isinstance(v, list) else v for k, v in g.items()})
    return out


def load_state(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """Load model, optimizer and this rank's RNG from ``root`` (this format or the old one) at
    any world size; returns (step, version). Collective when a process group exists."""
    root = Path(root)
    if _agreed(lambda: _format_of(root)) == "old":
        return _load_old(root, model, optimizer)
    state = _agreed(lambda: _check_files(root))
    msd, osd = get_state_dict(model, optimizer)
    osd.pop("param_groups")
    try:
        with _one_process_quiet():
            dcp.load({"model": msd, "optimizer": osd}, storage_reader=_Reader(root / DCP_DIR), no_dist=not _grouped())
    except Exception as e:  # noqa: BLE001 - DCP's error carries every failed rank's
        raise ShardStateError(f"checkpoint {root}: {DCP_DIR}/ does not load: {_first_line(e)}") from e
    osd["param_groups"] = _restore_groups(state["param_groups"], optimizer)
    _agreed(lambda: set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd))
    _agreed(lambda: _load_rng(root, _rank()))
    return state["step"], state["version"]


# -- the old single-process format --------------------------------------------------------
def _read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / INDEX_FILE
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder.name}/ has no model.safetensors nor {INDEX_FILE}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(folder / f))  # memory-mapped
    return out


def _old_state(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict, dict]:
    """(model state by name, optimizer state by name, trainer.pt) — full tensors."""
    try:
        weights = _read_hf_weights(root / MODEL_DIR)
    except Exception as e:  # noqa: BLE001 - name the folder
        raise ShardStateError(f"checkpoint {root}: {MODEL_DIR}/ does not load: {type(e).__name__}: {e}") from None
    try:
        st = torch.load(root / OLD_STATE, map_location="cpu", weights_only=True, mmap=True)
        old = st["optimizer"]
    except Exception as e:  # noqa: BLE001 - name the file
        raise ShardStateError(f"checkpoint {root}: {OLD_STATE} does not load: {type(e).__name__}: {e}") from None
    # the model: every name in its state dict, a tied one from the tensor it shares
    params = dict(model.state_dict(keep_vars=True))
    msd: dict[str, torch.Tensor] = {}
    for name, t in params.items():
        src = name if name in weights else next((n for n, u in params.items() if u is t and n in weights), None)
        if src is None:
            raise ShardStateError(f"checkpoint {root}: {MODEL_DIR}/ has no tensor {name!r}")
        msd[name] = weights[src]
    # the optimizer: index i of group g -> the name of the optimizer's i-th parameter in group g
    names = {id(p): n for n, p in model.named_parameters()}
    state: dict[str, Any] = {}
    groups = []
    saved_sizes = [len(g["params"]) for g in old["param_groups"]]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if saved_sizes != sizes:
        raise ShardStateError(
            f"checkpoint {root}: {OLD_STATE} holds parameter groups of {saved_sizes} parameters, "
            f"the optimizer of {sizes} (another model)"
        )
    for g_old, g_cur in zip(old["param_groups"], optimizer.param_groups, strict=True):
        fqns = [names[id(p)] for p in g_cur["params"]]
        for idx, fqn in zip(g_old["params"], fqns, strict=True):
            if idx in old["state"]:
                state[fqn] = dict(old["state"][idx])
        groups.append({**g_old, "params": fqns})
    return msd, {"state": state, "param_groups": groups}, st


def _like(full: torch.Tensor, local: Any) -> Any:
    """``full`` as ``local`` holds it: this rank's slice of a DTensor (cut here, no collective), else whole."""
    if isinstance(local, DTensor):
        return distribute_tensor(full.to(local.device), local.device_mesh, local.placements, src_data_rank=None)
    return full


def _old_as_local(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict, dict]:
    msd, osd, st = _old_state(root, model, optimizer)
    params = dict(model.state_dict(keep_vars=True))
    msd = {k: _like(v, params[k]) for k, v in msd.items()}
    for fqn, s in osd["state"].items():
        osd["state"][fqn] = {k: _like(v, params[fqn]) if torch.is_tensor(v) and v.dim() else v for k, v in s.items()}
    return msd, osd, st


def _load_old(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    # every rank reads the full tensors (memory-mapped: an old checkpoint is one process's) and
    # keeps its own slices; loading them is local, so one rank's failure is every rank's error
    msd, osd, st = _agreed(lambda: _old_as_local(root, model, optimizer))
    _agreed(lambda: set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd))
    _agreed(lambda: torch.set_rng_state(st["rng"].cpu()) if _rank() == 0 else None)
    return int(st["step"]), int(st["version"])


# -- the HF model folder ------------------------------------------------------------------
def _original_class(model: torch.nn.Module) -> type:
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def _unique_state(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The persistent state by name, a tied tensor once (under its first name, as HF saves it)."""
    seen: set[int] = set()
    out = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        out.append((name, t))
    return out


def _plan_files(items: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None, max_bytes: int) -> list[list[int]]:
    files: list[list[int]] = [[]]
    size = 0
    for i, (_, t) in enumerate(items):
        n = t.numel() * (dtype or t.dtype).itemsize
        if files[-1] and size + n > max_bytes:
            files.append([])
            size = 0
        files[-1].append(i)
        size += n
    return files


def write_hf_folder(
    root_model: Path,
    model: torch.nn.Module,
    model_dir: str,
    dtype: torch.dtype | None = None,
    *,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> None:
    """Write the HF model folder of ``model`` (sharded or not) at ``root_model``: config, weights
    with HF names in safetensors files of at most ``max_shard_bytes`` (one larger tensor alone),
    an index when there are several, and the tokenizer / config files of ``model_dir``.
    Collective when a process group exists; rank 0 writes."""
    from safetensors.torch import save_file

    root_model = Path(root_model)
    rank = _rank()
    items = _unique_state(model)
    plan = _plan_files(items, dtype, max_shard_bytes)
    names = (
        ["model.safetensors"]
        if len(plan) == 1
        else [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    )
    failure: list[str] = []  # rank 0's first write error: it keeps taking part in the gathers

    def write(fn: Callable[[], None]) -> None:
        if rank == 0 and not failure:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - raised on every rank at the end
                failure.append(f"{root_model}: {type(e).__name__}: {e}")

    def header() -> None:
        root_model.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(model.config)
        config.architectures = [_original_class(model).__name__]
        config.dtype = str(dtype or items[0][1].dtype).removeprefix("torch.")
        config.save_pretrained(root_model)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(root_model)

    write(header)
    weight_map: dict[str, str] = {}
    total = 0
    for fname, idxs in zip(names, plan, strict=True):
        tensors: dict[str, torch.Tensor] = {}
        for i in idxs:
            name, t = items[i]
            full = t.full_tensor() if isinstance(t, DTensor) else t.detach()
            if rank == 0:
                tensors[name] = (
                    full.detach().to("cpu", dtype=dtype or full.dtype, copy=not isinstance(t, DTensor)).contiguous()
                )
                weight_map[name] = fname
                total += tensors[name].numel() * tensors[name].element_size()
            del full
        write(lambda fname=fname, tensors=tensors: save_file(tensors, root_model / fname, metadata={"format": "pt"}))
        del tensors
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        write(lambda: (root_model / INDEX_FILE).write_text(json.dumps(index, indent=2)))

    def copy_files() -> None:
        for f in Path(model_dir).iterdir():  # tokenizer and friends, as the original model had them
            if (
                f.is_file()
                and not (root_model / f.name).exists()
                and not f.name.endswith(_WEIGHT_SUFFIXES)
                and f.name != INDEX_FILE
            ):
                shutil.copy2(f, root_model / f.name)

    write(copy_files)

    def check() -> None:
        if failure:
            raise ShardStateError(failure[0])

    _agreed(check)
