"""Standalone smoke check of ``shunter.actors.vllm.backend`` on this machine.

Invariant it checks: whatever ``VLLMBackend`` returns agrees with a plain HF
transformers forward pass of the same weights -- greedy tokens exactly, and
per-token log-probs within 1e-3 -- before and after ``load_weights``, across
an abort + resume, and across sleep/wake.

Run by tests/e2e/test_vllm_backend.py in its own process (vLLM engines start with spawn),
or by hand:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 \
        .venv/bin/python tests/e2e/vllm_backend_check.py

Exit status 0 iff every check passed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

EOS_ID, PAD_ID = 0, 1
TP = int(os.environ.get("SHUNTER_CHECK_TP", "1"))
"""The engine's ``tensor_parallel_size`` (``test_vllm_backend.py`` runs the checks at 1 and 2: at 2
every load must reach both worker processes, the weight group's through the first one)."""


def build_tiny_model(out_dir: Path, seed: int = 0) -> None:
    from shunter.engine.models.tiny import build_tiny_model as build

    build(out_dir, seed=seed, sft_steps=0)


FAILS: list[str] = []


class HFRef:
    """The same weights in plain HF transformers: the reference every check compares to."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        """n argmax steps (eos ignored) and the log-prob of each chosen token."""
        torch = self.torch
        ids, out, lps = list(prompt), [], []
        with torch.no_grad():
            for _ in range(n):
                lp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0, -1].float(), -1)
                t = int(lp.argmax())
                out.append(t)
                lps.append(float(lp[t]))
                ids.append(t)
        return out, lps

    def hf_generate(self, prompt: list[int], n: int) -> list[int]:
        torch = self.torch
        with torch.no_grad():
            full = self.model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=n, eos_token_id=EOS_ID, pad_token_id=PAD_ID
            )
        return full[0, len(prompt) :].tolist()

    def perturb_(self, seed: int) -> None:
        torch = self.torch
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _copy_plan_fit(worker, blob: bytes) -> tuple[int, int, int, bool]:
    """In vLLM's worker: the HF embedding's rows, vLLM's (padded) ones, the rows of one fused
    linear weight, and whether ``engine.weights.copy_plan`` builds a plan for these weights."""
    from safetensors.torch import load

    from shunter.engine.weights import copy_plan

    params = dict(worker.model_runner.get_model().named_parameters())
    items = [(n, tuple(t.shape)) for n, t in load(blob).items()]
    emb = dict(items)["model.embed_tokens.weight"][0]
    return (
        emb,
        params["model.embed_tokens.weight"].shape[0],
        params["model.layers.0.self_attn.qkv_proj.weight"].shape[0],
        copy_plan.build(params, items) is not None,
    )


def check(cond: bool, what: str) -> None:
    print(("  ok   " if cond else "  FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=False)), default=0.0)


async def run(model_dir: Path) -> None:
    from shunter.actors.vllm.backend import VLLMBackend
    from shunter.actors.vllm.engine import BackendStartError, EngineSpec
    from shunter.engine.replica.backend import GenParams
    from shunter.engine.trainer.publish import state_dict_to_blob

    print(
        f"env: VLLM_ENABLE_V1_MULTIPROCESSING={os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING')} "
        f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')}"
    )
    ref = HFRef(model_dir)
    # 41 tokens: longer than one 32-token KV block, so prefix caching has a
    # full block to (wrongly) reuse after a weight update if not invalidated.
    prompt = ref.tok("12+34=46,7+8=15,abc>cba,99+1=100,hello>o", add_special_tokens=False)["input_ids"]
    assert len(prompt) > 32 and all(0 <= t < 42 for t in prompt), prompt

    print("[missing model dir]")
    try:
        await VLLMBackend(EngineSpec(model_dir=str(model_dir / "nope"))).start()
        check(False, "start() on a missing dir raises")
    except BackendStartError as e:
        check(str(model_dir / "nope") in str(e), f"start() on a missing dir raises naming it: {e}")

    print("[broken model dir]")
    broken = model_dir / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    try:
        await VLLMBackend(EngineSpec(model_dir=str(broken))).start()
        check(False, "start() on a broken dir raises")
    except BackendStartError as e:
        check(str(broken) in str(e), f"start() on a broken dir raises naming it: {str(e)[:160]}")

    spec = EngineSpec(
        model_dir=str(model_dir),
        seed=0,
        max_model_len=256,
        max_num_seqs=16,
        tensor_parallel_size=TP,
        extra={"dtype": "float32", "block_size": 32},
    )
    be = VLLMBackend(spec)
    t0 = time.perf_counter()
    await be.start()
    t_start = time.perf_counter() - t0
    print(f"[start] {t_start:.2f}s ({', '.join(f'{k}={v:.2f}s' for k, v in be.timings.items())})")

    greedy = GenParams(max_tokens=48, temperature=0.0, ignore_eos=True)

    print("[greedy vs HF]")
    r = await be.generate("g0", prompt, greedy)
    want, want_lp = ref.greedy(prompt, 48)
    check(r.finish_reason == "length", f"finish_reason length ({r.finish_reason})")
    check(r.token_ids == want, f"greedy tokens equal HF ({len(r.token_ids)} tokens)")
    check(len(r.logprobs) == len(r.token_ids), "one logprob per token")
    d = max_abs_diff(r.logprobs, want_lp)
    check(d < 1e-3, f"greedy logprobs within 1e-3 of HF (max diff {d:.2e})")
    print("    vllm:", ref.tok.decode(r.token_ids))

    print("[eos handling vs HF generate]")
    r_eos = await be.generate("g1", prompt, GenParams(max_tokens=48, temperature=0.0))
    want_gen = ref.hf_generate(prompt, 48)
    check(r_eos.token_ids == want_gen, f"no-ignore_eos tokens equal HF generate ({len(want_gen)} tokens)")
    if want_gen and want_gen[-1] == EOS_ID:
        check(r_eos.finish_reason == "stop", f"stops at eos ({r_eos.finish_reason})")
    else:
        check(r_eos.finish_reason == "length", f"no eos within budget -> length ({r_eos.finish_reason})")

    print("[stop_token_ids]")
    stop_tok = want[5]
    first = want.index(stop_tok)
    r_stop = await be.generate(
        "g2", prompt, GenParams(max_tokens=48, temperature=0.0, ignore_eos=True, stop_token_ids=(stop_tok,))
    )
    check(r_stop.finish_reason == "stop", f"stop_token_ids -> stop ({r_stop.finish_reason})")
    check(
        r_stop.token_ids == want[: first + 1],
        f"stops at first stop token, stop token included ({len(r_stop.token_ids)})",
    )

    print("[sampling: temperature 1 logprobs match HF at sampled tokens]")
    r_s = await be.generate("s0", prompt, GenParams(max_tokens=24, temperature=1.0, seed=123, ignore_eos=True))
    import torch

    with torch.no_grad():
        full = torch.tensor([prompt + r_s.token_ids])
        lp = torch.log_softmax(ref.model(full).logits[0].float(), -1)
        hf_lp = [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(r_s.token_ids)]
    d = max_abs_diff(r_s.logprobs, hf_lp)
    check(len(r_s.token_ids) == 24 and d < 1e-3, f"T=1 sampled-token logprobs within 1e-3 (max diff {d:.2e})")
    r_s2 = await be.generate("s1", prompt, GenParams(max_tokens=24, temperature=1.0, seed=123, ignore_eos=True))
    check(r_s2.token_ids == r_s.token_ids, "same seed -> same sample")
    r_t = await be.generate("s2", prompt, GenParams(max_tokens=24, temperature=0.7, seed=5, top_k=0, ignore_eos=True))
    with torch.no_grad():
        full = torch.tensor([prompt + r_t.token_ids])
        lp = torch.log_softmax(ref.model(full).logits[0].float() / 0.7, -1)
        hf_lp = [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(r_t.token_ids)]
    d = max_abs_diff(r_t.logprobs, hf_lp)
    check(d < 1e-3, f"T=0.7 logprobs are of the tempered distribution (max diff {d:.2e})")
    r_k = await be.generate("s3", prompt, GenParams(max_tokens=8, temperature=1.0, top_k=-1, top_p=0.9, seed=1))
    check(len(r_k.token_ids) >= 1, "top_k=-1 / top_p accepted")

    print("[abort + resume]")
    full_greedy = GenParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    uninterrupted = await be.generate("u0", prompt, full_greedy)
    partial = None
    for i, delay in enumerate([0.15, 0.08, 0.04, 0.02, 0.01, 0.005, 0.3, 0.6]):
        rid = f"a{i}"
        task = asyncio.create_task(be.generate(rid, prompt, full_greedy))
        await asyncio.sleep(delay)
        t_abort = time.perf_counter()
        await be.abort([rid])
        res = await task
        t_ret = time.perf_counter() - t_abort
        print(
            f"    delay {delay}: {res.finish_reason} after {len(res.token_ids)} tokens "
            f"(returned {t_ret * 1e3:.1f} ms after abort)"
        )
        if res.finish_reason == "abort" and 0 < len(res.token_ids) < 64:
            partial = res
            break
    check(partial is not None, "abort returns a partial result with finish_reason 'abort'")
    if partial is not None:
        check(
            len(partial.logprobs) == len(partial.token_ids) > 0,
            f"partial has {len(partial.token_ids)} tokens + logprobs",
        )
        k = len(partial.token_ids)
        check(
            partial.token_ids == uninterrupted.token_ids[:k], "partial tokens are a prefix of the uninterrupted output"
        )
        res2 = await be.generate(
            "resume0", prompt + partial.token_ids, GenParams(max_tokens=64 - k, temperature=0.0, ignore_eos=True)
        )
        check(
            partial.token_ids + res2.token_ids == uninterrupted.token_ids,
            "resumed continuation == uninterrupted greedy",
        )
        d = max_abs_diff(partial.logprobs + res2.logprobs, uninterrupted.logprobs)
        check(d < 1e-3, f"resumed logprobs match uninterrupted (max diff {d:.2e})")
    await be.abort(["never-submitted", "u0"])  # unknown / finished ids are no-ops
    check(True, "abort of unknown/finished ids is a no-op")

    print("[abort before the engine sees the request]")
    task = asyncio.create_task(be.generate("early", prompt, full_greedy))
    await asyncio.sleep(0)  # generate() registered the id, vLLM maybe not yet
    await be.abort(["early"])
    res = await task
    check(
        res.finish_reason == "abort" and len(res.token_ids) < 64, f"early abort honoured ({len(res.token_ids)} tokens)"
    )

    print("[duplicate in-flight id rejected]")
    task = asyncio.create_task(be.generate("dup", prompt, full_greedy))
    await asyncio.sleep(0.01)
    try:
        await be.generate("dup", prompt, full_greedy)
        check(False, "duplicate id raises")
    except ValueError:
        check(True, "duplicate in-flight id raises ValueError")
    await be.abort(["dup"])
    await task

    print("[load_weights: perturbed, blob with both tied names]")
    from safetensors.torch import save as st_save

    ref.perturb_(seed=1)
    sd = ref.model.state_dict()
    both = {k: v.detach().clone().contiguous() for k, v in sd.items()}  # clone breaks sharing
    check("lm_head.weight" in both and "model.embed_tokens.weight" in both, "HF state_dict has both tied names")
    blob = st_save(both)
    dt = await be.load_weights(blob)
    print(f"    load_weights {dt * 1e3:.1f} ms for {len(blob) / 1e6:.2f} MB")
    check(
        be.last_load.get("salted") == 1.0,
        "requests are salted by weight epoch (the repeated prompt below can only miss the old blocks)",
    )
    r2 = await be.generate("w1", prompt, greedy)
    want2, want2_lp = ref.greedy(prompt, 48)
    check(r2.token_ids != r.token_ids, "greedy output changed after load_weights")
    check(r2.token_ids == want2, "greedy tokens equal HF with new weights")
    d = max_abs_diff(r2.logprobs, want2_lp)
    check(d < 1e-3, f"logprobs within 1e-3 of HF with new weights (max diff {d:.2e})")

    print("[load_weights: perturbed again, deduplicated blob (embedding only)]")
    ref.perturb_(seed=2)
    blob2 = state_dict_to_blob(ref.model.state_dict())
    from safetensors.torch import load as st_load

    names = set(st_load(blob2))
    check(
        ("lm_head.weight" in names) != ("model.embed_tokens.weight" in names),
        f"dedup blob holds one tied name ({len(names)} tensors)",
    )
    dt2 = await be.load_weights(blob2)
    print(f"    load_weights {dt2 * 1e3:.1f} ms")
    r3 = await be.generate("w2", prompt, greedy)
    want3, want3_lp = ref.greedy(prompt, 48)
    check(
        r3.token_ids == want3 and r3.token_ids != r2.token_ids, "greedy tokens equal HF after 2nd update (and changed)"
    )
    d = max_abs_diff(r3.logprobs, want3_lp)
    check(d < 1e-3, f"logprobs within 1e-3 after 2nd update (max diff {d:.2e})")

    if TP == 1:  # a rank's shard of the padded vocabulary is another layout: the check is of one rank's
        print("[copy plan: refused on a layout it does not know (vLLM CPU repacks its linear weights)]")
        plan_on = await be.engine.require().collective_rpc(_copy_plan_fit, args=(blob2,))
        print(f"    {plan_on[0]}")
        emb, padded, linear_rows, fits = plan_on[0]
        check(padded == 64 and emb == 42, f"vLLM pads the 42-row embedding to 64 rows ({emb} -> {padded})")
        check(linear_rows == 0 and not fits, "no plan where vLLM left no rows in the linear weights (the loader stays)")

    print("[load_weights while a request is in flight]")
    task = asyncio.create_task(
        be.generate("inflight", prompt, GenParams(max_tokens=200, temperature=0.0, ignore_eos=True))
    )
    await asyncio.sleep(0.05)
    ref.perturb_(seed=3)
    dt3 = await be.load_weights(state_dict_to_blob(ref.model.state_dict()))
    res = await task
    check(
        res.finish_reason == "length" and len(res.token_ids) == 200,
        f"in-flight request survives the update ({res.finish_reason}, {len(res.token_ids)})",
    )
    r4 = await be.generate("w3", prompt, greedy)
    want4, want4_lp = ref.greedy(prompt, 48)
    check(
        r4.token_ids == want4 and max_abs_diff(r4.logprobs, want4_lp) < 1e-3,
        f"fresh request after in-flight update matches HF ({dt3 * 1e3:.1f} ms)",
    )

    print("[weight group (gloo, the nccl code path): the flat copy arrives over the group]")
    import torch

    from shunter.engine.weights import transport as wt
    from shunter.engine.weights.group import WeightSender

    pub = wt.FlatPublisher()
    sender = WeightSender("gloo", pub, bucket_bytes=256 << 10, timeout_s=60)
    host, port = sender.open("r0")
    await be.join_weight_group("gloo", host, port, 60.0)
    ref.perturb_(seed=4)
    package = pub.publish(wt.unique_tensors(ref.model.state_dict()), torch.float32, wire=wt.FLAT, version=7)
    check(be.receives(package), "a flat layout is received over the joined group")
    send = asyncio.get_running_loop().run_in_executor(None, sender.send, "r0", 7)
    dt4 = await be.load_weights(package)
    stats = await send
    if TP > 1:
        check(
            be.last_load.get("ranks") == TP and "fan_out_s" in be.last_load,
            f"the first of {TP} ranks received and handed the bytes on ({be.last_load})",
        )
    r6 = await be.generate("g1", prompt, greedy)
    want6, want6_lp = ref.greedy(prompt, 48)
    check(
        r6.token_ids == want6 and r6.token_ids != want4,
        "greedy tokens equal HF after a load over the group (and changed)",
    )
    d = max_abs_diff(r6.logprobs, want6_lp)
    check(
        d < 1e-3,
        f"logprobs within 1e-3 after the group load (max diff {d:.2e}; {stats['buckets']} buckets, {dt4 * 1e3:.1f} ms)",
    )
    sender.close()

    print("[sleep / wake_up]")
    task = asyncio.create_task(be.generate("z0", prompt, GenParams(max_tokens=200, temperature=0.0, ignore_eos=True)))
    await asyncio.sleep(0.05)
    await be.sleep(1)
    res = await task
    check(be.is_sleeping, "is_sleeping after sleep()")
    check(res.finish_reason == "abort", f"sleep aborts in-flight request, keeps partial ({len(res.token_ids)} tokens)")
    try:
        await be.generate("z1", prompt, greedy)
        check(False, "generate while asleep raises")
    except RuntimeError:
        check(True, "generate while asleep raises")
    await be.wake_up()
    check(not be.is_sleeping, "not sleeping after wake_up()")
    r5 = await be.generate("z2", prompt, greedy)
    check(r5.token_ids == want6, "generation after wake_up still matches HF")
    await check_keep(be, ref, prompt, want6)

    t0 = time.perf_counter()
    await be.shutdown()
    print(f"[shutdown] {time.perf_counter() - t0:.2f}s")
    print(f"TIMINGS start={t_start:.2f}s load_weights={dt * 1e3:.1f}/{dt2 * 1e3:.1f}/{dt3 * 1e3:.1f} ms")


async def check_keep(be, ref, prompt: list[int], old_greedy: list[int]) -> None:
    """``weight_update = "keep"``'s backend half: a request that has sampled tokens is paused
    with its KV cache, the weights change under it, and it goes on to its full length; vLLM
    labels the tokens after the load with the new version. Ordered by the request's own
    tokens (an observer on the stream), not by a sleep: the pause is sent once 8 of its 200
    tokens exist, and the 192 left take far longer than the pause's round trip."""
    from shunter.engine.replica.backend import GenParams
    from shunter.engine.trainer.publish import state_dict_to_blob

    print("[keep: pause a running request with its KV cache, load, resume]")
    check(be.keeps_kv, "this vLLM pauses with the KV cache and labels weight versions")
    if not be.keeps_kv:
        return
    sampled = asyncio.Event()
    take = be.requests._take

    def observe(comp, tokens: list[int], logprobs: list[float]) -> None:
        take(comp, tokens, logprobs)
        if len(tokens) >= 8:
            sampled.set()

    be.requests._take = observe
    try:
        long = GenParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        task = asyncio.create_task(be.generate("kept", prompt, long))
        await asyncio.wait_for(sampled.wait(), 60)
        await be.pause()
        ref.perturb_(seed=5)
        await be.load_weights(state_dict_to_blob(ref.model.state_dict()))
        await be.resume(9)
        res = await asyncio.wait_for(task, 120)
    finally:
        be.requests._take = take
    check(
        res.finish_reason == "length" and len(res.token_ids) == 200,
        f"the paused request ran to its full length ({res.finish_reason}, {len(res.token_ids)} tokens)",
    )
    split = [k for k, v in res.marks or () if v == 9]
    check(len(split) == 1 and 8 <= split[0] < 200, f"tokens after the load are labelled version 9 (marks {res.marks})")
    k = min(split[0] if split else 0, len(old_greedy))
    check(res.token_ids[:k] == old_greedy[:k], f"the {k} tokens before the load are the old weights' greedy ones")


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # one check sends a function to the worker
    with tempfile.TemporaryDirectory(prefix="tiny_qwen2_") as d:
        model_dir = Path(d)
        build_tiny_model(model_dir)
        asyncio.run(run(model_dir))
    if FAILS:
        print(f"\n{len(FAILS)} check(s) FAILED:")
        for f in FAILS:
            print("  -", f)
        return 1
    print("\nALL CHECKS PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
