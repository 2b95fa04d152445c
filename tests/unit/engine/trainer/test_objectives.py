"""Off-policy objectives (issue 6) on hand-computed cases: TIS (token / sequence), MIS
(token / sequence), the decoupled-PPO loss and its gradient, the mismatch KL, and the
trainer's proximal weights over a sync cycle (no Ray)."""

from __future__ import annotations

import math

import pytest
import torch

from shunter.engine.trainer import rl

L = math.log


def test_token_tis_truncates_each_weight_at_the_cap_and_ignores_padding():
    log_rho = torch.tensor([[L(3), L(0.5), L(8), 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w, keep, st = rl.behaviour_correction(log_rho, mask, tis="token", tis_cap=5.0)
    assert torch.allclose(w, torch.tensor([[3.0, 0.5, 5.0, 0.0]]))
    assert torch.equal(keep, mask)
    assert math.isclose(st["is_truncated_frac"], 1 / 3, rel_tol=1e-6)
    assert math.isclose(st["is_ratio_max"], 8.0, rel_tol=1e-5) and math.isclose(st["is_ratio_min"], 0.5, rel_tol=1e-5)
    assert math.isclose(st["is_ratio_mean"], (3 + 0.5 + 8) / 3, rel_tol=1e-5)


def test_sequence_tis_uses_the_product_over_the_sequence_capped():
    log_rho = torch.tensor([[L(2), L(2), 0.0], [L(3), L(3), L(1)]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    w, _, st = rl.behaviour_correction(log_rho, mask, tis="sequence", tis_cap=5.0)
    assert torch.allclose(w, torch.tensor([[4.0, 4.0, 0.0], [5.0, 5.0, 5.0]]))  # 2*2 = 4; 3*3*1 = 9 -> 5
    assert math.isclose(st["is_truncated_frac"], 3 / 5, rel_tol=1e-6)


def test_uncapped_and_off_weights():
    log_rho = torch.tensor([[L(9), L(0.25)]])
    mask = torch.ones(1, 2)
    assert torch.allclose(rl.behaviour_correction(log_rho, mask, tis="none")[0], torch.tensor([[9.0, 0.25]]))
    assert torch.equal(rl.behaviour_correction(log_rho, mask, tis="off")[0], torch.ones(1, 2))


def test_token_mis_drops_tokens_outside_the_band_edges_included():
    log_rho = torch.tensor([[L(3), L(0.5), L(1.2), L(0.4)]])
    mask = torch.ones(1, 4)
    _, keep, st = rl.behaviour_correction(log_rho, mask, tis="off", mis="token", mis_low=0.5, mis_high=2.0)
    assert torch.equal(keep, torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
    assert math.isclose(st["is_masked_frac"], 0.5)


def test_sequence_mis_drops_whole_sequences_by_their_geometric_mean_ratio():
    # seq 0: ratios 4 and 0.5 -> geometric mean sqrt(2) = 1.41 (kept); seq 1: 3 and 3 -> 3 (dropped)
    log_rho = torch.tensor([[L(4), L(0.5), 0.0], [L(3), L(3), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    _, keep, st = rl.behaviour_correction(log_rho, mask, tis="off", mis="sequence", mis_low=0.5, mis_high=2.0)
    assert torch.equal(keep, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert math.isclose(st["is_masked_frac"], 0.5)


def test_mismatch_kl_k1_and_k3_hand_computed():
    # rho = 2 and 0.5: k1 = mean(-log rho) = 0; k3 = mean(rho - log rho - 1) = ((1 - ln2) + (ln2 - .5)) / 2 = .25
    _, _, st = rl.behaviour_correction(torch.tensor([[L(2), L(0.5)]]), torch.ones(1, 2), tis="off")
    assert math.isclose(st["mismatch_kl"], 0.0, abs_tol=1e-6)
    assert math.isclose(st["mismatch_k3"], 0.25, rel_tol=1e-5)


def test_decoupled_loss_weights_each_token_and_centres_the_clip_on_the_proximal_policy():
    # logp == prox (ratio 1, inside the clip); behaviour weights 2 and .5; A = +1, -1; 2 tokens
    prox = torch.tensor([[-1.0, -2.0]])
    logp = prox.clone().requires_grad_(True)
    w = torch.tensor([[2.0, 0.5]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, st = rl.ppo_clip_loss(logp, prox, adv, torch.ones(1, 2), clip=0.2, weight=w)
    assert math.isclose(float(loss.detach()), -(2 * 1 + 0.5 * -1) / 2)  # -0.75
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.25]]))  # -w * A / n_tokens
    assert st["ratio_mean"] == 1.0 and st["pg_clipfrac"] == 0.0


def test_a_dropped_token_still_counts_in_the_token_mean():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = rl.ppo_clip_loss(
        logp, torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), clip=0.2, keep=torch.tensor([[1.0, 0.0]])
    )
    assert math.isclose(float(loss.detach()), -0.5)  # (1 + 0) / 2 tokens


def test_unknown_modes_are_refused_by_name():
    with pytest.raises(ValueError, match="tis = 'tokens'"):
        rl.behaviour_correction(torch.zeros(1, 1), torch.ones(1, 1), tis="tokens")
    with pytest.raises(ValueError, match="mis = 'seq'"):
        rl.behaviour_correction(torch.zeros(1, 1), torch.ones(1, 1), mis="seq")


# -- the trainer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from shunter.engine.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", sft_steps=0))


def _samples(tr, logprobs=None, versions=(0, 0, 0, 0)):
    import msgspec

    from shunter.events import Sample

    out = []
    for i in range(4):
        toks = [29, 30, 31][: 1 + i % 3]
        out.append(
            Sample(
                sample_id=f"0.{i}",
                group_id=0,
                prompt_id=0,
                prompt_token_ids=[29, 31, 30, 40],
                token_ids=toks,
                logprobs=[-3.0] * len(toks),
                versions=[versions[i]] * len(toks),
                max_tokens=3,
                reward=float(i),
            )
        )
    if logprobs == "own":  # the trainer's own log-probs: exactly on-policy, no mismatch
        b = tr.collate(out)
        with torch.no_grad():
            lp = tr.stepper.logp(tr.model, b)
        out = [
            msgspec.structs.replace(s, logprobs=lp[k, len(s.prompt_token_ids) - 1 :][: len(s.token_ids)].tolist())
            for k, s in enumerate(out)
        ]
    return out


def _trainer(model_dir, **kw):
    from shunter.engine.config import TrainerConfig
    from shunter.engine.trainer.trainer import Trainer

    tr = Trainer(TrainerConfig(device="cpu", ppo_mini_batch_size=4, train_batch_size=8, lr=1e-2, **kw), model_dir)
    tr.setup()
    return tr


def test_on_policy_decoupled_takes_the_same_step_as_bypass(model_dir):
    a = _trainer(model_dir, objective="bypass", parameter_sync_step=2)
    b = _trainer(model_dir, objective="decoupled", parameter_sync_step=2)
    ma, mb = a.train_step(_samples(a, "own")), b.train_step(_samples(b, "own"))
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), n
    assert math.isclose(mb["trainer/is_ratio_mean"], 1.0, abs_tol=1e-5) and mb["trainer/is_truncated_frac"] == 0.0
    assert abs(ma["trainer/mismatch_kl"]) < 1e-5 and abs(mb["trainer/mismatch_kl"]) < 1e-5


def test_decoupled_proximal_weights_are_the_cycles_first_and_the_live_weights_come_back(model_dir):
    tr = _trainer(model_dir, objective="decoupled", parameter_sync_step=2)
    start = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train_step(_samples(tr))  # first step of the cycle: prox = live weights, a host copy is kept
    after = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    assert any(not torch.equal(after[n], start[n]) for n in start)
    b = tr.collate(_samples(tr))
    prox = tr.stepper.prox_logps([b])[0]  # second step of the cycle: the weights of the cycle's start
    fresh = _trainer(model_dir, objective="bypass")
    with torch.no_grad():
        want = fresh.stepper.logp(fresh.model, b)
    assert torch.allclose(prox, want, atol=1e-6)
    assert all(torch.equal(p, after[n]) for n, p in tr.model.named_parameters())  # live weights restored
    tr.publish()  # a new cycle: prox = live weights again
    with torch.no_grad():
        assert torch.allclose(tr.stepper.prox_logps([b])[0], tr.stepper.logp(tr.model, b))


def test_trainer_reports_is_statistics_and_a_staleness_histogram(model_dir):
    tr = _trainer(model_dir, objective="decoupled", parameter_sync_step=2, mis="token", mis_low=0.5, mis_high=2.0)
    tr.counters.version = 2
    m = tr.train_step(_samples(tr, versions=(2, 1, 1, 0)))
    assert (m["batch/staleness_0"], m["batch/staleness_1"], m["batch/staleness_2"]) == (1.0, 2.0, 1.0)
    for k in (
        "is_ratio_mean",
        "is_ratio_max",
        "is_ratio_min",
        "is_truncated_frac",
        "is_masked_frac",
        "mismatch_kl",
        "mismatch_k3",
        "pg_clipfrac",
    ):
        assert math.isfinite(m[f"trainer/{k}"]), k
    # logprobs of -3 against the tiny model's own (about -3.7) put some ratios outside [0.5, 2]
    assert 0.0 <= m["trainer/is_masked_frac"] <= 1.0


def test_config_refuses_an_mis_band_without_1_and_decoupled_with_a_custom_loss():
    from shunter.engine.config import ConfigError, from_dict

    with pytest.raises(ConfigError, match="must enclose 1"):
        from_dict({"trainer": {"mis": "token", "mis_low": 1.2, "mis_high": 2.0}})
    with pytest.raises(ConfigError, match="loss_fn replaces it"):
        from_dict({"trainer": {"objective": "decoupled", "loss_fn": "m:f"}})
