"""BNNet / LRNet (Eq. 4, App. E): clamp-STE, initialization, the map lambda -> (beta, eta)."""
import math

import pytest
import torch
import torch.nn.functional as F

from pflkit.meta.metanets import MetaSpec, bnnet, clamp_ste, group_of, init_meta_params, lrnet, meta_hyperparams


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
