"""pFedVEM / pFedMAP: the Gaussian head math against definitions, hand computations and
numerical optima; the algorithm's protocol; the concept-drift federations it runs on."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Normal, kl_divergence

from pflkit.algorithms import ALGORITHMS
from pflkit.algorithms import pfedvem as P
from pflkit.config import ConfigError
from pflkit.data.datasets import load_dataset
from pflkit.fl.algorithm import Update
from pflkit.fl.federate import build_federation
from pflkit.fl.loop import run_rounds
from tests.helpers_data import digits_dataset, digits_env

D64 = torch.float64


def _gauss(seed, n=4, d=6):
    g = torch.Generator().manual_seed(seed)
    mus = [torch.randn(d, generator=g, dtype=D64) for _ in range(n)]
    sigmas = [0.1 + torch.rand(d, generator=g, dtype=D64) for _ in range(n)]
    return mus, sigmas


# ---------------------------------------------------------------- Eq. 7: server update and rho


def test_server_head_matches_hand_computation():
    mus = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -4.0]), torch.tensor([0.0, 8.0])]
    rho2 = [0.5, 2.0, 4.0]  # tau = 2, 0.5, 0.25; sum 2.75
    expect = torch.tensor([(2 * 1 + 0.5 * 3 + 0) / 2.75, (2 * 2 - 0.5 * 4 + 0.25 * 8) / 2.75])
    assert torch.allclose(P.server_head(mus, rho2), expect, atol=1e-6)


def test_rho_squared_matches_hand_computation_and_trace_definition():
    mu, sigma, w = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1.0, 0.0, 1.0])
    # Tr Sigma = 0.25 + 1 + 4 = 5.25; ||mu - w||^2 = 0 + 4 + 4 = 8; D = 3
    assert P.rho_squared(mu, sigma, w) == pytest.approx((5.25 + 8) / 3)
    mus, sigmas = _gauss(1, n=1, d=9)
    w = torch.randn(9, dtype=D64)
    sigma_mat = torch.diag(sigmas[0] ** 2)
    direct = (torch.trace(sigma_mat) + (mus[0] - w) @ (mus[0] - w)) / 9
    assert P.rho_squared(mus[0], sigmas[0], w) == pytest.approx(float(direct), rel=1e-12)


def _maximize(objective, x0, steps=200):
    x = x0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([x], lr=1, max_iter=steps, tolerance_grad=1e-12, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = -objective(x)
        loss.backward()
        return loss

    opt.step(closure)
    return x.detach()


def test_server_update_is_the_numerical_maximizer_of_eq6():
    mus, sigmas = _gauss(2)
    rho2 = [0.3, 1.0, 2.5, 0.7]
    w_num = _maximize(lambda w: P.server_objective(mus, sigmas, rho2, w), torch.zeros(6, dtype=D64))
    assert torch.allclose(P.server_head(mus, rho2), w_num, atol=1e-7)


def test_rho_closed_form_is_the_numerical_maximizer_of_eq6():
    mus, sigmas = _gauss(3)
    w = torch.randn(6, generator=torch.Generator().manual_seed(9), dtype=D64)
    log_r = _maximize(lambda lr: P.server_objective(mus, sigmas, torch.exp(lr), w), torch.zeros(4, dtype=D64))
    closed = torch.tensor([P.rho_squared(m, s, w) for m, s in zip(mus, sigmas)], dtype=D64)
    assert torch.allclose(torch.exp(log_r), closed, rtol=1e-6)


def test_alternating_closed_forms_reach_a_stationary_point_of_eq6():
    mus, sigmas = _gauss(4)
    w = torch.zeros(6, dtype=D64)
    for _ in range(300):  # the server/client M-steps of Alg. 1, iterated
        rho2 = [P.rho_squared(m, s, w) for m, s in zip(mus, sigmas)]
        w = P.server_head(mus, rho2)
    w = w.clone().requires_grad_(True)
    log_r = torch.log(torch.tensor(rho2, dtype=D64)).requires_grad_(True)
    P.server_objective(mus, sigmas, torch.exp(log_r), w).backward()
    assert w.grad.abs().max() < 1e-8 and log_r.grad.abs().max() < 1e-8


# ---------------------------------------------------------------- Eq. 5: KL and the ELBO


def test_kl_matches_torch_distributions_and_monte_carlo():
    mu_q, sig_q = _gauss(5, n=1, d=7)
    mu_p = torch.randn(7, dtype=D64)
    rho = 0.8
    ours = P.gaussian_kl(mu_q[0], sig_q[0], mu_p, rho)
    ref = kl_divergence(Normal(mu_q[0], sig_q[0]), Normal(mu_p, rho)).sum()
    assert torch.allclose(ours, ref, atol=1e-12)
    q = Normal(mu_q[0], sig_q[0])
    x = q.sample((200_000,))
    mc = (q.log_prob(x) - Normal(mu_p, rho).log_prob(x)).sum(1).mean()
    assert abs(float(mc - ours)) < 0.05 * float(ours) + 0.02
    assert float(P.gaussian_kl(mu_p, torch.full_like(mu_p, rho), mu_p, rho)) == pytest.approx(0.0, abs=1e-12)


def test_elbo_terms_kl_analytic_and_nll_reparameterized():
    g = torch.Generator().manual_seed(0)
    C, d, n = 3, 4, 10
    z, y = torch.randn(n, d, generator=g, dtype=D64), torch.randint(0, C, (n,), generator=g)
    mu, w = torch.randn(C * d + C, generator=g, dtype=D64), torch.zeros(C * d + C, dtype=D64)
    sigma = torch.full_like(mu, 0.3)
    out = P.elbo(z, y, mu, sigma, w, 0.5, C, 8, torch.Generator().manual_seed(1))
    analytic = kl_divergence(Normal(mu, sigma), Normal(w, math.sqrt(0.5))).sum()
    assert torch.allclose(out["kl"], analytic, atol=1e-12)
    assert torch.allclose(out["elbo"], -out["nll"] - out["kl"])
    # sigma -> 0: the expected NLL is the cross-entropy sum of the mean head
    weight, bias = P.split_head(mu, C)
    ce = F.cross_entropy(z @ weight.T + bias, y, reduction="sum")
    tiny = P.expected_nll(z, y, mu, torch.full_like(mu, 1e-9), C, 3, torch.Generator().manual_seed(2))
    assert torch.allclose(tiny, ce, atol=1e-6)
    # reparameterized gradient in mu: the MC average approaches E[grad], checked against many samples
    mu_r = mu.clone().requires_grad_(True)
    P.expected_nll(z, y, mu_r, sigma, C, 4000, torch.Generator().manual_seed(3)).backward()
    many = mu.clone().requires_grad_(True)
    P.expected_nll(z, y, many, sigma, C, 4000, torch.Generator().manual_seed(4)).backward()
    assert torch.allclose(mu_r.grad, many.grad, atol=0.1)


def test_head_layout_matches_nn_linear():
    lin = torch.nn.Linear(5, 3)
    vec = torch.cat([lin.weight.detach().flatten(), lin.bias.detach()])
    z = torch.randn(7, 5)
    assert torch.allclose(P.head_logits(z, vec, 3), lin(z), atol=1e-6)
    stacked = P.head_logits(z, torch.stack([vec, 2 * vec]), 3)
    assert stacked.shape == (2, 7, 3)
    assert torch.allclose(stacked[1], z @ (2 * lin.weight).T + 2 * lin.bias, atol=1e-5)


def test_softplus_inverse_round_trip_and_rejects_non_positive():
    x = torch.tensor([1e-4, 0.05, 1.0, 30.0])
    assert torch.allclose(F.softplus(P.softplus_inverse(x)), x, rtol=1e-5)
    with pytest.raises(ValueError, match="positive"):
        P.softplus_inverse(0.0)


# ---------------------------------------------------------------- the client's E-step


def test_head_lipschitz_bounds_the_hessian_of_the_mean_cross_entropy():
    g = torch.Generator().manual_seed(6)
    C, d, n = 3, 4, 6
    z, y = 3 * torch.randn(n, d, generator=g, dtype=D64), torch.randint(0, C, (n,), generator=g)
    for trial in range(3):
        head = 2 * torch.randn(C * d + C, generator=g, dtype=D64)
        hess = torch.autograd.functional.hessian(
            lambda v: F.cross_entropy(P.head_logits(z, v, C), y), head)
        top = float(torch.linalg.eigvalsh(hess).max())
        assert 0 < top <= P.head_lipschitz(z)


def _estep(z, y, cfg, w, rho2, seed=0):
    mu = w.clone().requires_grad_(True)
    raw = P.softplus_inverse(torch.full_like(w, 0.5)).requires_grad_(True)
    n, C = len(y), 3
    gen = torch.Generator().manual_seed(seed)

    def objective():
        return -P.elbo(z, y, mu, F.softplus(raw), w, rho2, C, cfg.n_mc, gen)["elbo"] / n

    with torch.no_grad():
        start = float(objective())
    L = P.head_lipschitz(z)
    end = P._fit_head([{"params": [mu], "L": L + 1 / (rho2 * n)}, {"params": [raw], "L": L + 2 / n}], objective, cfg)
    return mu.detach(), F.softplus(raw.detach()), start, end


def test_estep_with_uninformative_data_returns_the_prior():
    # z = 0: the weights never touch the data, so their posterior is the prior N(w, rho^2)
    cfg = P.PFedVEMConfig(head_steps=300, n_mc=2)
    C, d = 3, 4
    z, y = torch.zeros(30, d), torch.randint(0, C, (30,), generator=torch.Generator().manual_seed(0))
    w = torch.randn(C * d + C, generator=torch.Generator().manual_seed(1))
    mu, sigma, _, _ = _estep(z, y, cfg, w, rho2=0.04)
    assert torch.allclose(mu[: C * d], w[: C * d], atol=1e-3)
    assert torch.allclose(sigma[: C * d], torch.full((C * d,), 0.2), atol=1e-3)


@pytest.mark.parametrize("scale", [0.1, 1.0, 100.0])
def test_estep_decreases_the_negative_elbo_whatever_the_feature_scale(scale):
    g = torch.Generator().manual_seed(2)
    z, y = scale * torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    w = torch.zeros(15)
    _, _, start, end = _estep(z, y, P.PFedVEMConfig(head_steps=40, n_mc=4), w, rho2=0.01)
    assert math.isfinite(end) and end < start


# ---------------------------------------------------------------- phases and protocol


def test_aggregate_is_fedavg_on_the_base_and_eq7_on_the_head():
    env = digits_env()
    state = {"base": {"a": torch.zeros(2)}, "w": torch.zeros(3)}
    ups = [Update(0, 10, {"base": {"a": torch.tensor([1.0, 1.0])}, "mu": torch.tensor([1.0, 0, 0]),
                          "rho2": torch.tensor(0.5)}),
           Update(1, 30, {"base": {"a": torch.tensor([5.0, 1.0])}, "mu": torch.tensor([0, 3.0, 0]),
                          "rho2": torch.tensor(1.5)}),
           Update(2, 99, None)]  # a client that did not report
    new = P.aggregate(state, ups, None, env)
    assert torch.allclose(new["base"]["a"], torch.tensor([4.0, 1.0]))  # (10 * 1 + 30 * 5) / 40
    assert torch.allclose(new["w"], torch.tensor([2 / (2 + 2 / 3), (2 / 3) * 3 / (2 + 2 / 3), 0.0]), atol=1e-6)
    assert P.aggregate(state, [Update(3, 5, None)], None, env) is state


@pytest.fixture(scope="module")
def digits_fed():
    return build_federation(digits_dataset(), "concept_drift", 10, seed=0, task="superclass")


def _run(name, fed, **kw):
    algo = ALGORITHMS[name]
    cfg = algo.make_config({"rounds": 3, "local_epochs": 1, "batch_size": 32, "head_steps": 5, "eval_every": 3,
                            "init_scale": 0.05, **kw})
    env = digits_env(num_classes=fed.num_classes)
    env.seed_torch("init")
    return run_rounds(algo, cfg, fed, env.model_fn(), env)


def test_paper_protocol_everyone_updates_only_reporters_send(digits_fed):
    res = _run("pfedvem", digits_fed, report_fraction=0.3)
    assert res.status == "ok" and set(res.client_states) == set(range(10))
    for row in res.history:
        assert row["clients"] == 10  # the broadcast reaches every client
        assert row["bytes_up"] < row["bytes_down"]  # but only about 30% report
    again = _run("pfedvem", digits_fed, report_fraction=0.3)
    assert res.per_client == again.per_client  # deterministic given the seed
    rho2 = [s["rho2"] for s in res.client_states.values()]
    for s in res.client_states.values():  # rho_j^2 = mean sigma^2 + ||mu_j - w||^2 / D >= mean sigma^2
        assert s["rho2"] >= float((F.softplus(s["raw"]) ** 2).mean()) * (1 - 1e-6)
    assert len(set(round(r, 12) for r in rho2)) > 1  # each client its own trust


def test_loop_sampling_mode_every_sampled_client_reports(digits_fed):
    res = _run("pfedvem", digits_fed, report_fraction=0.0, sampling="bernoulli", fraction=0.3)
    assert res.status == "ok" and len(res.client_states) < 10  # only sampled clients ever trained
    for row in res.history:  # each sampled client sends what it got plus its rho_j^2 (one float32)
        assert row["bytes_up"] == row["bytes_down"] + 4 * row["clients"]
    rep = P.trust_report(res.state, digits_fed, None, None, res.client_states)
    trained = sorted(res.client_states)
    assert [j for j, r in enumerate(rep["rho2"]) if r is not None] == trained
    assert sum(rep["tau_share"][j] for j in trained) == pytest.approx(1.0)
    for j in trained:
        s = res.client_states[j]
        assert rep["rho2"][j] == pytest.approx(P.rho_squared(s["mu"], F.softplus(s["raw"]), res.state["w"]), rel=1e-5)


def test_pfedmap_head_with_a_tight_prior_stays_at_w_and_mc_prediction_with_tiny_sigma_is_the_mean(digits_fed):
    env = digits_env(num_classes=digits_fed.num_classes)
    env.seed_torch("init")
    state = P.init(env.model_fn(), digits_fed, None, env)
    client = digits_fed.clients[0]
    tight = P.PFedMAPConfig(rho=1e-4, head_steps=10, local_epochs=0, report_fraction=0.0)
    loose = P.PFedMAPConfig(rho=10.0, head_steps=10, local_epochs=0, report_fraction=0.0)
    (_, near), (_, far) = (P.map_client_update(P.broadcast(state, 0, c, env), client, None, c, env)
                           for c in (tight, loose))
    assert torch.allclose(near["mu"], state["w"], atol=1e-5)
    assert not torch.allclose(far["mu"], state["w"], atol=1e-3)
    sharp = {"mu": far["mu"], "raw": P.softplus_inverse(torch.full_like(far["mu"], 1e-6))}
    by_mean = P.evaluate(state, client, sharp, P.PFedVEMConfig(predict="mean"), env, "test")
    by_mc = P.evaluate(state, client, sharp, P.PFedVEMConfig(predict="mc", eval_mc=3), env, "test")
    assert by_mean["correct"] == by_mc["correct"] and by_mean["loss"] == pytest.approx(by_mc["loss"], rel=1e-4)


@pytest.mark.parametrize("key, value", [("report_fraction", 1.5), ("head_step", 0.0), ("n_mc", 0),
                                        ("init_scale", -1.0), ("predict", "mode"), ("head_steps", -1)])
def test_bad_config_names_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        P.PFedVEMConfig(**{key: value})
    with pytest.raises(ConfigError, match="rho"):
        P.PFedMAPConfig(rho=0.0)


# ---------------------------------------------------------------- concept drift on real data


def _fine_labels(ds):
    return torch.cat([ds.y_train, ds.y_test]).numpy()


def test_omniglot_concept_drift_equal_marginals_different_characters(shared_data):
    ds = load_dataset("omniglot", shared_data)
    fed = build_federation(ds, "concept_drift", 50, seed=0, task="superclass")
    fine, alphabet = _fine_labels(ds), np.asarray(ds.meta.superclass)
    chars = []
    for c in fed.clients:
        idx = np.concatenate([c.splits[s] for s in ("train", "val", "test")])
        counts = np.bincount(fed.y[idx].numpy(), minlength=8)
        assert (counts == counts[0]).all() and counts[0] > 0  # P_j(y) uniform on every client
        assert (alphabet[fine[idx]] == fed.y[idx].numpy()).all()  # the task label is the alphabet
        row = [np.unique(fine[idx][fed.y[idx].numpy() == s]) for s in range(8)]
        assert all(r.size == 1 for r in row)  # one character per alphabet
        chars.append([int(r[0]) for r in row])
    chars = np.array(chars)
    assert np.unique(chars, axis=0).shape[0] == 50  # every client's conditionals P_j(x | y) differ
    assert all(np.unique(chars[:, s]).size > 5 for s in range(8))


def test_cifar10_vehicle_animal_concept_drift_paired(shared_data):
    ds = load_dataset("cifar10", shared_data)
    fed = build_federation(ds, "concept_drift", 20, seed=1, split="paired", task="superclass")
    fine = _fine_labels(ds)
    picks = set()
    for c in fed.clients:
        for split in ("train", "test"):
            counts = c.histogram(split) if split == "test" else np.bincount(
                fed.y[np.concatenate([c.splits["train"], c.splits["val"]])].numpy(), minlength=2)
            assert counts[0] == counts[1] > 0
        idx = c.splits["test"]
        picks.add(tuple(int(np.unique(fine[idx][fed.y[idx].numpy() == s])[0]) for s in (0, 1)))
    assert len(picks) > 5
