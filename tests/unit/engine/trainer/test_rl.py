"""RL math on hand-computed cases, and one real trainer step on the tiny model (no Ray)."""

from __future__ import annotations

import math

import pytest
import torch

from shunter.engine.trainer import rl


def test_group_advantages_normalise_within_each_group():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 4.0])
    adv = rl.group_advantages(r, [7, 7, 3, 3, 9, 9])
    # group 7: mean .5, std (unbiased) .7071 -> +-0.7071; group 3: all equal -> 0
    assert torch.allclose(adv[:2], torch.tensor([0.70710, -0.70710]), atol=1e-4)
    assert torch.equal(adv[2:4], torch.zeros(2))
    assert torch.allclose(adv[4:], torch.tensor([-0.70710, 0.70710]), atol=1e-4)
    unscaled = rl.group_advantages(r, [7, 7, 3, 3, 9, 9], scale=False)
    assert torch.allclose(unscaled, torch.tensor([0.5, -0.5, 0, 0, -1.0, 1.0]))


def test_ppo_clip_loss_hand_computed():
    # two tokens; ratios e^0.5 = 1.6487 (clipped to 1.2 for A>0) and e^-0.5 = .6065 (A<0: clip to .8)
    logp = torch.tensor([[0.0, 0.0, 0.0]])
    old = torch.tensor([[-0.5, 0.5, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # third position is padding
    loss, stats = rl.ppo_clip_loss(logp, old, adv, mask, clip=0.2)
    # token 1: min(1.6487*1, 1.2*1) = 1.2 ; token 2: min(.6065*-1, .8*-1) = -.8 ; mean = .2 ; loss = -.2
    assert math.isclose(float(loss), -0.2, abs_tol=1e-5)
    assert stats["pg_clipfrac"] == 1.0


def test_unclipped_ratio_of_one_gives_minus_mean_advantage_and_gradient():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, stats = rl.ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[2.0, -1.0]]), torch.ones(1, 2), clip=0.2)
    assert math.isclose(float(loss.detach()), -0.5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.5]]))  # -A / n_tokens
    assert stats["ratio_mean"] == 1.0


def test_kl_k3_is_zero_at_equality_and_positive_otherwise():
    a = torch.tensor([-1.0, -2.0])
    assert torch.equal(rl.kl_k3(a, a), torch.zeros(2))
    assert (rl.kl_k3(a, a + 0.3) > 0).all()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from shunter.engine.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", sft_steps=0))


def test_trainer_step_changes_weights_and_publish_round_trips(model_dir):
    from safetensors.torch import load

    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer
    from shunter.events import Sample

    tr = Trainer(
        TrainerConfig(ppo_mini_batch_size=4, parameter_sync_step=1, train_batch_size=4, lr=1e-2, kl_coef=0.1), model_dir
    )
    tr.setup()
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    samples = [
        Sample(
            sample_id=f"0.{i}",
            group_id=0,
            prompt_id=0,
            prompt_token_ids=[29, 31, 30, 40],
            token_ids=[29, 30, 0][: 1 + i % 3],
            logprobs=[-3.7] * (1 + i % 3),
            versions=[0] * (1 + i % 3),
            max_tokens=4,
            reward=float(i),
        )
        for i in range(4)
    ]
    m = tr.train_step(samples)
    assert tr.step == 1 and m["batch/reward_mean"] == 1.5 and m["batch/staleness_max"] == 0.0
    assert "trainer/kl" in m and math.isfinite(m["trainer/loss"])
    changed = [k for k, v in tr.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed
    blob = tr.publish()
    assert tr.version == 1
    loaded = load(blob)
    assert torch.equal(loaded["model.embed_tokens.weight"], tr.model.state_dict()["model.embed_tokens.weight"])


def test_each_publish_carries_the_weights_of_that_moment_through_in_place_steps_and_offloads(model_dir):
    """The trainer keeps its list of tensors to publish between publishes; whatever changed
    since — an in-place optimizer step, every tensor moved to new memory (an offload and
    onload) — the payload is the live weights."""
    from safetensors.torch import load

    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer

    tr = Trainer(TrainerConfig(), model_dir)
    tr.setup()

    def live():
        return {k: v.detach().clone() for k, v in tr.model.state_dict().items()}

    def same(blob, want):
        got = load(blob)
        return set(got) <= set(want) and all(torch.equal(v, want[k]) for k, v in got.items())

    assert same(tr.publish(), live())
    with torch.no_grad():
        for p in tr.model.parameters():
            p.add_(1.0)  # in place, as an optimizer step
    assert same(tr.publish(), live())
    for p in tr.model.parameters():
        p.data = p.data.clone()  # new memory for every tensor, as an offload and onload give on GPU
    with torch.no_grad():
        next(tr.model.parameters()).mul_(-1.0)
    assert same(tr.publish(), live())


def test_missing_model_dir_names_the_folder(tmp_path):
    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import ModelDirError, Trainer

    with pytest.raises(ModelDirError, match="no config.json"):
        Trainer(TrainerConfig(), str(tmp_path / "nope")).setup()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ModelDirError, match="does not load"):
        Trainer(TrainerConfig(), str(tmp_path / "broken")).setup()


def test_trainer_scores_the_tempered_distribution_the_rollout_sampled_from(model_dir):
    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer
    from shunter.events import Sample

    tr = Trainer(TrainerConfig(), model_dir, temperature=0.5)
    tr.setup()
    s = Sample(
        sample_id="0.0",
        group_id=0,
        prompt_id=0,
        prompt_token_ids=[29, 31, 40],
        token_ids=[29, 31],
        logprobs=[0.0, 0.0],
        versions=[0, 0],
        max_tokens=2,
    )
    b = tr.collate([s])
    with torch.no_grad():
        got = tr.stepper.logp(tr.model, b)[0, 2:4]
        logits = tr.model(input_ids=b["ids"]).logits[0]
        want = torch.log_softmax(logits / 0.5, -1)[[2, 3], [29, 31]]
    assert torch.allclose(got, want, atol=1e-5)


def test_micro_batches_take_the_same_step_as_the_whole_batch(model_dir):
    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer
    from shunter.events import Sample

    samples = [
        Sample(
            sample_id=f"{i // 3}.{i % 3}",
            group_id=i // 3,
            prompt_id=i // 3,
            prompt_token_ids=[29, 31, 30, 40][: 2 + i % 3],
            token_ids=[29, 30, 31, 0][: 1 + i % 4],
            logprobs=[-3.7] * (1 + i % 4),
            versions=[0] * (1 + i % 4),
            max_tokens=4,
            reward=float(i % 3),
        )
        for i in range(9)
    ]
    params = []
    for micro in (0, 2, 4):
        tr = Trainer(
            TrainerConfig(
                ppo_mini_batch_size=9,
                parameter_sync_step=1,
                train_batch_size=9,
                lr=1e-2,
                kl_coef=0.1,
                micro_batch_size=micro,
            ),
            model_dir,
        )
        tr.setup()
        m = tr.train_step(samples)
        # the accumulated gradient is left on the parameters after the step
        params.append((m["trainer/loss"], m["trainer/grad_norm"], [p.grad.clone() for p in tr.model.parameters()]))
    for loss, norm, ps in params[1:]:
        assert loss == pytest.approx(params[0][0], rel=1e-4) and norm == pytest.approx(params[0][1], rel=1e-4)
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(ps, params[0][2], strict=True))


def test_head_logprobs_in_chunks_equal_the_full_logits_path_in_value_and_gradient():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(37, 8, generator=g, requires_grad=True)
    weight = torch.randn(50, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (37,), generator=g)
    want = rl.token_logprobs((hidden @ weight.T) / 0.7, targets)
    got = rl.head_logprobs(hidden, weight, None, targets, 1 / 0.7, budget_bytes=50 * 12 * 5)  # chunks of 5
    assert torch.allclose(got, want, atol=1e-5)
    gw, gh = torch.autograd.grad(want.sum(), (weight, hidden))
    cw, ch = torch.autograd.grad(got.sum(), (weight, hidden))
    assert torch.allclose(cw, gw, atol=1e-5) and torch.allclose(ch, gh, atol=1e-5)


def test_trainer_logprobs_of_response_tokens_match_the_full_forward_and_its_gradient(model_dir):
    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.scoring import plain_head
    from shunter.engine.trainer.trainer import Trainer
    from shunter.events import Sample

    tr = Trainer(TrainerConfig(), model_dir, temperature=0.8)
    tr.setup()
    assert plain_head(tr.model)[0] is not None  # the memory-lean path is the one tested
    samples = [
        Sample(
            sample_id=f"0.{i}",
            group_id=0,
            prompt_id=0,
            prompt_token_ids=[29, 31, 40][: 2 + i % 2],
            token_ids=[29, 31, 30][: 1 + i],
            logprobs=[0.0] * (1 + i),
            versions=[0] * (1 + i),
            max_tokens=3,
        )
        for i in range(3)
    ]
    b = tr.collate(samples)
    got = tr.stepper.logp(tr.model, b)
    full = torch.log_softmax(tr.model(input_ids=b["ids"], attention_mask=b["attn"]).logits[:, :-1] / 0.8, -1)
    want = full.gather(-1, b["ids"][:, 1:, None]).squeeze(-1) * b["mask"]
    assert torch.allclose(got, want, atol=1e-5) and float(got.detach()[b["mask"] == 0].abs().sum()) == 0.0
    params = [p for p in tr.model.parameters() if p.requires_grad]
    g_got = torch.autograd.grad(got.sum(), params, allow_unused=True)
    g_want = torch.autograd.grad(want.sum(), params, allow_unused=True)
    for a, w in zip(g_got, g_want, strict=True):
        assert (a is None and w is None) or torch.allclose(a, w, atol=1e-5)
