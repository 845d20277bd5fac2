"""BNNet / LRNet (Eq. 4, App. E): clamp-STE, initialization, the map lambda -> (beta, eta)."""
import math

import pytest
import torch
import torch.nn.functional as F

from pflkit.meta.metanets import (
    MetaSpec, bnnet, clamp_ste, group_of, init_meta_params, input_sensitivity, lrnet, meta_hyperparams,
)


def test_clamp_passes_gradients_straight_through():
    x = torch.tensor([-2.0, 0.3, 0.9, 1.7], requires_grad=True)
    y = clamp_ste(x, 0.0, 1.0)
    assert y.tolist() == pytest.approx([0.0, 0.3, 0.9, 1.0])
    (g,) = torch.autograd.grad((y * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum(), x)
    assert g.tolist() == [1.0, 2.0, 3.0, 4.0]  # identity, also where the clamp is active
    (plain,) = torch.autograd.grad(x.clamp(0, 1).sum(), x)
    assert plain.tolist() == [0.0, 1.0, 1.0, 0.0]  # what a plain clamp would give


def test_architecture_and_initialization_of_app_e():
    gen = torch.Generator().manual_seed(0)
    net = lrnet(20, 30, generator=gen)
    linears = [m for m in net.body if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(40, 100), (100, 100), (100, 30)]
    assert all(torch.equal(m.bias, torch.full_like(m.bias, 1.0)) for m in linears)
    w = linears[1].weight.detach()
    expected_std = 0.1 * math.sqrt(2.0 / (100 + 100))  # Xavier normal with gain 0.1
    assert float(w.std()) == pytest.approx(expected_std, rel=0.05)
    assert abs(float(w.mean())) < 3 * expected_std / 100
    b = bnnet(7, generator=gen)
    assert all(torch.equal(m.bias, torch.full_like(m.bias, 0.5)) for m in b.body if isinstance(m, torch.nn.Linear))
    # initial outputs ~ 0.5 (BNNet) and ~ 1.0 (LRNet): the biases dominate the small weights
    with torch.no_grad():
        dev_b, dev_lr = (b(torch.rand(1, 7)) - 0.5).abs(), (net(torch.rand(1, 40)) - 1.0).abs()
    assert dev_b.mean() < 0.1 and dev_b.max() < 0.3
    assert dev_lr.mean() < 0.2 and dev_lr.max() < 0.6


def test_outputs_are_clamped_to_their_ranges():
    b = bnnet(3)
    with torch.no_grad():
        b.body[4].bias.copy_(torch.tensor([-5.0, 0.25, 5.0]))
        b.body[4].weight.zero_()
    assert b(torch.rand(1, 3)).tolist() == [[0.0, 0.25, 1.0]]
    lr = lrnet(2, 2, max_value=1000.0)
    with torch.no_grad():
        lr.body[4].bias.copy_(torch.tensor([5000.0, -1.0]))
        lr.body[4].weight.zero_()
    assert lr(torch.rand(1, 4)).tolist() == [[1000.0, 0.0]]


def test_meta_params_and_hyperparameters():
    spec = MetaSpec(num_bn=3, num_layers=4, num_tensors=6, fixed_lr=0.01, hidden=16)
    lam = init_meta_params(spec, torch.Generator().manual_seed(1))
    again = init_meta_params(spec, torch.Generator().manual_seed(1))
    assert lam.keys() == again.keys() and all(torch.equal(lam[k], again[k]) for k in lam)
    assert {group_of(k) for k in lam} == {"bnnet", "lrnet", "eta_tilde"}
    assert torch.equal(lam["eta_tilde"], torch.full((6,), 0.01))
    xi, feats = torch.rand(3), torch.rand(8)
    beta, eta = meta_hyperparams(spec, spec.modules(), lam, xi, feats)
    assert beta.shape == (3,) and eta.shape == (6,)
    # Eq. 4 by hand: three linear layers with ReLU, clamp, times eta_tilde
    h = feats
    for i in (0, 2):
        h = F.relu(F.linear(h, lam[f"lrnet.body.{i}.weight"], lam[f"lrnet.body.{i}.bias"]))
    out = F.linear(h, lam["lrnet.body.4.weight"], lam["lrnet.body.4.bias"]).clamp(0, 1000)
    torch.testing.assert_close(eta, out * lam["eta_tilde"])
    # gradients reach every tensor of lambda
    leaves = {k: v.clone().requires_grad_(True) for k, v in lam.items()}
    beta, eta = meta_hyperparams(spec, spec.modules(), leaves, xi, feats)
    grads = torch.autograd.grad(beta.sum() + eta.sum(), list(leaves.values()))
    assert all(g.abs().sum() > 0 for g in grads)


def test_switches_of_the_ablations():
    spec = MetaSpec(num_bn=2, num_layers=3, num_tensors=4, use_bnnet=False, fixed_beta=0.0, fixed_lr=0.1)
    lam = init_meta_params(spec)
    assert not any(k.startswith("bnnet") for k in lam)
    beta, eta = meta_hyperparams(spec, spec.modules(), lam, None, torch.rand(6))
    assert beta == 0.0 and eta.shape == (4,)
    spec = MetaSpec(num_bn=2, num_layers=3, num_tensors=4, use_lrnet=False, fixed_lr=0.1)
    lam = init_meta_params(spec)
    assert set(map(group_of, lam)) == {"bnnet"}
    _, eta = meta_hyperparams(spec, spec.modules(), lam, torch.rand(2), None)
    assert torch.equal(eta, torch.full((4,), 0.1))


def test_bad_specs_are_rejected():
    with pytest.raises(ValueError, match="BatchNorm"):
        MetaSpec(num_bn=0, num_layers=3, num_tensors=4)
    with pytest.raises(ValueError, match="fixed_beta"):
        MetaSpec(num_bn=1, num_layers=3, num_tensors=4, fixed_beta=1.5)
    with pytest.raises(ValueError, match="lo <= hi"):
        clamp_ste(torch.ones(1), 1.0, 0.0)
    with pytest.raises(KeyError):
        group_of("head.weight")


def test_hidden_gain_scales_only_the_hidden_layers():
    """hidden_gain (not App. E's) draws the same weights as the default, the two hidden layers
    multiplied by hidden_gain / gain, the output layer and every bias unchanged."""
    paper = lrnet(3, 5, generator=torch.Generator().manual_seed(4))
    wide = lrnet(3, 5, hidden_gain=1.0, generator=torch.Generator().manual_seed(4))
    lp = [m for m in paper.body if isinstance(m, torch.nn.Linear)]
    lw = [m for m in wide.body if isinstance(m, torch.nn.Linear)]
    for k in (0, 1):
        assert torch.allclose(lw[k].weight, 10.0 * lp[k].weight, rtol=1e-5, atol=1e-7)
    assert torch.equal(lw[2].weight, lp[2].weight)
    assert all(torch.equal(a.bias, b.bias) for a, b in zip(lp, lw))
    spec = MetaSpec(num_bn=2, num_layers=3, num_tensors=5)
    assert spec.hidden_gain == 0  # default: App. E (one gain for every layer)
    lam = init_meta_params(MetaSpec(num_bn=2, num_layers=3, num_tensors=5, hidden_gain=1.0),
                           torch.Generator().manual_seed(0))
    base = init_meta_params(spec, torch.Generator().manual_seed(0))
    assert torch.allclose(lam["bnnet.body.0.weight"], 10 * base["bnnet.body.0.weight"], rtol=1e-5, atol=1e-7)
    assert torch.equal(lam["lrnet.body.4.weight"], base["lrnet.body.4.weight"])
    for bad in (-1.0, True, "1"):
        with pytest.raises(ValueError, match="hidden_gain"):
            MetaSpec(num_bn=2, num_layers=3, num_tensors=5, hidden_gain=bad)
    with pytest.raises(ValueError, match="hidden_gain"):
        bnnet(2, hidden_gain=0.0)


def test_input_sensitivity_is_the_jacobian_of_the_mlp():
    spec = MetaSpec(num_bn=3, num_layers=2, num_tensors=4, hidden=8)
    lam = init_meta_params(spec, torch.Generator().manual_seed(2))
    nets = spec.modules()
    xi, feats = 0.1 * torch.rand(3), 0.1 * torch.rand(4)
    got = input_sensitivity(spec, nets, lam, xi, feats)
    for net, x, n_out in (("bnnet", xi, 3), ("lrnet", feats, 4)):
        w = [lam[f"{net}.body.{k}.weight"] for k in (0, 2, 4)]
        # biases 0.5 / 1.0 dominate the gain-0.1 weights: every ReLU is active, the MLP is linear here
        h1 = w[0] @ x + lam[f"{net}.body.0.bias"]
        assert bool((h1 > 0).all()) and bool((w[1] @ h1 + lam[f"{net}.body.2.bias"] > 0).all())
        jac = w[2] @ w[1] @ w[0]
        assert got[net] == pytest.approx(float(jac.norm() / math.sqrt(n_out)), rel=1e-5)
    # App. E's init: about 1e-4 per unit of input -- why beta / eta hardly depend on the client
    assert 1e-5 < got["bnnet"] < 1e-3
