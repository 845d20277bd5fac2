"""Functional fine-tuning with layer-wise learning rates and the losses of FedL2P sec. 3.3."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pflkit.errors import Diverged
from pflkit.meta.functional import (
    finetune, forward, load_tensors, lookahead_loss, model_tensors, sgd_step, using_beta, validation_loss,
)
from pflkit.models.mixed_bn import convert_bn, init_client_stats, mixed_bn_layers, set_bn_mode

D = torch.float64


def _net(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                        nn.Linear(3 * 4 * 4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3)).to(dtype)
    with torch.no_grad():  # pretrained statistics that differ from any batch's
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
        net[5].running_mean.uniform_(-0.5, 0.5)
        net[5].running_var.uniform_(0.5, 2.0)
    return convert_bn(net)


def _data(n=24, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 4, 4, generator=g).to(dtype) + 0.3, torch.randint(0, 3, (n,), generator=g)


def test_sgd_step_gives_each_tensor_its_own_rate():
    params = {"a": torch.ones(2), "b": torch.full((3,), 2.0)}
    out = sgd_step(params, [torch.ones(2), torch.ones(3)], torch.tensor([0.5, -1.0]))
    assert out["a"].tolist() == [0.5, 0.5] and out["b"].tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="one learning rate per parameter tensor"):
        sgd_step(params, [torch.ones(2), torch.ones(3)], torch.tensor([0.5]))


@pytest.mark.parametrize("mode, beta", [("global", 0.0), ("client", 1.0)])
def test_beta_zero_and_one_reproduce_ft_bn_g_and_bn_c(mode, beta):
    """FedL2P with beta = 0 / 1 and eta = lr everywhere is FT (BN G) / FT (BN C) (sec. 4.1.2)."""
    x, y = _data()
    lr, batches = 0.05, [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)] * 2
    ref = _net()
    init_client_stats(ref, [x])
    ours = _net()
    init_client_stats(ours, [x])
    params, buffers = model_tensors(ours)
    # the FT baseline: torch.optim.SGD on the module in the BN mode of the baseline
    set_bn_mode(ref, mode)
    ref.train()
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for xb, yb in batches:
        opt.zero_grad()
        F.cross_entropy(ref(xb), yb).backward()
        opt.step()
    eta = torch.full((len(params),), lr)
    tuned, stats = finetune(ours, params, buffers, batches, eta, torch.full((2,), beta))
    assert stats["steps"] == 6
    for name, p in ref.named_parameters():
        torch.testing.assert_close(tuned[name], p.detach(), atol=1e-7, rtol=1e-6)
    for name, b in ref.named_buffers():
        torch.testing.assert_close(buffers[name], b, atol=1e-7, rtol=1e-6)
    ref.eval()
    out = forward(ours, tuned, buffers, x, beta=torch.full((2,), beta), training=False)
    torch.testing.assert_close(out, ref(x).detach(), atol=1e-6, rtol=1e-5)


def test_zero_learning_rate_freezes_a_tensor():
    x, y = _data()
    net = _net()
    init_client_stats(net, [x])
    params, buffers = model_tensors(net)
    eta = torch.full((len(params),), 0.1)
    eta[0] = 0.0
    tuned, _ = finetune(net, params, buffers, [(x, y)] * 3, eta, 0.5)
    names = list(params)
    assert torch.equal(tuned[names[0]], params[names[0]])
    assert not torch.equal(tuned[names[1]], params[names[1]])


def test_lookahead_loss_is_eq_9_10_and_moves_no_statistics():
    x, y = _data(dtype=D)
    net = _net(D)
    init_client_stats(net, [x])
    params, buffers = model_tensors(net)
    before = {k: v.clone() for k, v in buffers.items()}
    eta = torch.linspace(0.05, 0.3, len(params), dtype=D)
    beta = torch.tensor([0.3, 0.8], dtype=D)
    got = lookahead_loss(net, params, buffers, (x[:12], y[:12]), (x[12:], y[12:]), eta, beta)
    # by hand: a step with the gradient of the step batch, then the loss of the loss batch
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    bufs = {k: v.clone() for k, v in buffers.items()}
    grads = torch.autograd.grad(F.cross_entropy(forward(net, leaves, bufs, x[:12], beta=beta, training=True),
                                                y[:12]), list(leaves.values()))
    ahead = {k: p - e * g for (k, p), e, g in zip(params.items(), eta, grads)}
    expected = F.cross_entropy(forward(net, ahead, {k: v.clone() for k, v in buffers.items()}, x[12:], beta=beta,
                                       training=True), y[12:])
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    for k in buffers:
        assert torch.equal(buffers[k], before[k])


@pytest.mark.parametrize("second_order", [False, True])
def test_lookahead_learning_rate_gradient_matches_finite_differences(second_order):
    """d L_T / d eta of Eq. 9-10 (exact in both modes: the look-ahead gradient does not depend on eta)."""
    x, y = _data(dtype=D)
    net = _net(D)
    init_client_stats(net, [x])
    params, buffers = model_tensors(net)
    beta = torch.tensor([0.4, 0.7], dtype=D)
    eta = torch.linspace(0.1, 0.5, len(params), dtype=D).requires_grad_(True)

    def loss(e):
        return lookahead_loss(net, params, buffers, (x[:12], y[:12]), (x[12:], y[12:]), e, beta,
                              second_order=second_order)

    (analytic,) = torch.autograd.grad(loss(eta), eta)
    h = 1e-6
    for k in range(len(params)):
        e = torch.zeros_like(eta)
        e[k] = h
        numeric = (float(loss(eta.detach() + e).detach()) - float(loss(eta.detach() - e).detach())) / (2 * h)
        assert float(analytic[k]) == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_second_order_lookahead_theta_gradient_matches_finite_differences():
    x, y = _data(dtype=D)
    net = _net(D)
    init_client_stats(net, [x])
    params, buffers = model_tensors(net)
    eta = torch.full((len(params),), 0.2, dtype=D)
    beta = torch.tensor([0.4, 0.7], dtype=D)
    names = list(params)

    def loss(th):
        return lookahead_loss(net, dict(zip(names, th)), buffers, (x[:12], y[:12]), (x[12:], y[12:]), eta, beta,
                              second_order=True)

    th = [params[n].clone().requires_grad_(True) for n in names]
    grads = torch.autograd.grad(loss(th), th)
    gen = torch.Generator().manual_seed(3)
    u = [torch.randn(t.shape, generator=gen, dtype=D) for t in th]
    h = 1e-5
    plus = float(loss([t.detach() + h * d for t, d in zip(th, u)]).detach())
    minus = float(loss([t.detach() - h * d for t, d in zip(th, u)]).detach())
    analytic = float(sum((g * d).sum() for g, d in zip(grads, u)))
    assert analytic == pytest.approx((plus - minus) / (2 * h), rel=1e-5)


def test_validation_loss_uses_client_statistics_mixed_by_beta():
    x, y = _data(dtype=D)
    net = _net(D)
    init_client_stats(net, [x[:12]])
    params, buffers = model_tensors(net)
    beta = torch.tensor([0.25, 0.6], dtype=D, requires_grad=True)
    lv = validation_loss(net, params, buffers, (x[12:], y[12:]), beta)
    # the same loss with the mixed statistics written into a plain evaluation-mode model
    plain = _net(D)
    load_tensors(plain, params)
    for k, layer in enumerate(mixed_bn_layers(plain)):
        b = float(beta[k].detach())
        pre = f"{[n for n, m in plain.named_modules() if m is layer][0]}."
        layer.running_mean.copy_((1 - b) * buffers[pre + "running_mean"] + b * buffers[pre + "client_mean"])
        layer.running_var.copy_((1 - b) * buffers[pre + "running_var"] + b * buffers[pre + "client_var"])
        layer.beta = 0.0
    plain.eval()
    expected = F.cross_entropy(plain(x[12:]), y[12:])
    torch.testing.assert_close(lv.detach(), expected.detach(), atol=1e-12, rtol=1e-10)
    (g,) = torch.autograd.grad(lv, beta)
    assert (g.abs() > 0).all()  # beta reaches L_V directly (the direct term of Eq. 6)


def test_finetune_raises_or_skips_on_a_non_finite_loss():
    x, y = _data()
    net = _net()
    init_client_stats(net, [x])
    params, buffers = model_tensors(net)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    eta = torch.full((len(params),), 0.1)
    with pytest.raises(Diverged):
        finetune(net, params, buffers, [(bad, y)], eta, 1.0)
    buffers = model_tensors(net)[1]
    tuned, stats = finetune(net, params, buffers, [(bad, y), (x, y)], eta, 1.0, skip_nonfinite=True)
    assert stats["skipped"] == 1 and stats["steps"] == 1
    assert all(torch.isfinite(t).all() for t in list(tuned.values()) + list(buffers.values()))


def test_using_beta_restores_the_layers():
    net = _net()
    set_bn_mode(net, "batch")
    with using_beta(net, torch.tensor([0.2, 0.9])):
        assert [layer.mode for layer in mixed_bn_layers(net)] == ["mixed", "mixed"]
    assert [layer.mode for layer in mixed_bn_layers(net)] == ["batch", "batch"]
    with pytest.raises(ValueError, match="3 betas for 2"):
        with using_beta(net, torch.ones(3)):
            pass
