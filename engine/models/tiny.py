"""Build a tiny HF-format Qwen2 policy (42-symbol character vocab) offline, in seconds.

Invariant: a model dir this module wrote is complete or absent, never half-written. The
model is built in a temp dir next to ``out_dir``, its ``shunter_model.json`` marker
(the exact build parameters) is written last and atomically, and the dir is renamed
into place under a file lock. A dir whose marker matches is reused as is; anything else
at ``out_dir`` (no marker, a stale or unreadable one) is replaced by a fresh build.

The tokenizer maps one symbol to one id and adds no special tokens on encode (no BOS,
no EOS); the eos token ``<|endoftext|>`` (id 0) ends a response, ``<|pad|>`` is id 1.
Characters outside the vocab are dropped silently (the BPE has no unk token). Note that
transformers 5 ``AutoTokenizer`` loads this dir as ``Qwen2Tokenizer`` (model_type qwen2),
which swaps in Qwen's regex pre-tokenizer and an NFC normalizer; with single-symbol
tokens and no merges the ids are the same either way.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import string
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shunter.engine.tasks.base import Task, TaskPrompt, load_task
from shunter.engine.tasks.sort_digits import SEPARATOR

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# torch, tokenizers and transformers are imported by the functions that build or score a model,
# never at import: a run whose model is already built checks its marker without them (they cost
# the CLI's driver ~7 s of a 2-core machine before Ray starts, and memory it never uses).

EOS, PAD = "<|endoftext|>", "<|pad|>"
SYMBOLS = [EOS, PAD, *string.ascii_lowercase, *string.digits, "+", "=", ">", ","]
MARKER = "shunter_model.json"
FORMAT_VERSION = 2  # 2: the tokenizer has a chat template
SFT_SEED_OFFSET = 1_000_003  # SFT prompts come from train stream seed + this, not an RL seed
SFT_BATCH, SFT_LR = 64, 1e-3
BUILD_THREADS = 1  # the model is tiny; 2+ OpenMP threads crawl (30x) when the CPU is shared
ARCH = dict(
    vocab_size=len(SYMBOLS),
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=512,
    max_position_embeddings=256,
)
# Architectures by name. "tiny" is the CPU policy; "qwen2-0.5b" is Qwen2-0.5B's shape with
# random weights (same 42-symbol tokenizer; ids the tokenizer lacks decode to nothing), for
# GPU throughput and weight-sync measurements — it is not expected to learn the task; "qwen2-7b"
# is Qwen2-7B's shape the same way: ~7.6B parameters, 16 bytes each with fp32 AdamW (~122 GB), more
# than one 80 GB GPU can train and what a sharded trainer (trainer.world_size) spreads over its ranks.
PRESETS = {
    "tiny": ARCH,
    "qwen2-0.5b": dict(
        vocab_size=151_936,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        max_position_embeddings=4096,
    ),
    "qwen2-7b": dict(
        vocab_size=152_064,
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18_944,
        max_position_embeddings=4096,
    ),
}
MODEL_FILES = {
    MARKER,
    f"{MARKER}.part",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
}
assert len(SYMBOLS) == 42


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}" + SEPARATOR + "{% endif %}"
)
"""The tiny vocab has no room for role markers: a chat renders as its messages' contents, then
the task's separator as the generation prompt — ``[{"role": "user", "content": "31942"}]``
renders as ``"31942>"``, the sort task's own prompt, so the CPU path exercises the template."""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges over the 42 symbols; encode adds nothing; a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE({s: i for i, s in enumerate(SYMBOLS)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (EOS, PAD)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS, pad_token=PAD, add_bos_token=False, add_eos_token=False
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _arch(preset: str) -> dict[str, int]:
    """The architecture of a named preset; an unknown name fails, naming the known ones."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known: {sorted(PRESETS)}")
    return PRESETS[preset]


def build_config(preset: str = "tiny") -> Qwen2Config:
    arch = _arch(preset)
    from transformers import Qwen2Config

    return Qwen2Config(
        **arch,
        tie_word_embeddings=True,
        eos_token_id=0,
        pad_token_id=1,
        bos_token_id=None,
        dtype="float32" if preset == "tiny" else "bfloat16",
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.decode(ids) != text:
        raise ValueError(f"text {text!r} uses symbols outside the tiny vocab")
    return ids


def sft(model: Qwen2ForCausalLM, tokenizer: Any, prompts: Iterator[TaskPrompt], steps: int) -> list[float]:
    """Teacher-forced warm start; loss only on the answer tokens and the final eos."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR)
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        rows = [
            (_encode(tokenizer, p.text), _encode(tokenizer, p.demo or p.answer) + [0])
            for p in islice(prompts, SFT_BATCH)
        ]
        width = max(len(a) + len(b) for a, b in rows)
        ids = torch.full((len(rows), width), 1, dtype=torch.long)
        target_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, (a, b) in enumerate(rows):
            ids[r, : len(a) + len(b)] = torch.tensor(a + b)
            target_mask[r, len(a) : len(a) + len(b)] = True
        logits = model(input_ids=ids, attention_mask=(ids != 1).long()).logits[:, :-1]
        mask = target_mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[mask], ids[:, 1:][mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def score(
    model: Any,
    tokenizer: Any,
    task: Task,
    prompts: list[TaskPrompt],
    *,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 12,
) -> tuple[float, float]:
    """(mean reward, exact-match fraction) of HF ``generate``; temperature 0 is greedy."""
    import torch

    rewards: list[float] = []
    exact = 0
    by_len: dict[int, list[TaskPrompt]] = {}
    for p in prompts:  # equal-length batches need no padding
        by_len.setdefault(len(_encode(tokenizer, p.text)), []).append(p)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for group in by_len.values():
            ids = torch.tensor([_encode(tokenizer, p.text) for p in group])
            sampling: dict[str, Any] = dict(do_sample=False)
            if temperature > 0:
                sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                eos_token_id=0,
                pad_token_id=1,
                **sampling,
            )
            for p, row in zip(group, out[:, ids.shape[1] :].tolist(), strict=True):
                row = row[: row.index(0)] if 0 in row else row
                response = tokenizer.decode(row, skip_special_tokens=True)
                rewards.append(task.reward(p.text, response, p.answer))
                exact += response.strip() == p.answer
    return sum(rewards) / len(rewards), exact / len(rewards)


def read_marker(out_dir: str | Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(out_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _is_built(out_dir: Path, params: dict[str, Any]) -> bool:
    marker = read_marker(out_dir)
    return marker is not None and marker.get("params") == params and (out_dir / "model.safetensors").is_file()


@contextmanager
def _locked(out_dir: Path) -> Iterator[None]:
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_replaceable(out_dir: Path) -> None:
    """Only ever replace an empty dir or one holding nothing but model files; never a user's dir."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir} exists and is not a directory")
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in MODEL_FILES or not p.is_file())
    if foreign:
        raise FileExistsError(f"refusing to replace {out_dir}: not a tiny-model dir (has {', '.join(foreign[:5])})")


def _build_into(tmp: Path, task_name: str, seed: int, sft_steps: int, preset: str = "tiny") -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    task, tokenizer = load_task(task_name), build_tokenizer()
    torch.manual_seed(seed)
    if preset == "tiny":
        model = Qwen2ForCausalLM(build_config())
        losses = sft(model, tokenizer, task.train_prompts(SFT_SEED_OFFSET + seed), sft_steps)
    else:  # random init in bf16, on the GPU when there is one (seconds instead of minutes)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = Qwen2ForCausalLM(build_config(preset)).to(torch.bfloat16)
        losses = []
    model.generation_config = GenerationConfig(eos_token_id=0, pad_token_id=1)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return {"n_parameters": sum(p.numel() for p in model.parameters()), "sft_losses": [round(x, 4) for x in losses]}


def build_params(
    task: str = "sort_digits", *, seed: int = 0, sft_steps: int = 25, preset: str = "tiny"
) -> dict[str, Any]:
    """What a build depends on, as its marker records it: a dir whose marker holds the same is reused."""
    arch = _arch(preset)
    params = {"format": FORMAT_VERSION, "task": task, "seed": int(seed), "sft_steps": int(sft_steps), "arch": arch}
    revision = getattr(load_task(task), "revision", None)  # a task whose problems changed says so
    if revision is not None:
        params["task_revision"] = revision
    return params


def build_tiny_model(
    out_dir: str | Path,
    task: str = "sort_digits",
    *,
    seed: int = 0,
    sft_steps: int = 25,
    force: bool = False,
    preset: str = "tiny",
) -> Path:
    """Build (or reuse) the warm-started tiny model at ``out_dir`` (or, with another
    ``preset``, a random-init model of that shape); returns the path."""
    out_dir = Path(out_dir).expanduser().absolute()
    params = build_params(task, seed=seed, sft_steps=sft_steps, preset=preset)
    if not force and _is_built(out_dir, params):
        return out_dir
    _check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out_dir):
        if not force and _is_built(out_dir, params):  # a concurrent builder finished first
            return out_dir
        _check_replaceable(out_dir)
        for kind in ("tmp", "old"):  # leftovers of crashed builds; safe to drop under the lock
            for stale in out_dir.parent.glob(f".{out_dir.name}.{kind}-*"):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it 0700; the model dir should be a normal dir
        import torch

        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(BUILD_THREADS)
            start = time.perf_counter()
            info = _build_into(tmp, task, int(seed), int(sft_steps), preset)
            info.update(params=params, build_seconds=round(time.perf_counter() - start, 3), built_at=time.time())
            (tmp / f"{MARKER}.part").write_text(json.dumps(info, indent=1))
            os.replace(tmp / f"{MARKER}.part", tmp / MARKER)
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            if out_dir.exists():
                os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            torch.set_num_threads(threads)
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m shunter.engine.models.tiny", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--task", default="sort_digits")
    ap.add_argument("--sft-steps", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--samples", type=int, default=256, help="prompts for the sampled-reward estimate")
    args = ap.parse_args(argv)
    before = read_marker(args.out_dir)
    path = build_tiny_model(
        args.out_dir, args.task, seed=args.seed, sft_steps=args.sft_steps, force=args.force, preset=args.preset
    )
    marker = read_marker(path) or {}
    reused = before is not None and before.get("built_at") == marker.get("built_at")
    print(
        f"{'reused' if reused else 'built'} {path}: {marker.get('n_parameters')} params, "
        f"sft_steps={args.sft_steps}, seed={args.seed}, build {marker.get('build_seconds')}s"
    )
    if args.preset != "tiny":
        return
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.set_num_threads(BUILD_THREADS)
    task = load_task(args.task)
    model = Qwen2ForCausalLM.from_pretrained(path).eval()
    prompts = task.validation_prompts(args.samples, seed=args.seed)
    mean, exact = score(model, AutoTokenizer.from_pretrained(path), task, prompts, temperature=1.0)
    print(f"sampled reward @T=1 over {len(prompts)} held-out prompts: {mean:.3f} (exact {exact:.3f})")


if __name__ == "__main__":
    main()
